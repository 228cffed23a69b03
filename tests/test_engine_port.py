"""A server whose HTTP port is taken between `free_port` and the bind starts again on another
port instead of waiting out the startup timeout (real CPU server, the embedded model).

CI saw it once: ``[Errno 98] error while attempting to bind on address ('127.0.0.1', 36885)``;
SGLang 0.5.23's HTTP server does not exit when the bind fails, so the start waited 600 s and the
module's five tests errored. Here the first port handed out is held by a listening socket.
"""

from __future__ import annotations

import socket

import pytest
import requests

from sglang_rq import server_process
from sglang_rq.models.embedded import EMBEDDED_MODEL
from tests.server import Server

pytestmark = pytest.mark.engine


def test_free_port_is_below_the_ephemeral_range():
    eph = server_process._ephemeral_ports()
    if eph.start <= 20000:
        pytest.skip(f"the ephemeral range starts at {eph.start}: no ports below it to use")
    ports = {server_process.free_port() for _ in range(20)}
    assert all(20000 <= p < eph.start for p in ports), ports


def test_taken_port_restarts_on_another(tmp_path, monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    handed = [taken]
    real = server_process.free_port
    monkeypatch.setattr(server_process, "free_port", lambda: handed.pop() if handed else real())
    srv = Server(["--model-path", str(EMBEDDED_MODEL), "--max-total-tokens", "1024",
                  "--max-running-requests", "4", "--rq-no-canary"], tmp_path / "server.log")
    try:
        assert srv.port != taken
        r = requests.post(srv.url + "/generate", json={
            "input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4,
                                                          "ignore_eos": True}}, timeout=120)
        r.raise_for_status()
        assert len(r.json()["output_ids"]) == 4
    finally:
        srv.stop()
        busy.close()
