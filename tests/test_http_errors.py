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


def _echo_app(calls: list) -> fastapi.FastAPI:
    """An endpoint that reads its whole body, behind CORS as SGLang's app is."""
    from starlette.middleware.cors import CORSMiddleware

    app = fastapi.FastAPI()
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"])

    @app.post("/generate")
    async def generate(request: fastapi.Request) -> dict:
        calls.append(1)
        return {"bytes": len(await request.body())}

    http_errors.install_body_limit(app, 1000)
    return app


@pytest.mark.parametrize("chunked", [False, True])
def test_body_limit_refuses_a_larger_body_before_the_endpoint_and_passes_one_within(chunked):
    """A new-user review (12-05): a 30 MB prompt held the HTTP process ~30 s (SGLang tokenizes
    before its length check). Above ``--rq-max-request-bytes`` the answer is 413 and the
    endpoint never runs; at or below it, the endpoint reads the whole body."""
    calls: list = []
    client = TestClient(_echo_app(calls))

    def send(size: int):
        data = b"x" * size
        if chunked:  # a generator body goes out without Content-Length (chunked)
            return client.post("/generate", content=(data[i:i + 300] for i in range(0, size, 300)))
        return client.post("/generate", content=data)

    assert send(1000).json() == {"bytes": 1000} and send(0).json() == {"bytes": 0}
    r = send(1001)
    assert r.status_code == 413 and r.json()["code"] == 413
    assert "--rq-max-request-bytes" in r.json()["message"] and "1000 bytes" in r.json()["message"]
    if not chunked:
        assert "is 1001 bytes" in r.json()["message"]
    assert send(50_000).status_code == 413
    assert len(calls) == 2  # only the two bodies within the limit reached the endpoint


def test_body_limit_counts_the_body_whatever_content_length_says():
    """The second review: ``Content-Length: 10`` beside ``Transfer-Encoding: chunked`` let a
    12 MiB prompt through (the server frames such a body by its chunks), and the 48 s stall was
    back. Here the header claims 10 bytes and 5,000 arrive."""
    calls: list = []
    client = TestClient(_echo_app(calls))
    r = client.post("/generate", content=(b"x" * 500 for _ in range(10)),
                    headers={"Content-Length": "10"})
    assert r.status_code == 413 and "runs past" in r.json()["message"] and calls == []


def test_body_limit_answer_is_inside_cors():
    """The 413 carries SGLang's CORS headers (a browser client would otherwise see a CORS
    failure instead of the status; the second review)."""
    r = TestClient(_echo_app([])).post("/generate", content=b"x" * 2000,
                                        headers={"Origin": "http://example.com"})
    assert r.status_code == 413 and r.headers["access-control-allow-origin"] == "*"


def test_body_limit_closes_the_connection_only_when_the_body_was_not_read():
    """A third review: after a 413 answered to ``Expect: 100-continue`` the connection stayed
    open, and the client's next request was read as the refused body. Such a 413 now says
    ``Connection: close``; one whose body was read and dropped keeps the connection."""
    client = TestClient(_echo_app([]))
    r = client.post("/generate", content=b"x" * 2000,
                    headers={"Expect": "100-continue", "Content-Length": "2000"})
    assert r.status_code == 413 and r.headers.get("connection") == "close"
    r = client.post("/generate", content=b"x" * 2000)
    assert r.status_code == 413 and "connection" not in r.headers


def test_body_limit_keeps_the_connection_when_the_last_chunk_crosses_the_limit():
    """A body read whole (its last message crossed the limit) leaves nothing on the connection:
    no ``Connection: close`` (found reviewing the change: the first form of the check closed
    it). Driven as ASGI directly, since a client library splits its own chunks."""
    import asyncio

    sent: list = []

    async def receive():
        return {"type": "http.request", "body": b"x" * 2000, "more_body": False}

    async def send(message):
        sent.append(message)

    async def endpoint(scope, receive, send):
        raise AssertionError("the endpoint ran")

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": []}
    asyncio.run(http_errors.BodyLimit(endpoint, 1000)(scope, receive, send))
    assert sent[0]["status"] == 413 and b"connection" not in dict(sent[0]["headers"])


def test_body_limit_refuses_a_limit_below_one():
    with pytest.raises(ValueError, match="--rq-max-request-bytes"):
        http_errors.install_body_limit(fastapi.FastAPI(), 0)


def _chat_app(calls: list) -> fastapi.FastAPI:
    """SGLang 0.5.23's real chat request model behind a FastAPI route, as SGLang declares it."""
    protocol = pytest.importorskip("sglang.srt.entrypoints.openai.protocol")
    app = fastapi.FastAPI()

    async def chat(request, raw_request) -> dict:
        calls.append(request.messages[0].content)
        return {"ok": True}

    # the types themselves (this module's annotations are strings FastAPI cannot resolve here)
    chat.__annotations__ = {"request": protocol.ChatCompletionRequest,
                            "raw_request": fastapi.Request, "return": dict}
    app.post("/v1/chat/completions")(chat)

    @app.post("/v1/completions")
    async def completions(body: Body) -> dict:
        return {"ok": body.max_tokens}

    return app


@pytest.mark.parametrize("body,kind", [(b"[1, 2, 3]", "an array"), (b' "hi"', "a string"),
                                       (b"3", "a number"), (b"null", "null"),
                                       (b"true", "a boolean")])
