"""Registers, spills and the SASS of each GPU kernel's inner loop, without a GPU.

``python benchmarks/sass_report.py --triton-site DIR [--out FILE] [--cases ouro,smollm,huginn]``

The CUDA tensor-core decode kernel (`rq_kernels/csrc/rq_decode_tc.cu`) is compiled last, for each
case's shape, two loop kinds and both occupancy shapes, with nvcc or NVRTC as at run time
(`compile_cuda`).

``python benchmarks/sass_report.py --cuda-only [--cuda-source A.cu B.cu ...] [--out FILE]``: only
the CUDA kernel, no Triton site needed (``cuobjdump`` from the installed Triton's wheel); with
several sources (e.g. revisions written out by ``git show REV:rq_kernels/csrc/rq_decode_tc.cu``)
their loops side by side, per variant, in the order given.

Step 1 (this process, Triton interpreter): run the real attention launchers
(`decode_attention` with each split kernel, `extend_attention`; not yet the commit kernel, whose
per-loop tuple arguments this script does not type) on small CPU views of each case's
shape and record every kernel launch: argument types, which integer arguments the CUDA JIT would
mark divisible by 16, the constexprs and the launch options. The interpreter's kernels are not
executed. Step 2 (a child process with ``--triton-site`` first on ``sys.path``, e.g. a ``pip
install --target DIR triton==3.6.0`` copy: the H200's Triton): compile each recorded launch for
``GPUTarget("cuda", 90, 128)`` and read ``cuobjdump -sass``/``-res-usage`` from that Triton's
wheel. Reported per kernel: registers, spill stack, total instructions, and the opcode histogram
of the largest backward-branch region (the main loop; for the CUDA kernel the smallest region
holding its MMAs, the tile loop, which the fused merge after it would otherwise be counted
with). Per-code figures: the loop's instructions per thread divided by the codes one thread
handles per loop iteration (``codes_per_iter`` in the JSON, computed from the launch: tile
tokens x head_dim x (K, V) x (anchor, residual) / threads).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {  # name: (num_qo_heads, num_kv_heads, head_dim)
    "ouro": (16, 16, 128),
    "smollm": (9, 3, 64),
    "huginn": (24, 24, 96),
}


def _type_of(value) -> tuple[str, bool]:
    """Triton signature type and 16-divisibility of one runtime argument."""
    import torch

    if isinstance(value, torch.Tensor):
        names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                 torch.uint8: "u8", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64"}
        return "*" + names[value.dtype], True
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        return ("i32" if -2**31 <= value < 2**31 else "i64"), value % 16 == 0 and value != 0
    if isinstance(value, float):
        return "fp32", False
    raise TypeError(f"unsupported kernel argument {type(value)}")


def capture(cases: list[str]) -> list[dict]:
    """Run the launchers under the interpreter and record every launch (not executed)."""
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, ROOT)
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    from benchmarks.common import realistic_pool
    from rq_kernels.decode import DecodeLaunch, decode_attention, fma_unsupported_reason
    from rq_kernels.extend import extend_attention
    from sglang_rq.config import RQConfig

    records: list[dict] = []
    label = {"case": "", "path": ""}

    def fake_run(self, *args, grid, warmup=False, **kwargs):
        opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg",
                                           "enable_fp_fusion") if k in kwargs}
        names = self.arg_names
        bound = dict(zip(names, args))
        bound.update(kwargs)
        sig, div, consts = {}, [], {}
        import inspect
        params = inspect.signature(self.fn).parameters
        for name in names:
            ann = params[name].annotation
            is_const = "constexpr" in str(ann)
            if is_const:
                consts[name] = bound[name]
                sig[name] = "constexpr"
            else:
                t, d = _type_of(bound[name])
                sig[name] = t
                if d:
                    div.append(name)
        # the interpreter's launch takes the plain paths (INTERP, no PTX); the GPU's does not
        if "INTERP" in consts:
            consts["INTERP"] = False
        if "FAST" in consts:
            consts["FAST"] = True
        records.append(dict(case=label["case"], path=label["path"], kernel=self.fn.__name__,
                            module=self.fn.__module__, signature=sig, divisible=div,
                            constexprs=consts, options=opts))

    InterpretedFunction.run = fake_run
    cfg, loops = RQConfig(), 4
    for case in cases:
        hq, hkv, dim = CASES[case]
        view = realistic_pool(cfg, num_loops=loops, num_kv_heads=hkv, head_dim=dim, rows=4 * 64 + 2,
                              device="cpu")
        b, ctx = 4, 64
        ind = torch.arange(b + 1, dtype=torch.int32) * ctx
        idx = torch.arange(1, b * ctx + 1, dtype=torch.int64)
        q = torch.zeros(b, hq, dim, dtype=torch.bfloat16)
        kc = torch.zeros(b, hkv, dim, dtype=torch.bfloat16)
        label["case"] = case
        for loop in (0, loops - 1):
            role = "residual" if loop < loops - 1 else "anchor"
            for kernel in ("fma", "mma"):
                if kernel == "fma" and fma_unsupported_reason(view, hq // hkv) is not None:
                    continue
                label["path"] = f"decode_{kernel}_{role}"
                decode_attention(q, kc, kc, view, loop, ind, idx, sm_scale=dim ** -0.5,
                                 launch=DecodeLaunch(split_kernel=kernel))
            label["path"] = f"extend_reconstruct_{role}"  # extend's one Triton kernel
            qx = torch.zeros(b * 8, hq, dim, dtype=torch.bfloat16)
            kx = torch.zeros(b * 8, hkv, dim, dtype=torch.bfloat16)
            qo = torch.arange(b + 1, dtype=torch.int32) * 8
            extend_attention(qx, kx, kx, view, loop, qo, ind, idx, sm_scale=dim ** -0.5)
    return records


def _loop_stats(sass: str, mma_loop: bool = False) -> dict:
    """Total instructions and the opcode histogram of one loop of ``sass`` (``cuobjdump -sass``):
    the largest backward-branch region, or with ``mma_loop`` the smallest one holding an MMA
    (HMMA/IMMA: the tc decode kernel's tile loop, which the merge code after it would otherwise
    enclose in a larger region)."""
    ins = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,6})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    mmas = [a for a, op, _ in ins if op.startswith(("HMMA", "IMMA"))]
    best = None
    for addr, op, rest in ins:
        if op == "BRA":
            t = re.search(r"0x([0-9a-f]+)", rest)
            if t and int(t.group(1), 16) < addr:
                lo = int(t.group(1), 16)
                if mma_loop:
                    if any(lo <= a <= addr for a in mmas) and (
                            best is None or addr - lo < best[1] - best[0]):
                        best = (lo, addr)
                elif best is None or addr - lo > best[1] - best[0]:
                    best = (lo, addr)
    total = collections.Counter(op for _, op, _ in ins)
    loop = collections.Counter(op for a, op, _ in ins if best and best[0] <= a <= best[1])
    return dict(total=sum(total.values()), loop_total=sum(loop.values()),
                loop_ops=dict(loop.most_common(25)))


def _cubin_stats(cubin: bytes, tools: str, mma_loop: bool = False) -> dict:
    """Registers, spill stack and `_loop_stats` of a cubin, read with ``cuobjdump`` in ``tools``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", f.name],
                          capture_output=True, text=True).stdout
    res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name],
                         capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    return dict(registers=int(regs.group(1)) if regs else None,
                stack_bytes=int(stack.group(1)) if stack else None, **_loop_stats(sass, mma_loop))


