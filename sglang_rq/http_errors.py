"""Request-validation errors without server internals.

SGLang 0.5.23 answers a request that fails validation (a field of the wrong type, a missing one,
malformed JSON, a wrong content type) with 400 and ``str(exc)`` of FastAPI's
``RequestValidationError``, which ends with the endpoint's source file and line (a path into the
server's virtual environment) and echoes the offending input, on every route but
``/v1/messages`` (which SGLang scrubs). `install` puts a handler in front of SGLang's that hands
it the same errors without the endpoint context and without the echoed ``input`` (FastAPI
already leaves out pydantic's documentation URL): same status, same response shape, the message
names the field and the problem (docs/robustness.md section 3). Field names themselves (``loc``)
are still named. Only the main HTTP process's app is wrapped: with ``--tokenizer-worker-num`` > 1
the workers' apps answer as SGLang does.
"""

from __future__ import annotations

from typing import Any

KEPT = ("type", "loc", "msg", "ctx")  # of each pydantic error entry
SGLANG_HANDLER_MODULE = "sglang.srt.entrypoints.http_server"  # where SGLang defines its handler


def scrubbed(exc: Any) -> Any:
    """``RequestValidationError`` ``exc`` with only the `KEPT` keys of each error and no
    endpoint context (whose text holds the server's file paths)."""
    from fastapi.exceptions import RequestValidationError

    return RequestValidationError([{k: e[k] for k in KEPT if k in e} for e in exc.errors()])


def install(app: Any) -> None:
    """Wrap SGLang's ``RequestValidationError`` handler (defined in `SGLANG_HANDLER_MODULE`;
    FastAPI registers a default of its own) on its FastAPI ``app``.

    Raises
    ------
    RuntimeError
        If ``app`` has no such handler (not the pinned SGLang 0.5.23), or the wrapper did not
        take its place.
    """
    from fastapi.exceptions import RequestValidationError

    original = app.exception_handlers.get(RequestValidationError)
    if getattr(original, "__module__", None) != SGLANG_HANDLER_MODULE:
        raise RuntimeError("sglang-rq: SGLang's HTTP app has no RequestValidationError handler of "
                           f"its own ({SGLANG_HANDLER_MODULE}); this SGLang is not the pinned 0.5.23")

    async def handler(request: Any, exc: Any) -> Any:
        return await original(request, scrubbed(exc))

    app.add_exception_handler(RequestValidationError, handler)
    if app.exception_handlers.get(RequestValidationError) is not handler:
        raise RuntimeError("sglang-rq: the request-validation error handler did not apply")
