"""Build FlashInfer's BF16 paged decode kernels ahead of time, as a second baseline for the H200.

``python benchmarks/flashinfer_bundle.py OUT [--gpu-python 3.12] [--head-dims 64 128]``

The `flashinfer-python` wheel (101 MB) is more than a device call carries, and most of it (its
package ``__init__`` imports cutlass-dsl, cudnn-frontend and nccl packages) is not needed for
decode. This script, on a machine with PyPI and nvcc >= 12.8 (no GPU needed), downloads
FlashInfer and `apache-tvm-ffi` (their bindings' runtime), has FlashInfer's own JIT
(`flashinfer.jit.attention.modules.gen_batch_decode_module`) generate and compile its batch
decode module (the CUDA-core kernel SGLang 0.5.23's FlashInfer backend runs for BF16 decode at fewer
than 4 query heads per KV head, `should_use_tensor_core`: ``BatchDecodeWithPagedKVCacheWrapper``
without tensor cores) for
sm_90a, BF16 query, cache and output, int32 indices, no RoPE, no sliding window, no soft cap, one
module per head_dim (64 and 128: at 96 the module builds but its split-KV merge refuses
the head_dim at run time), and writes ``OUT/flashinfer-decode/``: the modules
(``bf16_d{64,128}.so``), the tvm-ffi wheel of the GPU machine's Python and ``manifest.json``
(versions, flags). About 4 MB: a device call carries it (``.gpu-bundle/flashinfer-decode``
in the call's carry), `benchmarks.flashinfer_decode` loads it and `bench_decode.py` and
`bench_decode_step.py` time it where present.

The package is imported under an empty ``__init__`` (only `flashinfer.jit` is needed).
FlashInfer's link line asks for ``-lcuda``, which a build machine without a driver lacks: a stub
``libcuda.so`` is put on the link path (nothing in the modules calls the driver API, so the
linker drops it). The modules need ``libcudart.so.13``: on the GPU machine, the one a CUDA 13
build of torch has loaded (torch is imported first).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

FLASHINFER = "flashinfer-python==0.7.4"
TVM_FFI = "apache-tvm-ffi==0.1.15.post2"

GEN = """
import json, sys, torch
from flashinfer.jit.attention.modules import gen_batch_decode_module
out = {}
for d in map(int, sys.argv[1:]):
    spec = gen_batch_decode_module(torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                                   d, d, 0, False, False)
    spec.build(verbose=False)
    out[d] = str(spec.jit_library_path)
print(json.dumps(out))
"""


def pip_download(spec: str, dest: pathlib.Path, *extra: str) -> pathlib.Path:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", spec, "-d",
                    str(dest), *extra], check=True)
    name = spec.split("==")[0].replace("-", "_")
    (whl,) = [p for p in dest.glob("*.whl") if p.name.lower().startswith(name)]
    return whl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--gpu-python", default="3.12", help="the GPU machine's Python (tvm-ffi wheel)")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128],
                    help="96 builds, but its split-KV merge refuses head_dim 96 at run time")
    a = ap.parse_args()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("flashinfer_bundle: nvcc (CUDA >= 12.8) is not on PATH")
    # the CUDA runtime's directory (nvcc may be a wrapper script outside the toolkit)
    homes = [pathlib.Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    homes += [pathlib.Path(os.path.realpath(nvcc)).parent.parent, pathlib.Path("/usr/local/cuda"),
              *sorted(pathlib.Path("/usr/local").glob("cuda-*"), reverse=True)]
    libs = [d for h in homes for d in (h / "lib64", h / "lib") if (d / "libcudart.so").exists()]
    if not libs:
        sys.exit("flashinfer_bundle: no libcudart.so under " + ", ".join(map(str, homes)))
    dest = a.out / "flashinfer-decode"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        site = tmp / "site"
        with zipfile.ZipFile(pip_download(FLASHINFER, tmp / "whl")) as z:
            z.extractall(site, [n for n in z.namelist() if n.startswith("flashinfer/")])
        with zipfile.ZipFile(pip_download(TVM_FFI, tmp / "whl-local")) as z:
            z.extractall(site)
        (site / "flashinfer" / "__init__.py").write_text("")
        gpu_whl = pip_download(TVM_FFI, tmp / "whl-gpu", "--python-version", a.gpu_python,
                               "--platform", "manylinux_2_28_x86_64", "--only-binary=:all:")
        # a stub driver library for FlashInfer's -lcuda (unused, dropped by the linker)
        stub = tmp / "stub"
        stub.mkdir()
        subprocess.run(["cc", "-shared", "-Wl,-soname,libcuda.so.1", "-o",
                        str(stub / "libcuda.so"), "-x", "c", "/dev/null"], check=True)
        env = dict(os.environ, PYTHONPATH=str(site),
                   FLASHINFER_CUDA_ARCH_LIST="9.0a", FLASHINFER_WORKSPACE_BASE=str(tmp / "ws"),
                   FLASHINFER_EXTRA_LDFLAGS=f"-L{libs[0]} -L{stub}")
        modules = {}
        for d in a.head_dims:
            run = subprocess.run([sys.executable, "-c", GEN, str(d)], env=env,
                                 capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"flashinfer_bundle: head_dim {d} did not build:\n{run.stderr[-3000:]}")
            path = json.loads(run.stdout.strip().splitlines()[-1])[str(d)]
            name = f"bf16_d{d}.so"
            shutil.copy(path, dest / name)
            modules[d] = name
        for old in dest.glob("apache_tvm_ffi-*.whl"):
            old.unlink()
        shutil.copy(gpu_whl, dest / gpu_whl.name)
        nvcc_version = subprocess.run([nvcc, "--version"], capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1]
    manifest = dict(flashinfer=FLASHINFER, tvm_ffi=TVM_FFI, tvm_ffi_wheel=gpu_whl.name,
                    nvcc=nvcc_version, arch="sm_90a", modules=modules,
                    module="gen_batch_decode_module(bf16, bf16, bf16, int32, d, d, "
                           "pos_encoding NONE, no sliding window, no logits soft cap)")
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {dest}: " + ", ".join(sorted(p.name for p in dest.iterdir())))


if __name__ == "__main__":
    main()
