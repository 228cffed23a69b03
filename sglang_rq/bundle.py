"""``sglang-rq bundle``: the offline bundle for a CUDA host that has Python, torch and triton.

The bundle holds exactly what such a host lacks to serve sglang-rq: SGLang 0.5.23 pruned of what
serving never imports (`SGLANG_DROP`), the serve-time dependencies listed in
``bundle_requirements.txt`` that the host does not already have at a compatible version, and
sglang-rq itself as a wheel (with its ``sglang.srt.plugins`` entry point; the embedded model
assets only with ``--with-model``). The wheels are unpacked into one site tree (``*.data``
dropped) and written as ``sglang-rq-bundle.tar.xz`` beside ``manifest.json``. torch, triton,
``nvidia-*``, sglang-kernel and flashinfer are never bundled: they are the host's own, and the
portable CUDA mode replaces ``sgl_kernel`` where it is missing. On the host:
``tar -xJf ... -C SITE && PYTHONPATH=SITE python3 -m sglang_rq.doctor``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sglang_rq.cli_values import out_dir_error

SGLANG_PIN = "sglang==0.5.23"
DEFAULT_PLATFORMS = tuple(f"{tag}_x86_64" for tag in (
    "manylinux_2_34", "manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014",
    "manylinux_2_5", "manylinux1"))
EXCLUDED = re.compile(r"^(torch|triton|sglang-kernel|sgl-kernel|flashinfer(-.*)?|nvidia-.*)$")
# NOTE: multimodal_gen is the diffusion server (~23 MB); the Rust extensions are optional
# HTTP/gRPC/bench/multimodal paths; the Rust TreeCore mis-reads int64 under another torch ABI and
# SGLang falls back to its Python TreeCore without it (gpu-probe README, error 3).
SGLANG_DROP = re.compile(
    r"^sglang/multimodal_gen/"
    r"|^sglang/srt/rust_extensions/_(server|bench|grpc|multimodal)\.[^/]*\.so$"
    r"|^sglang/srt/mem_cache/rust_tree_core/mem_cache\.[^/]*\.so$")
ASSETS_DROP = re.compile(r"^sglang_rq/assets/")
REQUIREMENTS = Path(__file__).with_name("bundle_requirements.txt")


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One line of ``bundle_requirements.txt``: a name, the version to bundle, and whether a
    CUDA PyTorch image is assumed to have it already (``# host-base``)."""

    name: str
    version: str
    host_base: bool = False


def read_requirements(path: Path = REQUIREMENTS) -> list[Pin]:
    """Parse ``name==version  [# host-base]`` lines (other comments and blanks ignored).

    Raises
    ------
    ValueError
        On a line that is not an exact pin, or names a package the bundle must never carry.
    """
    pins = []
    for num, raw in enumerate(path.read_text().splitlines(), 1):
        line, _, comment = raw.partition("#")
        if not line.strip():
            continue
        m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*==\s*([^\s;]+)\s*", line)
        if not m or EXCLUDED.match(canonical(m.group(1))):
            raise ValueError(f"{path}:{num}: expected an allowed `name==version` pin, got {raw!r}")
        pins.append(Pin(canonical(m.group(1)), m.group(2), "host-base" in comment))
    return pins


def parse_freeze(text: str) -> dict[str, str | None]:
    """``pip freeze`` output -> {canonical name: version}; None for ``name @ url`` lines."""
    host: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)\s*(?:==\s*(\S+)|@\s*\S.*)", line)
        if m:
            host[canonical(m.group(1))] = m.group(2)
    return host


