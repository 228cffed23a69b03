"""The SGLang site for the lent GPU machine: the offline bundle (`sglang-rq bundle`) less what a
device call never imports, so that it travels beside the checkout.

``python benchmarks/device_site.py BUNDLE OUT`` (e.g. ``.gpu-bundle/sglang-rq-bundle.tar.xz
.gpu-bundle/site.tar.xz``), then carry ``OUT`` and unpack it on the device (``tar -xJf OUT -C
/tmp/rq-site``; ``PYTHONPATH=$PWD:/tmp/rq-site``).

A device call carries the working tree and the named ignored paths within 64 MiB, counted by disk
blocks: the checkout takes about 51.7 MB of it, the full bundle 16.9 MB, which together do not fit
(session 40). Dropped (`DROP`): the bundle's own sglang_rq and rq_kernels (the checkout's serve),
SGLang's test suite and benchmarks (but not the scripted runtime, which the scheduler imports),
tvm_ffi's headers, bundled third-party sources and testing library, third-party packages' tests,
and the wheels' RECORD files (pip's install lists; importlib.metadata reads METADATA). Kept:
everything serving imports; session 40 found `sglang.srt.multimodal`,
`sglang.srt.hardware_backend`, `sglang.srt.disaggregation`, openai, xgrammar, gguf and
soundfile's data imported at start-up (each missing one failed the server or the pool tests on an
H100: `benchmarks/results/h200_2026-12-06b_scripts/README.md`). About 15.2 MB. On CPU (session
40) the embedded model served a request with the site's SGLang (`python -S`, the site's sglang
ahead of a venv's other packages); its compiled wheels are the device's Python 3.12's.
"""

from __future__ import annotations

import argparse
import lzma
import re
import sys
import tarfile

DROP = re.compile(
    r"^(sglang_rq|rq_kernels)(/|$)"
    r"|^sglang/benchmark(/|$)"
    r"|^sglang/test/(?!__init__\.py$|scripted_runtime(/|$))"
    r"|^tvm_ffi/(3rdparty|include)(/|$)|^tvm_ffi/lib/libtvm_ffi_testing\.so$"
    r"|^(traitlets|jsonschema|jsonschema_specifications|dill|referencing|zmq)/tests(/|$)"
    r"|^IPython/(terminal|sphinxext)/tests(/|$)"
    r"|^[^/]+\.dist-info/RECORD$")


def keep(name: str) -> bool:
    """Whether the bundle member ``name`` (a path inside the site, e.g. ``sglang/srt/...``, a
    leading ``./`` allowed) stays in the device site."""
    return not DROP.search(name.removeprefix("./"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", help="the full bundle (sglang-rq bundle's site .tar.xz)")
    ap.add_argument("out", help="the device site to write (.tar.xz)")
    a = ap.parse_args(argv)
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
