"""HTTP-level request refusals of the main server process: validation errors without server
internals (`install`), and a cap on the request body (`install_body_limit`).

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

import json
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


DRAIN_FACTOR = 64  # an over-limit body is read and dropped up to this many limits, then cut off


class BodyLimit:
    """ASGI middleware: answer 413 to an HTTP request whose body exceeds ``max_bytes``, before
    the endpoint parses or tokenizes any of it.

    SGLang 0.5.23 reads, parses and tokenizes a prompt in full in the HTTP process before its
    context-length check; a 30 MB prompt held every other request of the process for ~30 s and
    grew it by ~4 GB (docs/robustness.md section 3). A declared ``Content-Length`` above the
    limit is refused unread; a chunked body is buffered up to the limit and refused when it
    passes it. The refused body is read and dropped (up to `DRAIN_FACTOR` limits) so that the
    client, still sending, gets the 413 instead of a reset connection.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(receive, send, int(declared))
            return None
        if declared is not None:  # within the limit: uvicorn delivers no more than declared
            return await self.app(scope, receive, send)
        held, size = [], 0
        while True:  # no length declared (chunked): hold the body up to the limit
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(receive, send, None, more=message.get("more_body", False))
                return None
            if not message.get("more_body", False):
                break

        async def replay() -> dict:
            return held.pop(0) if held else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, receive: Any, send: Any, declared: int | None, more: bool = True):
        """Drop the rest of the body, then send the 413 (``declared``: the Content-Length, or
        None for a chunked body)."""
        read = 0
        while more and read <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            read += len(message.get("body", b""))
            more = message["type"] == "http.request" and message.get("more_body", False)
        size = f"is {declared} bytes, above" if declared is not None else "runs past"
        body = json.dumps({
            "object": "error", "type": "RequestTooLargeError", "param": None, "code": 413,
            "message": f"the request body {size} this server's limit of {self.max_bytes} bytes "
                       "(--rq-max-request-bytes)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install_body_limit(app: Any, max_bytes: int) -> None:
    """Put `BodyLimit` in front of every route of the FastAPI ``app`` (before it starts).

    Raises
    ------
    ValueError
        If ``max_bytes`` is below 1.
    RuntimeError
        If the middleware is not in the app's stack afterwards (e.g. the app already started).
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1 (--rq-max-request-bytes)")
    app.add_middleware(BodyLimit, max_bytes=max_bytes)
    if not any(m.cls is BodyLimit for m in app.user_middleware):
        raise RuntimeError("sglang-rq: the request-body limit did not apply")