def host_compatible(version: str | None, specs: list[str]) -> bool:
    """True if a host's ``version`` satisfies every specifier in ``specs`` (e.g. ``>=4.14``)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if not specs:
        return True
    if version is None:
        return False
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return all(SpecifierSet(s).contains(v, prereleases=True) for s in specs)


def select_requirements(pins: list[Pin], *, host: dict[str, str | None] | None,
                        constraints: dict[str, list[str]]) -> tuple[list[Pin], dict[str, str]]:
    """Split ``pins`` into those to bundle and those the host already has (pure).

    Parameters
    ----------
    pins
        The serve-time list (`read_requirements`).
    host
        `parse_freeze` of the target host; None assumes a CUDA PyTorch image that has exactly
        the ``host-base`` pins.
    constraints
        {canonical name: [specifier, ...]} placed on each package by SGLang and the bundled wheels.

    Returns
    -------
    (bundle, left_out)
        The pins to bundle, and {name: reason} for the ones left out.
    """
    bundle, left_out = [], {}
    for pin in pins:
        if host is None:
            present, version = pin.host_base, pin.version
        else:
            present, version = pin.name in host, host.get(pin.name)
        specs = constraints.get(pin.name, [])
        if present and host_compatible(version, specs):
            why = f" ({','.join(specs)})" if specs else ""
            left_out[pin.name] = f"host has {version or 'it'}{why}"
        else:
            bundle.append(pin)
    return bundle, left_out


def wheel_requirements(whl: Path, *, python: str, machine: str) -> list[tuple[str, str]]:
    """(canonical name, specifier) of a wheel's ``Requires-Dist`` that apply to the target
    (markers evaluated for Linux/``machine``/``python``, no extras)."""
    from packaging.requirements import Requirement

    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": machine, "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                out.append((canonical(req.name), str(req.specifier)))
    return out


def prune_wheel(src: Path, out_dir: Path, *, drop: Callable[[str], bool]) -> list[tuple[str, int]]:
    """Write ``out_dir/<src.name>`` without the members ``drop`` selects; RECORD loses their lines.

    Kept members keep their bytes and zip metadata. Returns [(dropped name, size in bytes)].
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    dropped = []
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(out_dir / src.name, "w", zipfile.ZIP_DEFLATED,
                                                     compresslevel=9) as zo:
        for info in zi.infolist():
            if drop(info.filename):
                dropped.append((info.filename, info.file_size))
                continue
            data = zi.read(info.filename)
            if re.fullmatch(r"[^/]+\.dist-info/RECORD", info.filename):
                rows = [r for r in data.decode().splitlines() if not drop(r.split(",", 1)[0])]
                data = ("\n".join(rows) + "\n").encode()
            zo.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return dropped


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download(specs: list[str], *, dest: Path, python: str, platforms: tuple[str, ...]) -> None:
    """``pip download --no-deps`` of binary wheels for the target interpreter and platforms."""
    plat = [a for p in platforms for a in ("--platform", p)]
    _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
         "--python-version", python, *plat, "-d", str(dest), *specs)