def test_chat_body_that_is_not_an_object_is_a_400_not_a_500(body, kind):
    """The fuzz test's finding: SGLang 0.5.23's ``ChatCompletionRequest`` validators call
    ``values.get`` on the raw body, so a JSON array was an ``AttributeError`` and a 500."""
    calls: list = []
    js = {"content-type": "application/json"}
    bare = TestClient(_chat_app(calls), raise_server_exceptions=False)
    assert bare.post("/v1/chat/completions", content=body, headers=js).status_code == 500
    app = _chat_app(calls)
    assert http_errors.install_object_bodies(app) == {"/v1/chat/completions"}  # not the other
    client = TestClient(app)
    r = client.post("/v1/chat/completions", content=body, headers=js)
    assert r.status_code == 400 and r.json()["code"] == 400
    assert r.json()["message"] == f"the request body must be a JSON object, got {kind}"
    ok = client.post("/v1/chat/completions",
                     json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert ok.json() == {"ok": True} and calls == ["hi"]  # an object passes whole
    for path, bad in (("/v1/chat/completions", b'{"messages": ['), ("/v1/completions", b"[1]")):
        assert client.post(path, content=bad, headers=js).status_code == 422  # FastAPI's own


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("fmt,message", [
    ("json", 'response_format must be a JSON object (such as {"type": "json_object"}), got a '
             "string"),
    (5, 'response_format must be a JSON object (such as {"type": "json_object"}), got a number'),
    ([1], 'response_format must be a JSON object (such as {"type": "json_object"}), got an array'),
    ({"type": "json_schema", "schema": "a string"},
     "response_format.schema must be a JSON object (a JSON Schema), got a string"),
    ({"type": "json_schema", "schema": {"properties": 5}},
     "response_format.schema.properties must be a JSON object, got a number"),
    ({"type": "json_schema", "schema": {"properties": "nostrict"}},
     "response_format.schema.properties must be a JSON object, got a string"),
    ({"type": "json_schema", "schema": {"properties": {"strict": True}}},
     "response_format.schema.properties.strict must be a JSON object (a JSON Schema), got a "
     "boolean"),
])
def test_chat_response_format_that_is_not_an_object_is_a_400_not_a_500(fmt, message):
    """A new-user review (12-06): SGLang 0.5.23's ``set_json_schema`` validator calls ``.get`` on
    ``response_format`` and on the ``schema`` of its shorthand ``{"type": "json_schema",
    "schema": ...}``, so a string or number there was an ``AttributeError`` and a 500."""
    calls: list = []
    body = {"model": "m", "messages": MSG, "response_format": fmt}
    bare = TestClient(_chat_app(calls), raise_server_exceptions=False)
    assert bare.post("/v1/chat/completions", json=body).status_code == 500
    app = _chat_app(calls)
    http_errors.install_object_bodies(app)
    client = TestClient(app)
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["message"] == message
    assert client.post("/v1/chat/completions", json={"model": "m", "messages": MSG}).json() == \
        {"ok": True} and calls == ["hi"]


@pytest.mark.parametrize("fmt", [
    None, "", 0, {"type": "json_object"}, {"type": "text"},
    {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
    {"type": "json_schema", "schema": {"properties": {"strict": {"default": True}}}},
    {"type": "json_schema", "schema": {"properties": {"strict": 0}}},
    # the full form: the request model itself refuses a schema that is not an object (its 400)
    {"type": "json_schema", "json_schema": {"name": "x", "schema": "a string"}},
])
def test_chat_response_formats_the_validator_reads_pass_to_sglang(fmt):
    """Everything `http_errors.response_format_error` does not refuse reaches SGLang's request
    model unchanged: accepted (the endpoint runs), or its own validation error (422 here)."""
    calls: list = []
    app = _chat_app(calls)
    http_errors.install_object_bodies(app)
    body = {"model": "m", "messages": MSG, "response_format": fmt}
    bare = TestClient(_chat_app([])).post("/v1/chat/completions", json=body)
    r = TestClient(app).post("/v1/chat/completions", json=body)
    assert r.status_code == bare.status_code and r.status_code in (200, 422), r.text
    assert calls == (["hi"] if r.status_code == 200 else [])


def test_chat_body_nested_past_the_parser_passes_to_fastapi():
    """A body nested deeper than Python's JSON parser goes (``RecursionError``, not a
    ``ValueError``) reaches FastAPI, which answers its own 400, as without the middleware."""
    app = _chat_app([])
    http_errors.install_object_bodies(app)
    for body in (b"[" * 100_000, b'{"messages": ' + b"[" * 100_000):
        r = TestClient(app).post("/v1/chat/completions", content=body,
                                 headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json() == {"detail": "There was an error parsing the body"}


def test_object_body_check_refuses_a_started_app():
    app = _chat_app([])
    TestClient(app).post("/v1/completions", json={"prompt": "x"})  # builds the middleware stack
    with pytest.raises(RuntimeError, match="before the HTTP app starts"):
        http_errors.install_object_bodies(app)


def test_cpu_refusals_answer_400_on_memory_occupation_routes_and_pass_others():
    """On the CPU engine, SGLang 0.5.23's ``/release_memory_occupation`` synchronized a CUDA
    device in the scheduler and every process exited (a new-user review, 12-06): with
    `install_cpu_refusals` a POST there (and to ``/resume_memory_occupation``) is a 400 naming
    the route, never reaching the endpoint; other routes and other methods pass."""
    calls: list[int] = []
    app = _echo_app(calls)
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        app.post(path)(lambda: calls.append(2))
    http_errors.install_cpu_refusals(app)
    client = TestClient(app)
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        r = client.post(path, json={})
        assert r.status_code == 400
        assert r.json()["message"] == f"{path} is not supported on the CPU engine (it needs a CUDA device)"
    assert calls == []  # refused before the endpoints
    assert client.post("/generate", content=b"hello").json() == {"bytes": 5} and calls == [1]
    with pytest.raises(RuntimeError, match="before the HTTP app starts"):
        http_errors.install_cpu_refusals(app)
