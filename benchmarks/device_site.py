"""The SGLang site and the evaluation text for the lent GPU machine: the offline bundle
(`sglang-rq bundle`) less what a device call never imports, so that it travels beside the
checkout, and the heads of the two evaluation texts that the GPU server test reads.

``python benchmarks/device_site.py BUNDLE OUT [--data SRC DEST]`` (e.g.
``.gpu-bundle/sglang-rq-bundle.tar.xz .gpu-bundle/site.tar.xz --data ../shared/data
.gpu-bundle/data``), then carry ``OUT`` (and ``DEST``) and unpack the site on the device (``tar
-xJf OUT -C /tmp/rq-site``; ``PYTHONPATH=$PWD:/tmp/rq-site``; ``SGLANG_RQ_DATA_DIR=DEST``).

A device call carries the working tree and the named ignored paths within 64 MiB. The checkout's
files take about 50.1 MB of it and the full bundle 16.9 MB, which together, with a few untracked
files beside, did not fit (session 40); the site (15.7 MB) and the texts' heads (0.1 MB) do
(session 41: 51.96 MB of disk blocks for the checkout, so the limit counts the files' sizes, not
blocks). Dropped (`DROP`): the bundle's own sglang_rq and rq_kernels (the checkout's serve),
SGLang's test suite and benchmarks (but not the scripted runtime, which the scheduler imports),
tvm_ffi's headers and bundled third-party sources, and third-party packages' tests. Kept:
everything serving imports; session 40 found `sglang.srt.multimodal`,
`sglang.srt.hardware_backend`, `sglang.srt.disaggregation`, openai, xgrammar, gguf and
soundfile's data imported at start-up, session 41 tvm_ffi's testing library (its core links it)
and the wheels' RECORD files (tvm_ffi finds xgrammar's library through them); each missing one
failed the server or the pool tests on an H100 (`benchmarks/results/h200_2026-12-06b_scripts/`,
`h100_2026-12-06c_scripts/`). With this site the GPU server test passed on an H100 (session 41).
Its compiled wheels are the device's Python 3.12's.
"""

from __future__ import annotations

import argparse
import lzma
import re
import sys
import tarfile
from pathlib import Path

from sglang_rq.quality.data import DATASETS, dataset_file

DROP = re.compile(
    r"^(sglang_rq|rq_kernels)(/|$)"
    r"|^sglang/benchmark(/|$)"
    r"|^sglang/test/(?!__init__\.py$|scripted_runtime(/|$))"
    r"|^tvm_ffi/(3rdparty|include)(/|$)"
    r"|^(traitlets|jsonschema|jsonschema_specifications|dill|referencing|zmq)/tests(/|$)"
    r"|^IPython/(terminal|sphinxext)/tests(/|$)")


def keep(name: str) -> bool:
    """Whether the bundle member ``name`` (a path inside the site, e.g. ``sglang/srt/...``, a
    leading ``./`` allowed) stays in the device site."""
    return not DROP.search(name.removeprefix("./"))


HEAD_BYTES = 64 * 1024  # 4 documents of 512 tokens, the GPU server test's, take about 10 KB


def write_data_heads(src: Path, dest: Path, size: int = HEAD_BYTES) -> list[Path]:
    """Write the first ``size`` bytes of each evaluation text (`DATASETS`) under ``src`` to the
    same relative path under ``dest``, cut after the last whole line; returns the files written.
    The documents `sglang_rq.quality.data.documents` takes from the start of a text are the same
    from the head as from the whole file while they fit in it.

    Raises
    ------
    FileNotFoundError
        A text is not under ``src``.
    """
    written = []
    for name in DATASETS:
        rel = dataset_file(name)
        with open(src / rel, "rb") as f:
            head = f.read(size)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(head[:head.rfind(b"\n") + 1])
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", help="the full bundle (sglang-rq bundle's site .tar.xz)")
    ap.add_argument("out", help="the device site to write (.tar.xz)")
    ap.add_argument("--data", nargs=2, metavar=("SRC", "DEST"),
                    help="also write the evaluation texts' heads from data directory SRC to DEST")
    a = ap.parse_args(argv)
    if a.data:
        for path in write_data_heads(Path(a.data[0]), Path(a.data[1])):
            print(f"{path}: {path.stat().st_size} B", file=sys.stderr)
    kept = dropped = 0
    with tarfile.open(a.bundle, "r:xz") as src, \
            lzma.open(a.out, "wb", preset=9) as raw, tarfile.open(fileobj=raw, mode="w") as dst:
        for member in src:
            if not keep(member.name):
                dropped += 1
                continue
            kept += 1
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    print(f"{a.out}: kept {kept} members, dropped {dropped}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
