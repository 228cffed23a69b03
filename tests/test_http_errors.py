"""`sglang_rq.http_errors`: a request-validation error answered without the server's file paths.

A new-user review found SGLang 0.5.23's 400 for a mistyped field (``"max_tokens": "lots"``)
ending with the endpoint's source file and line inside the server's virtual environment, and
echoing the offending input. Here a FastAPI app stands in for SGLang's, with a handler that
answers as SGLang's does (``str(exc)``); the engine fuzz test checks the real server's bodies.
"""

from __future__ import annotations

import pytest

fastapi = pytest.importorskip("fastapi")
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from sglang_rq import http_errors  # noqa: E402


class Body(BaseModel):
    prompt: str
    max_tokens: int = 16


def _app() -> fastapi.FastAPI:
    app = fastapi.FastAPI()

    @app.post("/v1/completions")
    async def completions(body: Body) -> dict:
        return {"ok": body.max_tokens}

    async def as_sglang(request, exc):  # SGLang 0.5.23's message: str(exc) + str(exc.errors())
        return JSONResponse({"message": f"{exc} {exc.errors()}"}, status_code=400)

    as_sglang.__module__ = http_errors.SGLANG_HANDLER_MODULE  # stands in for SGLang's handler
    app.add_exception_handler(RequestValidationError, as_sglang)
    return app


def test_validation_error_keeps_the_field_and_drops_paths_and_input():
    secret = "lots-of-tokens-please"
    raw = TestClient(_app()).post("/v1/completions", json={"prompt": "hi", "max_tokens": secret})
    assert raw.status_code == 400 and 'File "' in raw.json()["message"]  # what SGLang sends
    app = _app()
    http_errors.install(app)
    r = TestClient(app).post("/v1/completions", json={"prompt": "hi", "max_tokens": secret})
    msg = r.json()["message"]
    assert r.status_code == 400
    assert "max_tokens" in msg and "valid integer" in msg
    assert 'File "' not in msg and __file__ not in msg and secret not in msg
    assert TestClient(app).post("/v1/completions", json={"prompt": "hi"}).json() == {"ok": 16}


def test_install_refuses_an_app_without_sglangs_handler():
    with pytest.raises(RuntimeError, match="not the pinned 0.5.23"):
        http_errors.install(fastapi.FastAPI())  # FastAPI's default handler only