def build_self_wheel(*, root: Path, dest: Path, with_model: bool) -> Path:
    """``pip wheel --no-deps`` of the checkout at ``root`` (copied, so the tree is not touched)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", *(() if with_model else ("assets",)))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "sglang_rq", "rq_kernels"):
            if (root / name).is_dir():
                shutil.copytree(root / name, src / name, ignore=skip)
            elif (root / name).exists():
                shutil.copy2(root / name, src / name)
        _pip("wheel", "-q", "--no-deps", "-w", str(dest), str(src))
    return next(dest.glob("sglang_rq-*.whl"))


def write_site_tar(wheels: list[Path], *, out: Path) -> int:
    """Unpack ``wheels`` into one site tree (``*.data`` dropped), tar it, xz -9; site bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                keep = [n for n in z.namelist() if not n.split("/", 1)[0].endswith(".data")]
                z.extractall(site, keep)
        site_bytes = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())

        def norm(ti: tarfile.TarInfo) -> tarfile.TarInfo:
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mtime = 0
            return ti

        with out.open("wb") as f:
            xz = subprocess.Popen(["xz", "-9", "-T0", "-c"], stdin=subprocess.PIPE, stdout=f)
            with tarfile.open(fileobj=xz.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for p in sorted(site.iterdir()):
                    tar.add(p, arcname=p.name, filter=norm)
            xz.stdin.close()
            if xz.wait():
                raise RuntimeError("xz failed")
    return site_bytes


def _wheel_name(whl: Path) -> tuple[str, str]:
    name, version = whl.name.split("-")[:2]
    return canonical(name), version


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(out: Path, *, python: str, platforms: tuple[str, ...], host_freeze: Path | None,
          with_model: bool) -> dict:
    """Build ``out/sglang-rq-bundle.tar.xz`` and ``out/manifest.json``; return the manifest."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise SystemExit(f"sglang-rq bundle: needs the source checkout (no {root}/pyproject.toml)")
    pins = read_requirements()
    by_name = {p.name: p for p in pins}
    host = parse_freeze(host_freeze.read_text()) if host_freeze else None
    machine = "aarch64" if platforms[0].endswith("aarch64") else "x86_64"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw, deps, wheels = Path(tmp, "raw"), Path(tmp, "deps"), Path(tmp, "wheels")
        download([SGLANG_PIN], dest=raw, python=python, platforms=platforms)
        sg_raw = next(raw.glob("sglang-*.whl"))
        dropped = prune_wheel(sg_raw, wheels, drop=lambda n: bool(SGLANG_DROP.search(n)))
        self_whl = build_self_wheel(root=root, dest=wheels, with_model=with_model)
        constraints: dict[str, list[str]] = {}

        def constrain(whl: Path) -> None:
            for name, spec in wheel_requirements(whl, python=python, machine=machine):
                if spec and name in by_name and spec not in constraints.setdefault(name, []):
                    constraints[name].append(spec)

        constrain(sg_raw)
        constrain(self_whl)
        fetched: dict[str, Path] = {}
        while True:  # bundled wheels may constrain host packages: repeat until nothing is added
            chosen, left_out = select_requirements(pins, host=host, constraints=constraints)
            need = [p for p in chosen if p.name not in fetched]
            if not need:
                break
            before = set(deps.glob("*.whl"))
            download([f"{p.name}=={p.version}" for p in need], dest=deps, python=python,
                     platforms=platforms)
            for whl in sorted(set(deps.glob("*.whl")) - before):
                fetched[_wheel_name(whl)[0]] = whl
                constrain(whl)
        final = [wheels / sg_raw.name, self_whl] + [fetched[p.name] for p in chosen]
        site_bytes = write_site_tar(final, out=out / "sglang-rq-bundle.tar.xz")
        names = {_wheel_name(w)[0] for w in final}
        assumed = set(host) if host is not None else {p.name for p in pins if p.host_base}
        unlisted = {}
        for whl in final[1:]:  # what bundled wheels declare and neither bundle nor host provides
            reqs = {n for n, _ in wheel_requirements(whl, python=python, machine=machine)}
            missing = sorted(n for n in reqs - names - assumed - set(by_name)
                             if not EXCLUDED.match(n))
            if missing:
                unlisted[_wheel_name(whl)[0]] = missing
        dists = [{"name": n, "version": v, "wheel": w.name, "sha256": _sha256(w),
                  "bytes": w.stat().st_size} for w in final for n, v in [_wheel_name(w)]]
        source_sha256 = _sha256(sg_raw)
    manifest = {
        "bundle": "sglang-rq-bundle.tar.xz",
        "tar_xz_bytes": (out / "sglang-rq-bundle.tar.xz").stat().st_size,
        "site_bytes": site_bytes,
        "wheels_bytes": sum(d["bytes"] for d in dists),
        "target": {"python": python, "platforms": list(platforms), "with_model": with_model,
                   "host_freeze": str(host_freeze) if host_freeze else None},
        "distributions": dists,
        "pruned": {"sglang": {"rule": SGLANG_DROP.pattern, "files": len(dropped),
                              "bytes": sum(s for _, s in dropped), "source_sha256": source_sha256,
                              "paths": _summarise(dropped)}},
        "left_out": left_out,
        "never_bundled": EXCLUDED.pattern,
        "unlisted_requirements": unlisted,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _summarise(dropped: list[tuple[str, int]]) -> dict[str, int]:
    """{directory or file: bytes} for the dropped members (multimodal_gen as one entry)."""
    out: dict[str, int] = {}
    for name, size in dropped:
        key = "sglang/multimodal_gen/" if name.startswith("sglang/multimodal_gen/") else name
        out[key] = out.get(key, 0) + size
    return out


def main(argv: list[str] | None = None) -> int:
    """``sglang-rq bundle --out DIR [--python 3.12] [--platform TAG ...] [--host-freeze FILE]``."""
    p = argparse.ArgumentParser(prog="sglang-rq bundle", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="Output directory.")
    p.add_argument("--python", default="3.12", help="Target Python version (default 3.12).")
    p.add_argument("--platform", action="append", default=None,
                   help="Target wheel platform tag, repeatable "
                        f"(default: {', '.join(DEFAULT_PLATFORMS)}).")
    p.add_argument("--host-freeze", type=Path, default=None,
                   help="`pip freeze` of the target host: packages it has at a compatible version "
                        "are left out (default: a CUDA PyTorch image with transformers).")
    p.add_argument("--with-model", action="store_true",
                   help="Include the embedded mini-Ouro assets (38 MB uncompressed).")
    args = p.parse_args(argv)
    # a review (session 42) got tracebacks for each of these, pip's usage text for --python abc
    if not re.fullmatch(r"3\.\d+", args.python):
        p.error(f"--python={args.python} must be a Python version such as 3.12")
    if (err := out_dir_error("--out", args.out)) is not None:
        p.error(err)
    if args.host_freeze is not None:
        try:
            args.host_freeze.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            p.error(f"--host-freeze={args.host_freeze}: cannot read it as a `pip freeze` text "
                    f"({exc})")
    try:
        m = build(args.out, python=args.python, platforms=tuple(args.platform or DEFAULT_PLATFORMS),
                  host_freeze=args.host_freeze, with_model=args.with_model)
    except subprocess.CalledProcessError as exc:  # pip printed why above
        print(f"error: {' '.join(map(str, exc.cmd))} failed (exit {exc.returncode}); see pip's "
              "output above (--platform tags and --python pick the wheels)", file=sys.stderr)
        return 1
    mb = m["tar_xz_bytes"] / 1e6
    print(f"{args.out / m['bundle']}: {mb:.1f} MB ({len(m['distributions'])} distributions, "
          f"{m['wheels_bytes'] / 1e6:.1f} MB as wheels, "
          f"unpacks to {m['site_bytes'] / 1e6:.0f} MB); "
          f"sglang pruned by {m['pruned']['sglang']['bytes'] / 1e6:.1f} MB; "
          f"{len(m['left_out'])} left to the host")
    if mb > 20 and not args.with_model:
        print("warning: over the 20 MB target", file=sys.stderr)
    for dist, names in m["unlisted_requirements"].items():
        print(f"note: {dist} requires {', '.join(names)} (not bundled; add to "
              "bundle_requirements.txt if serving imports it)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
