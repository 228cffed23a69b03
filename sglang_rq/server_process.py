"""Start and stop a real `sglang-rq serve` process (SGLang's HTTP server), for tests and
``sglang-rq eval``."""

from __future__ import annotations

import atexit
import errno
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from sglang_rq.env import RQ_TEST_STARTUP_TIMEOUT_S

STARTUP_TIMEOUT_S = RQ_TEST_STARTUP_TIMEOUT_S.get()  # seconds


def _ephemeral_ports() -> range:
    """The OS's ephemeral port range (Linux ``ip_local_port_range``; 32768-60999 elsewhere)."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return range(lo, hi + 1)


def free_port() -> int:
    """A port free on 127.0.0.1 now, below the ephemeral range where one exists: a port the OS
    handed out for ``bind(0)`` can be taken by any outgoing connection (or another server's
    internal sockets) before the server binds it, which CI saw as ``[Errno 98] address already
    in use`` on a port in the ephemeral range."""
    eph = _ephemeral_ports()
    candidates = list(range(20000, min(eph.start, 30000)))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_range_reason(port: int) -> str | None:
    """Why ``port`` cannot be a TCP port (None if it can be): outside 1-65535 (the resolver
    would wrap 99999 to 34463 and SGLang would listen there)."""
    return None if 1 <= port <= 65535 else f"--port={port}: must be 1-65535"


def port_in_use_reason(host: str, port: int) -> str | None:
    """Why ``sglang-rq serve`` cannot listen on ``host:port`` now (None if it can): bound the way
    uvicorn binds (``SO_REUSEADDR``, so a port in TIME_WAIT is not refused). SGLang 0.5.23 logs
    a failed bind and keeps running without an HTTP port, and a client of that port then talks
    to whatever holds it, so the launcher refuses first. A port outside 1-65535 is refused by
    number (`port_range_reason`)."""
    if (why := port_range_reason(port)) is not None:
        return why
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        return f"--host={host}: cannot resolve it ({exc})"
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"--port={port}: {host}:{port} is already in use (another server "
                        f"listening there?); stop it or pass a free --port")
            return f"--port={port}: cannot listen on {host}:{port} ({exc}); pass another --port"
    return None


# Server processes started here and not stopped yet, by pid: stopped (their whole process group)
# when this process exits or gets SIGTERM (a test run cut by `timeout`, CI cancelling a job), so
# none outlives its parent holding a port and a GPU.
_LIVE: dict[int, subprocess.Popen] = {}
_hooked = False


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM ``proc``'s process group (it leads its own session), SIGKILL after ``timeout_s``
    seconds; forget it."""
    _LIVE.pop(proc.pid, None)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def _stop_live(signum: int | None = None, _frame=None) -> None:
    for proc in list(_LIVE.values()):
        stop_group(proc, timeout_s=10.0)
    if signum is not None:  # then die of the signal as before
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def spawn_session(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kwargs)`` in a new session (its own process group),
    stopped by `stop_group`, or at this process's exit or SIGTERM (the handler is installed only
    where SIGTERM still has its default action, from the main thread)."""
    global _hooked
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
    _LIVE[proc.pid] = proc
    if not _hooked:
        _hooked = True
        atexit.register(_stop_live)
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            signal.signal(signal.SIGTERM, _stop_live)
    return proc


class PortInUse(RuntimeError):
    """The server could not bind its HTTP port (taken between `free_port` and the bind)."""


class Server:
    """A server subprocess; ``url``, ``log_path``, ``log()`` and ``stop()``. A server that finds
    its port taken is stopped and started again on another port (up to `PORT_ATTEMPTS` times):
    SGLang's HTTP server does not exit when its bind fails, so without the check the start
    would wait the whole startup timeout."""

    PORT_ATTEMPTS = 3

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        for attempt in range(self.PORT_ATTEMPTS):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._log = open(log_path, "wb")
            cmd = [sys.executable, "-m", "sglang_rq.launch_server", "--port", str(self.port),
                   *args]
            self.proc = spawn_session(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      env={**os.environ, **(env or {})})
            try:
                self._wait_ready()
                return
            except PortInUse:
                if attempt == self.PORT_ATTEMPTS - 1:
                    raise

    def _wait_ready(self) -> None:
        deadline = time.time() + STARTUP_TIMEOUT_S
        while time.time() < deadline:
            log = self.log()
            if self.proc.poll() is not None:
                if f"--port={self.port}: 127.0.0.1:{self.port} is already in use" in log:
                    raise PortInUse(log[-2000:])  # the launcher's own check
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log[-4000:]}")
            if f"while attempting to bind on address ('127.0.0.1', {self.port})" in log:
                self.stop()
                raise PortInUse(f"port {self.port} taken before the server bound it:\n"
                                f"{log[-2000:]}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200 and \
                        "fired up" in self.log():
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"server not ready in {STARTUP_TIMEOUT_S}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def server_info(self) -> dict:
        return requests.get(self.url + "/get_server_info", timeout=30).json()

    def metric(self, name: str) -> float:
        text = requests.get(self.url + "/metrics", timeout=30).text
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        if not m:
            raise KeyError(f"metric {name} not in /metrics")
        return float(m.group(1))

    def generate_ids(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuation of token-id prompts, decoded together in one batch."""
        r = requests.post(self.url + "/generate", json={
            "input_ids": prompts,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                "ignore_eos": True},
        }, timeout=600)
        r.raise_for_status()
        return [o["output_ids"] for o in r.json()]

    def generate_greedy(self, prompts: list[list[int]], max_new_tokens: int
                        ) -> tuple[list[list[int]], list[list[float]]]:
        """Greedy continuation of token-id prompts in one batch, with each generated position's
        top-1 minus top-2 log-probability (nats): the margin by which greedy chose the token."""
        r = requests.post(self.url + "/generate", json={
            "input_ids": prompts, "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                "ignore_eos": True},
        }, timeout=600)
        r.raise_for_status()
        ids, margins = [], []
        for o in r.json():
            ids.append(o["output_ids"])
            tops = o["meta_info"]["output_top_logprobs"]
            margins.append([pos[0][0] - pos[1][0] for pos in tops])
        return ids, margins

    def stop(self) -> None:
        stop_group(self.proc)
        self._log.close()
