"""``sglang-rq bundle`` (pruning, requirement selection) and ``sglang-rq doctor`` on CPU.

No network except `test_real_bundle`, which builds the real bundle from PyPI and runs only with
``SGLANG_RQ_TEST_BUNDLE=1``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from sglang_rq import bundle
from sglang_rq.bundle import Pin

ROOT = Path(__file__).resolve().parent.parent


def _record_row(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _make_wheel(path: Path, files: dict[str, bytes]) -> None:
    record_name = "sglang-0.5.23.dist-info/RECORD"
    rows = [_record_row(n, d) for n, d in files.items()] + [f"{record_name},,"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(record_name, "\n".join(rows) + "\n")


def test_prune_wheel_drops_files_and_rewrites_record(tmp_path):
    files = {
        "sglang/__init__.py": b"__version__ = '0.5.23'\n",
        "sglang/srt/server_args.py": b"x = 1\n" * 100,
        "sglang/multimodal_gen/__init__.py": b"big = 1\n",
        "sglang/multimodal_gen/runtime/pipe.py": b"y = 2\n",
        "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so": b"\x7fELF" * 50,
        "sglang/srt/rust_extensions/__init__.py": b"",
        "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so": b"\x7fELF",
        "sglang/srt/mem_cache/rust_tree_core/__init__.py": b"# python fallback\n",
        "sglang-0.5.23.dist-info/METADATA": b"Name: sglang\nVersion: 0.5.23\n",
    }
    src = tmp_path / "in" / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    src.parent.mkdir()
    _make_wheel(src, files)
    dropped = bundle.prune_wheel(src, tmp_path / "out",
                                 drop=lambda n: bool(bundle.SGLANG_DROP.search(n)))

    gone = {n for n in files if "multimodal_gen" in n or n.endswith(".so")}
    assert {n for n, _ in dropped} == gone
    assert sum(s for _, s in dropped) == sum(len(files[n]) for n in gone)
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        names = set(z.namelist())
        assert names == (set(files) - gone) | {"sglang-0.5.23.dist-info/RECORD"}
        for name in names - {"sglang-0.5.23.dist-info/RECORD"}:
            assert z.read(name) == files[name]  # kept files byte-identical
        record = z.read("sglang-0.5.23.dist-info/RECORD").decode().splitlines()
    listed = {row.split(",", 1)[0] for row in record}
    assert listed == names  # RECORD lists exactly what the wheel holds, hashes unchanged
    for row in record:
        name = row.split(",", 1)[0]
        if name in files:
            assert row == _record_row(name, files[name])


PINS = [Pin("orjson", "3.13.0"), Pin("pydantic", "2.14.4"), Pin("pydantic-core", "2.50.5"),
        Pin("xgrammar", "0.2.7"), Pin("transformers", "5.19.0", host_base=True),
        Pin("numpy", "2.3.5", host_base=True)]


def test_select_requirements_without_freeze_assumes_cuda_image():
    chosen, left_out = bundle.select_requirements(PINS, host=None, constraints={})
    assert [p.name for p in chosen] == ["orjson", "pydantic", "pydantic-core", "xgrammar"]
    assert set(left_out) == {"transformers", "numpy"}


def test_select_requirements_with_host_freeze():
    host = bundle.parse_freeze(
        "Orjson==3.9.0\npydantic==2.11.0\npydantic_core==2.33.2\nxgrammar==0.1.21\n"
        "numpy @ file:///tmp/numpy-2.0-cp312.whl\n-e git+https://x/y#egg=z\n# comment\n")
    assert host == {"orjson": "3.9.0", "pydantic": "2.11.0", "pydantic-core": "2.33.2",
                    "xgrammar": "0.1.21", "numpy": None}
    constraints = {"xgrammar": ["==0.2.7"], "pydantic-core": ["==2.50.5"]}
    chosen, left_out = bundle.select_requirements(PINS, host=host, constraints=constraints)
    # orjson unconstrained: the host's is fine; xgrammar pinned by SGLang; pydantic-core pinned
    # by the bundled pydantic; transformers absent; numpy from a URL (version unknown, no spec).
    assert [p.name for p in chosen] == ["pydantic-core", "xgrammar", "transformers"]
    assert set(left_out) == {"orjson", "pydantic", "numpy"}
    chosen, _ = bundle.select_requirements(PINS, host=host,
                                           constraints={**constraints, "pydantic": [">=2.12"]})
    assert "pydantic" in [p.name for p in chosen]
    assert bundle.host_compatible("4.16.0", [">=4.14", "<5"])
    assert not bundle.host_compatible(None, [">=1"])


def test_requirements_file_is_valid_and_excludes_host_packages():
    pins = bundle.read_requirements()
    names = [p.name for p in pins]
    assert len(names) == len(set(names))
    assert {"xgrammar", "pyzmq", "cffi"} <= {p.name for p in pins if not p.host_base}
    assert "transformers" in {p.name for p in pins if p.host_base}
    for banned in ("torch", "triton", "nvidia-cublas", "sglang-kernel", "flashinfer-python"):
        assert bundle.EXCLUDED.match(banned)
        assert banned not in names


def _run_doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_rq.doctor", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def doctor_json():
    r = _run_doctor("--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_doctor_json_report(doctor_json):
    checks = {c["name"]: c for c in doctor_json["checks"]}
    assert doctor_json["ok"] is True
    assert list(checks) == ["python", "torch", "triton", "cuda", "transformers", "sglang",
                            "entry point", "sgl_kernel", "flashinfer", "plugin"]
    assert all(c["status"] in ("ok", "warn") for c in checks.values())
    assert checks["sglang"]["detail"].startswith("0.5.23")
    assert "sglang_rq.plugin:register" in checks["entry point"]["detail"]
    assert "OuroForCausalLM" in checks["plugin"]["detail"]
    # the default (RQ) configuration installs 12 hooks: cell size, fixed overhead, byte budget,
    # pool class, input-ids validation, CPU heap trim, n validation, the readiness probe's
    # auth, chat request validation, the weights-update rollback, the input_embeds batch
    # check, detokenize validation (sglang_rq/plugin.py docstring)
    assert "12/12 hooks applied" in checks["plugin"]["detail"]
    import torch

    if not torch.cuda.is_available():
        assert checks["cuda"]["status"] == "warn" and "CPU engine" in checks["cuda"]["detail"]


def test_doctor_text_report(doctor_json):
    r = _run_doctor()
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "serving can work"
    names = [c["name"] for c in doctor_json["checks"]]
    assert len(lines) == len(names) + 1
    for line, name in zip(lines, names):
        status, rest = line.split(None, 1)
        assert status in ("ok", "warn") and rest.startswith(name)
    assert any(line.startswith("ok    sglang       0.5.23, imports") for line in lines)
    assert any(line.startswith("ok    plugin") for line in lines)


def test_doctor_imports_only_stdlib_at_module_level():
    code = ("import sys; before = set(sys.modules); import sglang_rq.doctor; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(new - set(sys.stdlib_module_names) - {'sglang_rq'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_doctor_unpack_extracts_bundle(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:xz") as tar:
        for name, data in {"pkg_x/__init__.py": b"V = 1\n",
                           "pkg_x-1.0.dist-info/METADATA": b"Name: pkg-x\nVersion: 1.0\n"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "b.tar.xz"
    path.write_bytes(raw.getvalue())
    from sglang_rq.doctor import unpack

    assert unpack(path, site=tmp_path / "site") == 2
    assert (tmp_path / "site" / "pkg_x" / "__init__.py").read_bytes() == b"V = 1\n"
    r = _run_doctor("--unpack", str(path))
    assert r.returncode == 2 and "--site" in r.stderr  # --unpack without --site is refused


@pytest.mark.skipif(os.environ.get("SGLANG_RQ_TEST_BUNDLE") != "1",
                    reason="builds the real bundle from PyPI; set SGLANG_RQ_TEST_BUNDLE=1")
def test_real_bundle(tmp_path):
    m = bundle.build(tmp_path, python="3.12", platforms=bundle.DEFAULT_PLATFORMS,
                     host_freeze=None, with_model=False)
    assert m["tar_xz_bytes"] <= 20_000_000
    names = {d["name"] for d in m["distributions"]}
    assert {"sglang", "sglang-rq", "xgrammar"} <= names
    assert not any(bundle.EXCLUDED.match(n) for n in names)
    with tarfile.open(tmp_path / m["bundle"], "r:xz") as tar:
        members = tar.getnames()
    assert "sglang_rq-0.1.0.dist-info/entry_points.txt" in members
    assert not any(n.startswith(("sglang/multimodal_gen", "sglang_rq/assets/")) for n in members)
    assert not any(n.split("/", 1)[0].endswith(".data") for n in members)


def test_doctor_site_must_hold_sglang_and_the_plugin(tmp_path):
    """A new-user review (12-06): ``doctor --site`` of an empty directory passed every check,
    the environment's own packages answering for the site."""
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run_doctor("--site", str(empty))
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.split()[1:2] == ["site"])
    assert line.startswith("FAIL") and f"{empty.resolve()} lacks sglang (" in line, line
    assert "sglang_rq (" in line and "serving cannot work" in r.stdout