def compile_records(records: list[dict], site: str) -> list[dict]:
    """Child-process side: compile each record with the Triton in ``site`` for sm_90."""
    sys.path.insert(0, site)
    sys.path.insert(1, ROOT)
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    out = []
    for rec in records:
        mod = importlib.import_module(rec["module"])
        fn = getattr(mod, rec["kernel"])
        names = fn.arg_names
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in rec["divisible"]}
        src = ASTSource(fn, rec["signature"], constexprs=rec["constexprs"], attrs=attrs)
        opts = {k: v for k, v in rec["options"].items() if v is not None}
        row = dict(case=rec["case"], path=rec["path"], kernel=rec["kernel"], options=opts,
                   triton=triton.__version__)
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 128), options=opts)
            row.update(_cubin_stats(k.asm["cubin"], tools))
        except Exception as e:  # noqa: BLE001 - one kernel failing to compile is a finding
            row["error"] = repr(e)[:500]
        out.append(row)
    return out


def compile_cuda(tools: str, cases: list[str], source: str | None = None) -> list[dict]:
    """The CUDA tensor-core decode kernel's variants of the default format for each case's shape
    (head_dim, query heads per KV head): compiled for sm_90 as `rq_kernels.cuda` would (nvcc,
    else NVRTC), read with ``cuobjdump`` from ``tools``. ``source``: a .cu file to compile
    instead of the checkout's kernel. COOP and STREAM as served (`decode_tc.coop_shape`,
    `decode_tc.stream_shape`; the pool's alignment conditions, which the served pool meets,
    aside). Codes per thread per loop
    iteration: 16 tokens x subtiles x head_dim x (K, V) x (anchor, residual) / 32 lanes
    (head_dim 96 runs 128 wide)."""
    sys.path.insert(0, ROOT)
    from rq_kernels import cuda
    from rq_kernels.decode_tc import (
        KERNEL, OCCUPANCY, SOURCE, WARPS, coop_shape, integer_k, stream_shape,
    )

    text = Path(source).read_text() if source else (cuda.CSRC / SOURCE).read_text()
    rows = []
    for case in cases:
        hq, hkv, dim = CASES[case]
        int_k = integer_k(hq // hkv, dim, 32)
        for (path, r_bits, coef), occ in itertools.product(
                (("decode residual", 2, 1), ("decode anchor", 0, 0)), OCCUPANCY[int_k]):
            defines = dict(HEAD_DIM=dim, A_BITS=4, R_BITS=r_bits, GS=32, GQ=hq // hkv,
                           HAS_COEF=coef, WARPS=WARPS, KINT=int(int_k), MINB=occ.ctas_per_sm,
                           STAGES=occ.stages, SUBT=occ.subtiles,
                           COOP=int(coop_shape(hkv, dim, 32)))
            defines["STREAM"] = int(stream_shape(dim, (4, r_bits), bool(defines["COOP"])))
            cubin = cuda._compile(text, SOURCE, defines, "sm_90")  # noqa: SLF001 - same cache
            rows.append(dict(case=case, path=path, kernel=KERNEL, options=defines,
                             source=source or f"rq_kernels/csrc/{SOURCE}",
                             compiler="nvcc" if cuda.nvcc_path() else "nvrtc",
                             codes_per_iter=16 * occ.subtiles * dim * 2 * (2 if r_bits else 1) // 32,
                             **_cubin_stats(cubin, tools, mma_loop=True)))
    return rows


def cuda_report(cases: list[str], sources: list[str | None], out: str) -> list[dict]:
    """`compile_cuda` for each of ``sources`` (None: the checkout's kernel) with the installed
    Triton's ``cuobjdump``; writes the rows to ``out`` and prints each variant's loop
    instructions and registers per source, side by side."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    rows = [r for src in sources for r in compile_cuda(tools, cases, src)]
    with open(out, "w") as fh:
        json.dump(rows, fh, indent=1)
    per = len(rows) // len(sources)  # variants per source, in the same order
    print("loop instructions / registers per source:",
          " | ".join(rows[k * per]["source"] for k in range(len(sources))))
    for i in range(per):
        r, o = rows[i], rows[i]["options"]
        cells = " | ".join(f"{rows[k * per + i]['loop_total']:5d} / {rows[k * per + i]['registers']:3d}"
                           for k in range(len(sources)))
        print(f"{r['case']:7s} {r['path']:16s} MINB {o['MINB']} SUBT {o['SUBT']}: {cells}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--triton-site", help="directory holding the Triton to compile with")
    ap.add_argument("--out", default="sass_report.json")
    ap.add_argument("--cases", default="ouro,smollm,huginn")
    ap.add_argument("--cuda-only", action="store_true",
                    help="only the CUDA tc kernel (no Triton site needed)")
    ap.add_argument("--cuda-source", nargs="+", help="kernel source files to compare (--cuda-only)")
    ap.add_argument("--compile-from", help=argparse.SUPPRESS)  # child process: records JSON
    a = ap.parse_args()
    if a.cuda_only:
        cuda_report(a.cases.split(","), a.cuda_source or [None], a.out)
        return
    if a.compile_from:
        with open(a.compile_from) as f:
            rows = compile_records(json.load(f), a.triton_site)
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
        return
    if not a.triton_site:
        ap.error("--triton-site is required (e.g. pip install --target DIR triton==3.6.0)")
    records = capture(a.cases.split(","))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(records, f)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, __file__, "--compile-from", f.name, "--triton-site",
                    a.triton_site, "--out", a.out], check=True, env=env)
    os.unlink(f.name)
    with open(a.out) as fh:
        rows = json.load(fh)
    rows += compile_cuda(os.path.join(a.triton_site, "triton", "backends", "nvidia", "bin"),
                         a.cases.split(","))
    with open(a.out, "w") as fh:
        json.dump(rows, fh, indent=1)
    for r in rows:
        if "error" in r:
            print(f"{r['case']:7s} {r['path']:18s} {r['kernel']}: ERROR {r['error'][:120]}")
            continue
        print(f"{r['case']:7s} {r['path']:18s} {r['kernel']:28s} regs {r['registers']:3d} "
              f"stack {r['stack_bytes']:4d} total {r['total']:5d} loop {r['loop_total']:5d}")


if __name__ == "__main__":
    main()
