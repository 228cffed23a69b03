"""Test-side alias of `sglang_rq.server_process` (a real `sglang-rq serve` subprocess)."""

from sglang_rq.server_process import Server, free_port  # noqa: F401
