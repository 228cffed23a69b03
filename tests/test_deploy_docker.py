"""The Docker images and the compose stack, built and run for real.

Runs only with ``SGLANG_RQ_DOCKER_TESTS=1`` and a Docker engine that answers (CI has none, and a
cold build takes minutes); otherwise every test skips with the reason. Start an engine on a
machine without one with ``deploy/start_dockerd.sh``.

* ``docker/build.sh cpu prometheus`` builds the CPU image (on a local Debian base when Docker Hub
  is unreachable) and, offline only, the Debian Prometheus stand-in; ``SGLANG_RQ_DOCKER_BUILD=0``
  uses the images already there.
* One worker container, run as shipped with a read-only root filesystem and a tmpfs /tmp: it
  becomes ready (``/rq/ready``), answers a completion with exactly the requested tokens, its
  ``/metrics`` reports the bytes per token that ``sglang_rq.layout.kv_bytes_per_token`` computes
  for the embedded model, it runs as uid 10001, cannot write its root filesystem, and Docker's
  healthcheck turns healthy.
* The compose stack (``deploy/docker-compose.yml``: 2 workers, smg router, Prometheus; Grafana
  only when its image is present locally): completions through the router, Prometheus scraping
  both workers' ``sglang_rq_kv_bytes_per_token`` and the router, every alert rule loaded and
  evaluating with health ``ok``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from tests.server import free_port

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "deploy" / "docker-compose.yml"
RULES = REPO / "deploy" / "prometheus" / "rules" / "sglang-rq.rules.yml"
IMAGE = os.environ.get("SGLANG_RQ_IMAGE", "sglang-rq:cpu")
LOCAL_PROMETHEUS = "sglang-rq/prometheus:local"
HUB_PROMETHEUS = "prom/prometheus:v2.53.2"
GRAFANA = "grafana/grafana:11.2.0"
MAX_TOKENS = 8


def _engine_reason() -> str | None:
    if os.environ.get("SGLANG_RQ_DOCKER_TESTS") != "1":
        return "set SGLANG_RQ_DOCKER_TESTS=1 to build and run the Docker images (minutes)"
    if not shutil.which("docker"):
        return "no docker CLI"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine answers (deploy/start_dockerd.sh starts one)"
    return None


_reason = _engine_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")


def _docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr[-2000:]}"
    return r.stdout.strip()


def _image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _expected_bytes_per_token() -> int:
    """What the image's /metrics must say: layout's number for the embedded model, default format."""
    from sglang_rq import layout
    from sglang_rq.config import RQConfig
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    shape = layout.ModelKVShape.from_hf_config(EMBEDDED_MODEL)
    return layout.kv_bytes_per_token(shape, RQConfig())


def _sample(metrics_text: str, name: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _completion(base: str, prompt: str, timeout: float = 300) -> dict:
    # "default": a lone SGLang worker accepts any name; the router needs the served name, which
    # the compose file sets to "default" (--served-model-name).
    r = requests.post(f"{base}/v1/completions", timeout=timeout, json={
        "model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def _wait(what: str, probe, *, timeout_s: float, poll_s: float = 3, alive=None):
    """Poll ``probe()`` until it returns a truthy value; ``alive()`` may raise to stop early."""
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        if alive is not None:
            alive()
        try:
            got = probe()
            if got:
                return got
        except requests.RequestException as exc:
            last = exc
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: not within {timeout_s}s (last error: {last})")


@pytest.fixture(scope="module")
def images():
    """Build (unless SGLANG_RQ_DOCKER_BUILD=0) and return the Prometheus image compose will use."""
    if os.environ.get("SGLANG_RQ_DOCKER_BUILD", "1") != "0":
        r = subprocess.run([str(REPO / "docker" / "build.sh"), "cpu", "prometheus"], cwd=REPO,
                           capture_output=True, text=True, timeout=3600)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert _image_exists(IMAGE), f"{IMAGE} missing (docker/build.sh cpu)"
    prom = os.environ.get("PROMETHEUS_IMAGE")
    if not prom:
        prom = HUB_PROMETHEUS if (_image_exists(HUB_PROMETHEUS)
                                  or not _image_exists(LOCAL_PROMETHEUS)) else LOCAL_PROMETHEUS
    return {"prometheus": prom}


# ----------------------------------------------------------------------------- one container
@pytest.fixture(scope="module")
def worker(images):
    name = f"sglang-rq-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    _docker("run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp", "--shm-size", "1g",
            "-p", f"127.0.0.1:{port}:8000", IMAGE)
    base = f"http://127.0.0.1:{port}"

    def alive():
        state = _docker("inspect", "-f", "{{.State.Status}}", name)
        assert state == "running", f"container {state}:\n{_docker('logs', name, check=False)[-3000:]}"

    try:
        t0 = time.time()
        _wait("/rq/ready", lambda: requests.get(f"{base}/rq/ready", timeout=5).status_code == 200,
              timeout_s=900, alive=alive)
        print(f"container ready in {time.time() - t0:.0f} s")
        yield name, base
    finally:
        subprocess.run(["docker", "logs", name], capture_output=True)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_container_completion(worker):
    _, base = worker
    out = _completion(base, "Question: What is 2 + 3?\nAnswer:")
    assert out["usage"]["completion_tokens"] == MAX_TOKENS, out
    assert out["choices"][0]["text"], out
    print("completion:", json.dumps(out["choices"][0]["text"]))


def test_container_metrics_and_ready(worker):
    _, base = worker
    ready = requests.get(f"{base}/rq/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    text = requests.get(f"{base}/metrics", timeout=10).text
    assert _sample(text, "sglang_rq_kv_bytes_per_token") == _expected_bytes_per_token()
    assert _sample(text, "sglang_rq_kv_compression_ratio") > 1


def test_container_hardening(worker):
    name, _ = worker
    assert _docker("exec", name, "id", "-u") == "10001"
    assert _docker("inspect", "-f", "{{.HostConfig.ReadonlyRootfs}}", name) == "true"
    r = subprocess.run(["docker", "exec", name, "touch", "/opt/venv/x"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r
    # Docker's HEALTHCHECK (curl /health every 30 s) turns healthy once the server is up.
    _wait("docker health", lambda: _docker("inspect", "-f", "{{.State.Health.Status}}", name)
          == "healthy", timeout_s=120, poll_s=5)


# ----------------------------------------------------------------------------- compose stack
def _compose_cmd() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor `docker-compose` is installed")


@pytest.fixture(scope="module")
def stack(images, worker):
    # `worker` first: the single container is stopped before the stack starts (2 CPUs here).
    name, _ = worker
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    project = f"rqtest{uuid.uuid4().hex[:6]}"
    router_port, prom_port, grafana_port = free_port(), free_port(), free_port()
    env = dict(os.environ, SGLANG_RQ_IMAGE=IMAGE, PROMETHEUS_IMAGE=images["prometheus"],
               ROUTER_PORT=str(router_port), PROMETHEUS_PORT=str(prom_port),
               GRAFANA_PORT=str(grafana_port))
    services = ["worker-0", "worker-1", "router", "prometheus"]
    if _image_exists(os.environ.get("GRAFANA_IMAGE", GRAFANA)):
        services.append("grafana")
    cmd = _compose_cmd() + ["-p", project, "-f", str(COMPOSE)]
    try:
        t0 = time.time()
        # Blocks until both workers are healthy (/rq/ready), then starts the router.
        r = subprocess.run(cmd + ["up", "-d", "--no-build", *services], env=env,
                           capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stderr[-3000:]
        print(f"compose up ({' '.join(services)}) in {time.time() - t0:.0f} s")
        yield {"router": f"http://127.0.0.1:{router_port}",
               "prometheus": f"http://127.0.0.1:{prom_port}", "services": services,
               "ps": lambda svc: subprocess.run(cmd + ["ps", "-q", svc], env=env, capture_output=True,
                                                text=True).stdout.strip()}
    finally:
        logs = subprocess.run(cmd + ["logs", "--no-color", "--tail", "30"], env=env,
                              capture_output=True, text=True)
        print(logs.stdout[-4000:])
        subprocess.run(cmd + ["down", "-v", "--remove-orphans"], env=env, capture_output=True,
                       timeout=300)


def _prom_query(prom: str, q: str) -> list[dict]:
    r = requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


def test_stack_router_and_prometheus(stack):
    router, prom = stack["router"], stack["prometheus"]
    # The router accepts traffic once it saw the workers pass /rq/ready.
    _wait("router completion", lambda: requests.post(
        f"{router}/v1/completions", timeout=300,
        json={"model": "default", "prompt": "Hi", "max_tokens": 1}).status_code == 200,
        timeout_s=300, poll_s=5)
    prompts = [f"Question: What is {a} + {b}?\nAnswer:" for a, b in ((2, 3), (4, 1), (7, 2), (5, 5))]
    for p in prompts:
        out = _completion(router, p)
        assert out["usage"]["completion_tokens"] == MAX_TOKENS, out

    expected = _expected_bytes_per_token()

    def scraped():
        res = _prom_query(prom, "sglang_rq_kv_bytes_per_token")
        return res if len(res) == 2 else None
    series = _wait("Prometheus scrape of both workers", scraped, timeout_s=120)
    assert sorted(s["metric"]["instance"] for s in series) == ["worker-0:8000", "worker-1:8000"]
    assert all(float(s["value"][1]) == expected for s in series), series

    # Router scraped (smg_* metrics on :29000), every target up.
    up = _wait("all targets up", lambda: (lambda res: res if len(res) == 3 and all(
        s["value"][1] == "1" for s in res) else None)(_prom_query(prom, "up")), timeout_s=120)
    assert {s["metric"]["job"] for s in up} == {"sglang-rq-workers", "sglang-rq-router"}
    assert _wait("router metrics", lambda: _prom_query(prom, '{job="sglang-rq-router",__name__=~"smg_.+"}'),
                 timeout_s=60)
    # The workers counted the requests the router sent (metric relabelled back to sglang:*).
    # (the canary's own /generate requests count too, hence >=).
    total = _wait("requests counted", lambda: (lambda res: res if res and float(res[0]["value"][1])
                                               >= len(prompts) + 1 else None)(
        _prom_query(prom, "sum(sglang:num_requests_total)")), timeout_s=60)
    assert float(total[0]["value"][1]) >= len(prompts) + 1

    # Alert rules loaded and every rule evaluated healthy.
    def rules_ok():
        groups = requests.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None
    rules = _wait("alert rules evaluated", rules_ok, timeout_s=90)
    shipped = yaml.safe_load(RULES.read_text())
    assert sorted(r["name"] for r in rules) == sorted(
        r.get("alert") or r.get("record") for g in shipped["groups"] for r in g["rules"])
    # The router itself is healthy for Docker (compose's router healthcheck on :30000/health).
    assert _wait("router container healthy", lambda: _docker(
        "inspect", "-f", "{{.State.Health.Status}}", stack["ps"]("router")) == "healthy",
        timeout_s=120, poll_s=5)
