"""``sglang-rq doctor``: can this host serve sglang-rq? One ok/warn/FAIL line per fact.

Runs before anything else is importable, so this module imports only the standard library at
module level (``python -m sglang_rq.doctor`` works from an unpacked bundle on ``PYTHONPATH``).
``--unpack BUNDLE --site DIR`` extracts a bundle made by ``sglang-rq bundle`` first and then
checks that site. Exit code 0 when serving can work (CUDA missing is a warning: the CPU engine
is used), 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata as md
import importlib.util
import json
import lzma
import os
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

SGLANG_VERSION = "0.5.23"
PLUGIN_GROUP = "sglang.srt.plugins"
# Run in a fresh interpreter: SGLang's own loader finds the entry point, registers, applies hooks.
_PLUGIN_PROBE = """
import json
from sglang_rq import env, plugin
from sglang_rq.config import RQConfig
env.RQ_CONFIG.set(RQConfig().to_json())
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
load_plugins()
print("DOCTOR-JSON" + json.dumps({
    "model": "OuroForCausalLM" in ModelRegistry.models,
    "backends": [b for b in plugin.RQ_BACKENDS if b in ATTENTION_BACKENDS],
    "hooks": [t for t in plugin.HOOK_TARGETS if t in HookRegistry._patched],
    "expected_hooks": len(plugin.HOOK_TARGETS)}))
