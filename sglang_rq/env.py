"""Typed registry of the ``SGLANG_RQ_*`` environment variables (the only place that reads them).

The launcher turns ``--rq-*`` flags into these variables so that every SGLang process
(engine, scheduler, detokenizer) sees the same configuration when the plugin loads.
`TOOLING` names the variables that only the test suite and the scripts read (documented here
so that one table, `markdown_table`, lists every ``SGLANG_RQ_*`` name; docs/structure.md holds
it and ``tests/test_structure.py`` keeps it in step).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable: ``name``, a parser from its string, and a default."""

    name: str
    parse: Callable[[str], T]
    default: T
    help: str

    def get(self) -> T:
        """The parsed value, or the default when unset or empty.

        Raises
        ------
        ValueError
            If the value does not parse; the message names the variable.
        """
        raw = os.environ.get(self.name, "")
        if raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"environment variable {self.name}={raw!r} is invalid: {exc}") from exc

    def set(self, value: T | None) -> None:
        """Set (or with None, remove) the variable for this process and its children."""
        if value is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = str(value)


def _bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected one of 1/0/true/false/yes/no/on/off")


RQ_CONFIG = EnvVar("SGLANG_RQ_CONFIG", str, "",
                   "RQConfig as JSON (set by the launcher); empty = plugin registers the models only")
RQ_KV_BUDGET_GB = EnvVar("SGLANG_RQ_KV_BUDGET_GB", float, 0.0,
                         "KV-cache byte budget in GiB (0 = SGLang's own profiling)")
RQ_STAGING_TOKENS = EnvVar("SGLANG_RQ_STAGING_TOKENS", int, 0,
                           "tokens per forward the BF16 staging buffer holds (0 = derived)")
RQ_USE_KERNELS = EnvVar("SGLANG_RQ_USE_KERNELS", _bool, True,
                        "use the kernels (Triton on CUDA, the C library on CPU); false = the "
                        "PyTorch twins for every path")
RQ_CANARY_INTERVAL_S = EnvVar("SGLANG_RQ_CANARY_INTERVAL_S", float, 30.0,
                              "seconds between readiness canary requests")
RQ_CANARY = EnvVar("SGLANG_RQ_CANARY", _bool, True,
                   "run the readiness canary in the HTTP server process (/rq/ready)")
RQ_CANARY_FILE = EnvVar("SGLANG_RQ_CANARY_FILE", str, "",
                        "canary spec JSON (default: <model-path>/canary.json, else generation-only)")
RQ_MAX_REQUEST_BYTES = EnvVar("SGLANG_RQ_MAX_REQUEST_BYTES", int, 4 << 20,
                              "largest HTTP request body the server reads, bytes (larger: 413); "
                              "the launcher sets it from --rq-max-request-bytes")
RQ_MAX_N = EnvVar("SGLANG_RQ_MAX_N", int, 128,
                  "largest n (parallel samples per prompt) a request may ask for (larger: 400); "
                  "the launcher sets it from --rq-max-n")
RQ_DATA_DIR = EnvVar("SGLANG_RQ_DATA_DIR", str, "",
                     "evaluation/calibration data directory (else shared/data next to a source checkout)")
PROMETHEUS_MULTIPROC_DIR = EnvVar("PROMETHEUS_MULTIPROC_DIR", str, "",
                                  "set by SGLang --enable-metrics; sglang-rq metrics are off without it")
RQ_TEST_STARTUP_TIMEOUT_S = EnvVar("SGLANG_RQ_TEST_STARTUP_TIMEOUT_S", float, 600.0,
                                   "seconds `server_process.Server` waits for a server to answer")


@dataclass(frozen=True)
class ToolingVar:
    """A variable read outside the package (tests, scripts, images): ``name``, ``default``,
    ``help`` and ``read_by`` (the files that read it)."""

    name: str
    default: str
    help: str
    read_by: str


TOOLING = (
    ToolingVar("SGLANG_RQ_VENV", "~/.cache/sglang-rq/venv-<hash>", "the cached virtual environment",
               "scripts/setup.sh"),
    ToolingVar("SGLANG_RQ_IMAGE", "sglang-rq:cpu", "worker/router image of the compose stack",
               "deploy/docker-compose.yml, tests/test_deploy_docker.py"),
    ToolingVar("SGLANG_RQ_EXTRA_CA", "auto", "extra CA certificates baked into images (none: skip)",
               "docker/build.sh"),
    ToolingVar("SGLANG_RQ_DOCKER_OFFLINE", "", "1: build images without Docker Hub",
               "docker/build.sh"),
    ToolingVar("SGLANG_RQ_DOCKER_TESTS", "", "1: run the Docker image tests (minutes)",
               "tests/test_deploy_docker.py"),
    ToolingVar("SGLANG_RQ_DOCKER_BUILD", "1", "0: reuse existing images in the Docker tests",
               "tests/test_deploy_docker.py"),
    ToolingVar("SGLANG_RQ_UPDATE_CAPTURE", "", "1: rewrite the recorded /metrics captures",
               "tests/test_deploy_metrics.py, tests/test_deploy_router.py"),
    ToolingVar("SGLANG_RQ_RECORD_GOLDEN", "", "1: re-record the embedded model's greedy tokens",
               "tests/test_engine_capacity.py"),
    ToolingVar("SGLANG_RQ_TEST_BUNDLE", "", "1: build the real offline bundle from PyPI",
               "tests/test_bundle_doctor.py"),
)


def registry() -> list[EnvVar]:
    """Every `EnvVar` of this module, in definition order."""
    return [v for v in globals().values() if isinstance(v, EnvVar)]


def markdown_table() -> str:
    """The table of every variable (package first, then `TOOLING`), as docs/structure.md holds it."""
    rows = ["| Variable | Type | Default | Meaning | Read by |", "|---|---|---|---|---|"]
    for v in registry():
        kind = {"_bool": "bool"}.get(v.parse.__name__, v.parse.__name__)
        rows.append(f"| `{v.name}` | {kind} | `{v.default!r}` | {_cell(v.help)} | `sglang_rq` |")
    for t in TOOLING:
        rows.append(f"| `{t.name}` | str | `{t.default!r}` | {_cell(t.help)} | {t.read_by} |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")
