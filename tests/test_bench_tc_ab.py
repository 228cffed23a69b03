"""`benchmarks/bench_tc_ab.py` without a GPU: the base arm's source is the kernel at the given git
revision, written next to the kernel and removed at exit; a revision git does not know fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "rq_kernels" / "csrc" / "_ab_base.cu"
SAVED_SHA = "2b9b5d68650054a708383ee0df86c24e1f6f8f652d733291dc5d62ab52469f0c"


def _run(tmp_path, rev, *extra):
    return subprocess.run([sys.executable, "benchmarks/bench_tc_ab.py", "--base", rev, "--out",
                           str(tmp_path), "--dry-run", *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_dry_run_records_the_base_revision_and_cleans_up(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    r = _run(tmp_path, "HEAD", "--l2-rows", "4096")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "bench_tc_ab.json").read_text())
    assert res["base"] == head and res["l2_rows"] == 4096
    assert res["plan"]["ouro-1.4b"][0] == [1, 8192] and set(res["plan"]) == {
        "ouro-1.4b", "huginn-d96", "smollm2-gqa"}
    assert not BASE.exists()


def test_unknown_revision_fails(tmp_path):
    r = _run(tmp_path, "no-such-revision-xyz")
    assert r.returncode != 0 and "no-such-revision-xyz" in r.stderr
    assert not BASE.exists()


def test_a_missing_base_file_fails(tmp_path):
    r = _run(tmp_path, str(tmp_path / "missing.cu"))
    assert r.returncode != 0 and "no such kernel source file" in r.stderr
    assert not BASE.exists()


def test_base_from_a_file(tmp_path):
    src = tmp_path / "saved.cu"
    src.write_text("// a saved kernel source\n")
    r = _run(tmp_path, str(src))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "bench_tc_ab.json").read_text())
    # sha256 of the bytes written above, by `sha256sum`
    assert res["base"] == f"file:{src} sha256:" + SAVED_SHA
    assert not BASE.exists()


def test_further_arms_and_points(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    r = _run(tmp_path, "HEAD", "--arm", "other=HEAD", "--chained", "--points",
             "huginn-d96:64x8192, ouro-1.4b:2x16384")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "bench_tc_ab.json").read_text())
    assert res["arms"] == {"base": head, "other": head}
    assert res["plan"] == {"huginn-d96": [[64, 8192]], "ouro-1.4b": [[2, 16384]]} and res["chained"]
    assert not (ROOT / "rq_kernels" / "csrc" / "_ab_other.cu").exists() and not BASE.exists()


def test_bad_points_and_arms_are_named(tmp_path):
    r = _run(tmp_path, "HEAD", "--points", "ouro-1.4b:2by16384")
    assert r.returncode == 2 and "'ouro-1.4b:2by16384' is not FAMILY:BxCTX" in r.stderr
    r = _run(tmp_path, "HEAD", "--arm", "base=HEAD")
    assert r.returncode == 2 and "--arm" in r.stderr
    r = _run(tmp_path, "HEAD", "--profile-arm", "nope")
    assert r.returncode == 2 and "--profile-arm nope" in r.stderr
    r = _run(tmp_path, "HEAD", "--chained", "--l2-rows", "4096")
    assert r.returncode == 2 and "--chained and --l2-rows" in r.stderr