"""


@dataclass
class Check:
    """One line of the report: ``status`` is ``ok``, ``warn`` or ``FAIL``."""

    name: str
    status: str
    detail: str


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _run_python(code: str, *, env: dict[str, str] | None = None, timeout_s: float = 300
                ) -> tuple[int, str]:
    """Run ``code`` in a fresh interpreter (same ``sys.path`` roots); (rc, stdout + stderr)."""
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, **(env or {})}, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:.0f} s"
    return p.returncode, p.stdout + p.stderr


def _last_error(out: str) -> str:
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check("python", "ok" if ok else "FAIL",
                 f"{sys.version.split()[0]} ({sys.executable})" + ("" if ok else "; needs >= 3.11"))


def check_torch() -> tuple[Check, object | None]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return Check("torch", "FAIL", f"not importable: {exc}"), None
    cuda = torch.version.cuda
    return Check("torch", "ok", f"{torch.__version__} (" + (f"CUDA {cuda} build)" if cuda
                                                           else "CPU-only build)")), torch


def check_cuda(torch) -> Check:
    if torch is None or not torch.cuda.is_available():
        return Check("cuda", "warn", "no CUDA device: the CPU engine will be used (rq_native)")
    props = torch.cuda.get_device_properties(0)
    try:
        drv = torch._C._cuda_getDriverVersion()
        driver = f"driver API {drv // 1000}.{drv % 1000 // 10}"
    except Exception:  # noqa: BLE001 - private API; the line is informative only
        driver = "driver version unknown"
    return Check("cuda", "ok", f"{torch.cuda.device_count()} x {props.name}, sm_{props.major}"
                 f"{props.minor}, {props.total_memory / (1 << 30):.1f} GiB, {driver}")


def check_module(name: str, dist: str, *, required: bool, missing: str = "") -> Check:
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        return Check(name, "FAIL" if required else "warn", f"not importable: {exc}{missing}")
    return Check(name, "ok", str(getattr(mod, "__version__", None) or _version(dist)))


def check_sglang() -> Check:
    version = _version("sglang")
    if version is None:
        return Check("sglang", "FAIL", "not installed (no sglang dist-info on sys.path)")
    if version != SGLANG_VERSION:
        return Check("sglang", "FAIL",
                     f"{version}; sglang-rq hooks private names of {SGLANG_VERSION}")
    rc, out = _run_python("import sglang.srt.server_args")
    if rc:
        return Check("sglang", "FAIL", f"{version} but `import sglang.srt.server_args` fails: "
                     f"{_last_error(out)}")
    return Check("sglang", "ok", f"{version}, imports")


def check_entry_point() -> Check:
    eps = [ep for ep in md.entry_points(group=PLUGIN_GROUP) if ep.name == "sglang_rq"]
    if not eps:
        return Check("entry point", "FAIL", f"no `sglang_rq` in group {PLUGIN_GROUP}: SGLang's "
                     "processes will not load the plugin "
                     "(sglang_rq-*.dist-info missing from the site)")
    ep = eps[0]
    where = getattr(ep.dist, "_path", None) if ep.dist else None
    return Check("entry point", "ok", f"{PLUGIN_GROUP}: sglang_rq = {ep.value}"
                 + (f" ({where})" if where else ""))


@functools.lru_cache(maxsize=1)
def _standin_info() -> tuple[str | None, Path | None, dict[str, str] | None, str]:
    """(reason, stand-in dir, substitutes, error) from `sglang_rq.portable`, degrading if absent."""
    try:
        portable = importlib.import_module("sglang_rq.portable")
        reason = portable.standin_reason()
        standin_dir = Path(portable.STANDIN_DIR)
    except Exception as exc:  # noqa: BLE001 - written in parallel; may not exist yet
        return None, None, None, f"stand-in not available (sglang_rq.portable: {exc})"
    code = "import json, sgl_kernel; print('DOCTOR-JSON' + json.dumps(sgl_kernel.SUBSTITUTES))"
    rc, out = _run_python(code, env={"PYTHONPATH": os.pathsep.join(
        [str(standin_dir), os.environ.get("PYTHONPATH", "")])})
    subs = _tagged_json(out) if rc == 0 else None
    return reason, standin_dir, subs, "" if subs is not None else f"SUBSTITUTES: {_last_error(out)}"


def _tagged_json(out: str):
    for line in out.splitlines():
        if line.startswith("DOCTOR-JSON"):
            return json.loads(line[len("DOCTOR-JSON"):])
    return None


def check_sgl_kernel(*, cuda: bool) -> Check:
    version = _version("sglang-kernel") or _version("sgl-kernel")
    reason, standin_dir, subs, err = _standin_info()
    if standin_dir is not None and reason is None:
        return Check("sgl_kernel", "ok", f"real {version or '(version unknown)'}")
    if standin_dir is None:  # no portable mode: only a real, importable sgl_kernel will do
        rc, out = _run_python("import sgl_kernel")
        if rc == 0:
            return Check("sgl_kernel", "ok", f"real {version or '(version unknown)'}; {err}")
        why = f"{version} does not import ({_last_error(out)})" if version else "missing"
        if not cuda:
            return Check("sgl_kernel", "warn", f"{why}; the CPU shim is used on CPU; {err}")
        return Check("sgl_kernel", "FAIL", f"{why} and {err}")
    if subs is None:
        return Check("sgl_kernel", "FAIL" if cuda else "warn",
                     f"stand-in ({reason}) at {standin_dir} but {err}")
    ops = ", ".join(f"{op}={impl}" for op, impl in sorted(subs.items()))
    cpu = "" if cuda else "no CUDA, so the CPU shim serves; on CUDA: "
    return Check("sgl_kernel", "ok", f"{cpu}stand-in ({reason}); substitutes: {ops or 'none'}")


def check_flashinfer() -> Check:
    found = importlib.util.find_spec("flashinfer") is not None
    detail = (f"present {_version('flashinfer-python') or ''}".strip() if found
              else "not installed (not needed: rq_triton, and SGLang's triton backend for BF16)")
    return Check("flashinfer", "ok", detail)


def serving_env(*, cuda: bool) -> tuple[dict[str, str], str]:
    """The environment `sglang_rq.launch_server` gives SGLang on this host, and its name:
    the CPU engine with the CPU shim, portable CUDA mode with the stand-in, or nothing added."""
    spec = importlib.util.find_spec("sglang_rq")
    old = os.environ.get("PYTHONPATH", "")
    if spec is None or not spec.submodule_search_locations:
        return {}, "sglang_rq not importable"
    if not cuda:
        shims = Path(next(iter(spec.submodule_search_locations))) / "_cpu_shims"
        return ({"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": os.pathsep.join(
            p for p in (str(shims), old) if p)}, "CPU engine + CPU shim")
    reason, standin_dir, _, _ = _standin_info()
    if standin_dir is None or reason is None:
        return {}, "CUDA"
    env = dict(importlib.import_module("sglang_rq.portable").portable_environment())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(standin_dir), old) if p)
    return env, "portable CUDA mode"


def check_plugin(*, cuda: bool) -> Check:
    env, mode = serving_env(cuda=cuda)
    rc, out = _run_python(_PLUGIN_PROBE, env=env)
    got = _tagged_json(out)
    if rc or got is None:
        return Check("plugin", "FAIL", f"load_plugins() failed: {_last_error(out)}")
    bad = []
    if not got["model"]:
        bad.append("OuroForCausalLM not registered")
    if len(got["backends"]) != 2:
        bad.append(f"backends {got['backends']}")
    if len(got["hooks"]) != got["expected_hooks"]:
        bad.append(f"{len(got['hooks'])}/{got['expected_hooks']} hooks applied")
    if bad:
        return Check("plugin", "FAIL", "; ".join(bad) + f" ({_last_error(out)})")
    return Check("plugin", "ok", f"registered: OuroForCausalLM, {', '.join(got['backends'])}, "
                 f"{len(got['hooks'])}/{got['expected_hooks']} hooks applied ({mode})")


def unpack(bundle: Path, *, site: Path) -> int:
    """Extract ``bundle`` (a ``.tar.xz`` from ``sglang-rq bundle``) into ``site``; file count."""
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle, "r:xz") as tar:
        members = tar.getmembers()
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(site, members, **kw)
    return sum(m.isfile() for m in members)


# what a bundle's site must hold itself (torch, triton and CUDA come from the host)
SITE_PACKAGES = ("sglang", "sglang_rq")


def check_site(site: Path) -> Check:
    """FAIL unless each of `SITE_PACKAGES` imports from ``site`` (``--site``): found elsewhere on
    ``sys.path`` (the running environment's own), it says nothing of the site (a review's empty
    directory passed every check)."""
    outside = []
    for name in SITE_PACKAGES:
        spec = importlib.util.find_spec(name)
        where = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if where is None or site not in where.parents:
            outside.append(f"{name} ({where.parent if where else 'not found'})")
    if outside:
        return Check("site", "FAIL", f"{site} lacks {', '.join(outside)}: unpack a bundle there "
                     "(--unpack BUNDLE --site DIR)")
    return Check("site", "ok", f"{', '.join(SITE_PACKAGES)} import from {site}")


def run_checks(site: Path | None = None) -> list[Check]:
    """Every check, in report order; ``site``: the ``--site`` directory checked first."""
    checks = [check_python()] + ([check_site(site)] if site is not None else [])
    torch_check, torch = check_torch()
    checks.append(torch_check)
    cuda = torch is not None and torch.cuda.is_available()
    checks.append(check_module("triton", "triton", required=cuda,
                               missing="" if cuda else " (only needed on CUDA)"))
    checks.append(check_cuda(torch))
    checks.append(check_module("transformers", "transformers", required=True))
    checks += [check_sglang(), check_entry_point(), check_sgl_kernel(cuda=cuda),
               check_flashinfer()]
    if all(c.status != "FAIL" for c in checks):
        checks.append(check_plugin(cuda=cuda))
    else:
        checks.append(Check("plugin", "FAIL", "not tried: fix the failures above first"))
    return checks


def main(argv: list[str] | None = None) -> int:
    """``sglang-rq doctor [--json] [--unpack BUNDLE] [--site DIR]``."""
    p = argparse.ArgumentParser(prog="sglang-rq doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    p.add_argument("--unpack", type=Path, default=None, help="Bundle (.tar.xz) to extract first.")
    p.add_argument("--site", type=Path, default=None,
                   help="Directory to extract --unpack into; without --unpack, an unpacked site "
                        "to check.")
    args = p.parse_args(argv)
    if args.unpack is None and args.site is not None and not args.site.is_dir():
        what = "not a directory" if args.site.exists() else "no such directory"
        p.error(f"--site {args.site}: {what} (give --unpack BUNDLE to extract one)")
    if args.unpack is not None:
        if args.site is None:
            p.error("--unpack needs --site DIR")
        try:
            args.site.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            p.error(f"--site {args.site}: cannot be a directory ({exc})")
        try:
            n = unpack(args.unpack, site=args.site)
        except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
            p.error(f"--unpack {args.unpack}: not a readable .tar.xz bundle ({exc})")
        except OSError as exc:
            p.error(f"--unpack {args.unpack} into --site {args.site}: {exc}")
        if not args.json:
            print(f"unpacked {n} files into {args.site.resolve()}; serve with "
                  f"PYTHONPATH={args.site.resolve()}")
    if args.site is not None:  # a review: --site alone was ignored and the venv checked
        site = str(args.site.resolve())
        sys.path.insert(0, site)  # this process and (below) every check's subprocess
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = site + (os.pathsep + old if old else "")
        importlib.invalidate_caches()
    checks = run_checks(args.site.resolve() if args.site is not None else None)
    ok = all(c.status != "FAIL" for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}))
    else:
        for c in checks:
            print(f"{c.status:<4}  {c.name:<12} {c.detail}")
        print("serving can work" if ok else "serving cannot work: see FAIL lines")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
