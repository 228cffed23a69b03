"""HTTP-level request refusals of the main server process: validation errors without server
internals (`install`), a cap on the request body (`install_body_limit`), and a 400 for a JSON
body, or a chat ``response_format``, that is not an object where SGLang's request model fails
on one (`install_object_bodies`),
and on the CPU engine a 400 for the routes that end it (`install_cpu_refusals`).

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

import asyncio
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
DRAIN_WAIT_S = 5.0  # ... and for no longer than this between two of its chunks


class BodyLimit:
    """ASGI middleware: answer 413 to an HTTP request whose body exceeds ``max_bytes``, before
    the endpoint parses or tokenizes any of it.

    SGLang 0.5.23 reads, parses and tokenizes a prompt in full in the HTTP process before its
    context-length check; a 30 MB prompt held every other request of the process for ~30 s and
    grew it by ~4 GB (docs/robustness.md section 3). A declared ``Content-Length`` above the
    limit is refused at once. Every other body is counted as it arrives (the header alone is
    not trusted: with ``Transfer-Encoding: chunked`` the server frames the body by its chunks)
    and held up to the limit, then handed to the app whole, or refused once it runs past.

    A refused body the client is sending anyway is read and dropped (up to `DRAIN_FACTOR`
    limits, waiting at most `DRAIN_WAIT_S` for each chunk), so that the client gets the 413
    rather than a reset connection; a client that asked ``Expect: 100-continue`` is answered
    before it sends any. A 413 sent with the body not wholly read closes the connection.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            unsent = headers.get(b"expect", b"").lower() == b"100-continue"
            return await self._refuse(receive, send, int(declared), more=not unsent,
                                      unsent=unsent)
        held, size = [], 0
        while True:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._refuse(receive, send, None, more=message.get("more_body", False))
            if not message.get("more_body", False):
                break

        return await self.app(scope, replayer(held, receive), send)

    async def _refuse(self, receive: Any, send: Any, declared: int | None, more: bool,
                      unsent: bool = False) -> None:
        """Drop the rest of the body (while ``more``), then send the 413 (``declared``: the
        Content-Length, or None when the body ran past the limit as it arrived; ``unsent``: the
        client waits for ``100 Continue`` before sending any)."""
        read = 0
        try:
            while more and read <= DRAIN_FACTOR * self.max_bytes:
                message = await asyncio.wait_for(receive(), DRAIN_WAIT_S)
                read += len(message.get("body", b""))
                more = message["type"] == "http.request" and message.get("more_body", False)
        except asyncio.TimeoutError:
            pass
        unread = unsent or more
        size = f"is {declared} bytes, above" if declared is not None else "runs past"
        await send_error(send, 413, "RequestTooLargeError",
                         f"the request body {size} this server's limit of {self.max_bytes} bytes "
                         "(--rq-max-request-bytes)",
                         close=unread)  # the rest may still come: the connection can carry no other


