"""`sglang_rq.server_process.spawn_session`: a process it started (a test's server, its whole
process group) does not outlive the process that started it, whether that one exits normally
or is sent SIGTERM (``timeout ./scripts/test.sh``, CI cancelling a job)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from sglang_rq.server_process import spawn_session
    # a "server" whose group holds a grandchild too, as SGLang's scheduler processes are
    proc = spawn_session(["sh", "-c", "sleep 300 & sleep 300"], stdout=subprocess.DEVNULL)
    print(proc.pid, flush=True)
    time.sleep(float(sys.argv[1]))
""")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_parent(sleep_s: float) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(sleep_s)], stdout=subprocess.PIPE,
                              text=True)
    pgid = int(parent.stdout.readline())
    assert _group_alive(pgid)
    return parent, pgid


def _wait_gone(pgid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)  # do not leak it from a failing test either
    return False


@pytest.mark.parametrize("how", ["exit", "sigterm"])
def test_spawned_group_is_stopped_with_its_parent(how):
    parent, pgid = _run_parent(0.5 if how == "exit" else 300)
    if how == "sigterm":
        time.sleep(0.5)
        parent.send_signal(signal.SIGTERM)
    rc = parent.wait(timeout=30)
    assert _wait_gone(pgid), f"the spawned group {pgid} outlived its parent ({how})"
    # SIGTERM still ends the parent as the signal would have (status -SIGTERM), after cleanup
    assert rc == (0 if how == "exit" else -signal.SIGTERM)
