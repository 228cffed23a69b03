"""`benchmarks/bench_decode.py --dry-run` (Triton interpreter, tiny sizes): every point carries
its chained timing (`benchmarks.common.chain_ms`) beside the flushed one, for the three arms."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dry_run_times_every_point_chained(tmp_path):
    r = subprocess.run([sys.executable, "benchmarks/bench_decode.py", "--dry-run", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "bench_decode.json"))
    assert len(res["points"]) == 2 and not res["skipped"]
    for row in res["points"]:
        ch = row["chain"]
        assert ch["copies"] >= 2 and ch["sdpa_copies"] >= 2  # cycling through copies, no flush
        assert ch["kernel"] in ("fma", "mma")  # the default split kernel on CPU
        for arm in (ch["read"], ch["rq"]):
            assert arm["resid_ms"] > 0 and arm["anchor_ms"] > 0
            # the per-layer-loop average: 3 residual loops and the anchor loop of 4
            assert abs(arm["avg_ms"] - (3 * arm["resid_ms"] + arm["anchor_ms"]) / 4) < 1e-12
        assert ch["sdpa_ms"] > 0
        assert abs(ch["rq"]["vs_read"] - ch["read"]["avg_ms"] / ch["rq"]["avg_ms"]) < 1e-12