async def send_error(send: Any, status: int, kind: str, message: str, close: bool = False) -> None:
    """Answer an ASGI HTTP request with SGLang's error shape (``object``, ``type``, ``param``,
    ``code``, ``message``); ``close``: with ``Connection: close``."""
    body = json.dumps({"object": "error", "type": kind, "param": None, "code": status,
                       "message": message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def replayer(held: list, receive: Any) -> Any:
    """An ASGI ``receive`` that hands out the ``held`` messages first, then ``receive``'s."""
    async def replay() -> dict:
        return held.pop(0) if held else await receive()

    return replay


class ObjectBody:
    """ASGI middleware: answer 400 to a POST on one of ``paths`` whose JSON body SGLang's chat
    request model fails on outside validation (`chat_body_error`): a body that is not an object
    (an array, string, number, ``true``/``false`` or ``null``), or a ``response_format`` that
    is not one.

    SGLang 0.5.23's ``ChatCompletionRequest`` (``/v1/chat/completions``, ``/invocations``) runs
    "before" validators that call ``.get`` on raw values (the body, and in ``set_json_schema``
    ``response_format`` and its ``schema``), so such a value raised ``AttributeError`` inside
    validation and was answered 500 (docs/robustness.md sections 3 and 14). The body is parsed
    once (it is bounded by `BodyLimit`); a malformed one, or one nested deeper than the parser
    goes, passes on to SGLang's own 400.
    """

    def __init__(self, app: Any, paths: frozenset[str]) -> None:
        self.app, self.paths = app, paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        held, chunks = [], []
        while True:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            value = json.loads(b"".join(chunks))
        except (ValueError, RecursionError):  # malformed JSON or text (UnicodeDecodeError
            value = {}  # too), or nested past the parser's depth: SGLang's own 400
        why = chat_body_error(value)
        if why is not None:
            return await send_error(send, 400, "BadRequestError", why)
        return await self.app(scope, replayer(held, receive), send)


JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


def chat_body_error(value: Any) -> str | None:
    """Why SGLang 0.5.23's ``ChatCompletionRequest`` "before" validators would raise outside
    validation on the parsed JSON body ``value`` (None if they would not): it is not an object,
    or its ``response_format`` fails (`response_format_error`)."""
    if not isinstance(value, dict):
        return f"the request body must be a JSON object, got {JSON_KINDS[type(value)]}"
    return response_format_error(value.get("response_format"))


def response_format_error(fmt: Any) -> str | None:
    """Why a chat ``response_format`` ``fmt`` (parsed JSON) makes SGLang 0.5.23's
    ``set_json_schema`` validator raise outside validation, naming the field (None if it does
    not). That validator reads a truthy ``response_format`` as an object and, in its shorthand
    ``{"type": "json_schema", "schema": S}`` (no ``json_schema``), a truthy ``S`` as an object,
    ``S.properties`` (when present) as an object and a truthy ``S.properties.strict`` as an
    object. Falsy values and every other shape are left to the request model (its 400)."""
    if not fmt:
        return None
    if not isinstance(fmt, dict):
        return _not_object("response_format", fmt, ' (such as {"type": "json_object"})')
    schema = fmt.get("schema")
    if fmt.get("type") != "json_schema" or fmt.get("json_schema") or not schema:
        return None
    if not isinstance(schema, dict):
        return _not_object("response_format.schema", schema, " (a JSON Schema)")
    if "properties" not in schema:
        return None
    props = schema["properties"]
    if not isinstance(props, dict):
        return _not_object("response_format.schema.properties", props)
    strict = props.get("strict")
    if strict and not isinstance(strict, dict):
        return _not_object("response_format.schema.properties.strict", strict, " (a JSON Schema)")
    return None


def _not_object(field: str, value: Any, what: str = "") -> str:
    """The message for ``field`` holding the JSON ``value``, which is not an object."""
    return f"{field} must be a JSON object{what}, got {JSON_KINDS[type(value)]}"


# bodies that SGLang 0.5.23's chat request model fails on outside validation: a route whose body
# model fails on any of them gets `ObjectBody`
OBJECT_PROBES = ([], {"response_format": "json"})


def _fails_outside_validation(model: Any, body: Any) -> bool:
    """Whether pydantic ``model`` answers JSON ``body`` with an exception other than its
    ``ValidationError`` (which SGLang turns into a 400; any other is a 500)."""
    import pydantic

    try:
        model.model_validate(body)
    except pydantic.ValidationError:
        return False
    except Exception:  # noqa: BLE001 - exactly the ones that escape validation
        return True
    return False


def _require_unstarted(app: Any, what: str) -> None:
    """Raise RuntimeError naming ``what`` if the FastAPI ``app`` has already started (its
    middleware stack is built: middleware added now would never run)."""
    if app.middleware_stack is not None:
        raise RuntimeError(f"sglang-rq: {what} must be installed before the HTTP app starts")


def _append_middleware(app: Any, what: str, cls: type, **options: Any) -> None:
    """Append ASGI middleware ``cls(app, **options)`` innermost of the FastAPI ``app``'s
    middleware; ``what`` names it in the error.

    Raises
    ------
    RuntimeError
        If the app has already started (`_require_unstarted`).
    """
    from starlette.middleware import Middleware

    _require_unstarted(app, what)
    app.user_middleware.append(Middleware(cls, **options))


def install_object_bodies(app: Any) -> frozenset[str]:
    """Put `ObjectBody` on the FastAPI ``app``'s POST routes whose body model fails outside
    validation on one of `OBJECT_PROBES` (`_fails_outside_validation`; SGLang 0.5.23:
    ``ChatCompletionRequest``'s routes). Returns those routes' paths.

    Raises
    ------
    RuntimeError
        If the app has already started (its middleware stack is built).
    """
    import pydantic

    _require_unstarted(app, "the object-body check")  # also where no route needs it
    paths = frozenset(  # FastAPI's own reading of each route's body parameters
        route.path for route in app.routes if "POST" in getattr(route, "methods", ())
        for field in getattr(route, "dependant", None) and route.dependant.body_params or ()
        if isinstance(model := field.field_info.annotation, type)
        and issubclass(model, pydantic.BaseModel)
        and any(_fails_outside_validation(model, probe) for probe in OBJECT_PROBES))
    if paths:
        _append_middleware(app, "the object-body check", ObjectBody, paths=paths)
    return paths


class RefusedRoutes:
    """ASGI middleware: answer 400 with ``refused[path]`` to a POST on one of its paths."""

    def __init__(self, app: Any, refused: dict[str, str]) -> None:
        self.app, self.refused = app, refused

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        why = (self.refused.get(scope["path"])
               if scope["type"] == "http" and scope["method"] == "POST" else None)
        if why is None:
            return await self.app(scope, receive, send)
        await send_error(send, 400, "BadRequestError", why)


# SGLang 0.5.23's routes that end the CPU engine: the scheduler synchronizes a CUDA device
# (weight_updater: torch.get_device_module().synchronize(), "Found no NVIDIA driver") and every
# process exits (a new-user review, 12-06)
CPU_REFUSED = {path: f"{path} is not supported on the CPU engine (it needs a CUDA device)"
               for path in ("/release_memory_occupation", "/resume_memory_occupation")}


def install_cpu_refusals(app: Any) -> None:
    """Put `RefusedRoutes` with `CPU_REFUSED` on the FastAPI ``app`` (before it starts): for the
    CPU engine, where those routes killed the server.

    Raises
    ------
    RuntimeError
        If the app has already started (its middleware stack is built).
    """
    _append_middleware(app, "the CPU route refusals", RefusedRoutes, refused=CPU_REFUSED)


def install_body_limit(app: Any, max_bytes: int) -> None:
    """Put `BodyLimit` innermost of the FastAPI ``app``'s middleware (before it starts), inside
    SGLang's CORS and HTTP-metrics middleware, so a 413 carries the CORS headers and is counted
    in ``/metrics``. Under SGLang's opt-in request decompression
    (``SGLANG_ENABLE_REQUEST_DECOMPRESSION``) it limits the decompressed body, but only after
    SGLang's middleware has decompressed all of it (docs/robustness.md section 3).

    Raises
    ------
    ValueError
        If ``max_bytes`` is below 1.
    RuntimeError
        If the app has already started (its middleware stack is built).
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1 (--rq-max-request-bytes)")
    _append_middleware(app, "the request-body limit", BodyLimit, max_bytes=max_bytes)
