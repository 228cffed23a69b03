"""`sglang_rq.launch_server.prepare_environment`: the SGLang argv the launcher builds."""

from __future__ import annotations

import os
import sys

import pytest

from sglang_rq.launch_server import prepare_environment


@pytest.fixture
def clean_env(monkeypatch):
    """prepare_environment exports the --rq-* flags and CPU settings; undo that afterwards."""
    saved_env, saved_path = dict(os.environ), list(sys.path)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    sys.path[:] = saved_path


def test_rq_triton_runs_without_cuda_graphs_unless_opted_in(clean_env):
    plain = prepare_environment(["--attention-backend", "rq_triton"])
    assert "--disable-cuda-graph" in plain
    opted = prepare_environment(["--attention-backend", "rq_triton", "--rq-cuda-graph"])
    assert "--disable-cuda-graph" not in opted and "--rq-cuda-graph" not in opted


def test_user_flags_are_kept(clean_env):
    argv = prepare_environment(["--attention-backend", "rq_native", "--max-total-tokens", "999"])
    assert argv[argv.index("--max-total-tokens") + 1] == "999"
    assert "--disable-cuda-graph" not in argv
