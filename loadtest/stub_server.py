"""A stub SGLang/OpenAI streaming server with known timings, to check load-test clients against.

    python loadtest/stub_server.py --port 30000 --ttft 2.0 --gap 0.1

It serves no model: every request waits ``ttft`` seconds, streams its first chunk, then one chunk
every ``gap`` seconds, each carrying ``tokens_per_chunk`` tokens, until ``max_tokens`` tokens are
out (``eos_after`` ends a stream earlier unless the request sets ``ignore_eos``). Deadlines are
absolute (first chunk at arrival + ttft, chunk k at arrival + ttft + k * gap), so a late wake-up
does not shift the chunks after it, and every stream is a coroutine on one event loop (aiohttp), so
concurrent requests do not queue behind each other. A client that measures TTFT ~= ttft and
ITL ~= gap / tokens_per_chunk is measuring right.

Routes, shaped like SGLang 0.5.23's (``serving_completions.py``, ``serving_chat.py``,
``http_server.py``):

* ``POST /v1/completions``, ``POST /v1/chat/completions``: SSE ``data: {json}`` chunks, one per
  delta, the last with ``finish_reason``; with ``stream_options.include_usage`` a final chunk
  with ``choices: []`` and ``usage`` (``continuous_usage_stats``: cumulative ``usage`` on every
  chunk too); then ``data: [DONE]``. ``stream: false`` returns the whole
  response after the same total time.
* ``POST /generate`` (SGLang native, ``bench_serving --backend sglang``): SSE chunks with the
  *cumulative* text and ``meta_info.completion_tokens``, then ``data: [DONE]``.
* ``GET /health``, ``/health_generate``, ``/v1/models``, ``/model_info``, ``/server_info``,
  ``/get_server_info``; ``POST /flush_cache``. ``/model_info`` names ``--tokenizer-path`` so
  ``bench_serving`` can load a local tokenizer.

On start it prints ``stub listening on http://HOST:PORT`` (``--port 0`` picks a free port).
Prompt token counts in ``usage`` are whitespace word counts (or ``len(input_ids)``): the stub
loads no tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from aiohttp import web

# Each is one token in common BPE vocabularies (incl. the embedded mini-Ouro's), so a client that
# re-tokenizes the text counts the same tokens the stub reports.
_WORDS = (" the", " of", " and", " to", " in", " is", " was", " for", " on", " as")


@dataclass(frozen=True)
class StubTimings:
    """What the stub promises: the truth a client's measurements are checked against."""

    ttft_s: float = 2.0
    gap_s: float = 0.1
    tokens_per_chunk: int = 1
    default_max_tokens: int = 16
    eos_after: int | None = None
    model: str = "stub"
    tokenizer_path: str | None = None

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.gap_s < 0:
            raise ValueError(f"ttft_s and gap_s must be >= 0, got {self.ttft_s}, {self.gap_s}")
        if self.tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1, got {self.tokens_per_chunk}")
        if self.eos_after is not None and self.eos_after < 1:
            raise ValueError(f"eos_after must be >= 1 or None, got {self.eos_after}")

    def num_tokens(self, *, max_tokens: int | None, ignore_eos: bool) -> tuple[int, str]:
        """Output tokens of one request and its finish reason (``length`` or ``stop``)."""
        limit = self.default_max_tokens if max_tokens is None else max(0, int(max_tokens))
        if not ignore_eos and self.eos_after is not None and self.eos_after < limit:
            return self.eos_after, "stop"
        return limit, "length"


def _token_text(i: int) -> str:
    return _WORDS[i % len(_WORDS)]


async def _paced(timings: StubTimings, n_tokens: int) -> AsyncIterator[tuple[int, str]]:
    """Yield ``(tokens_so_far, delta_text)`` per chunk at absolute deadlines from now."""
    loop = asyncio.get_running_loop()
    t_arrival = loop.time()
    done, k = 0, 0
    while done < n_tokens:
        delay = t_arrival + timings.ttft_s + k * timings.gap_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        step = min(timings.tokens_per_chunk, n_tokens - done)
        text = "".join(_token_text(done + j) for j in range(step))
        done, k = done + step, k + 1
        yield done, text


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    if "input_ids" in body:
        return len(body["input_ids"])
    prompt = body.get("prompt", body.get("text", ""))
    if isinstance(prompt, list):  # token ids, or a batch of one
        return len(prompt) if prompt and isinstance(prompt[0], int) else len(str(prompt).split())
    return len(str(prompt).split())


def _sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


async def _open_stream(request: web.Request) -> web.StreamResponse:
    # Headers go out at once, before the first token, as SGLang's StreamingResponse does: a client
    # that stops its TTFT clock at the response headers reads ~0 here.
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _openai(request: web.Request) -> web.StreamResponse:
    """``/v1/completions`` and ``/v1/chat/completions``, streamed or not."""
    timings: StubTimings = request.app["timings"]
    body = await request.json()
    chat = request.path.endswith("/chat/completions")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    n_tokens, reason = timings.num_tokens(max_tokens=max_tokens,
                                          ignore_eos=bool(body.get("ignore_eos")))
    rid, created = uuid.uuid4().hex, int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    model = body.get("model") or timings.model
    usage = {"prompt_tokens": _prompt_tokens(body), "completion_tokens": n_tokens,
             "total_tokens": _prompt_tokens(body) + n_tokens}
    if not body.get("stream"):
        text = ""
        async for _, delta in _paced(timings, n_tokens):
            text += delta
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text})
        choice["finish_reason"] = reason
        return web.json_response({"id": rid, "object": obj, "created": created, "model": model,
                                  "choices": [choice], "usage": usage})
    resp = await _open_stream(request)
    head = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
            "model": model}
    options = body.get("stream_options") or {}

    def chunk(choice: dict[str, Any], done: int) -> bytes:
        if options.get("continuous_usage_stats"):  # cumulative counts on every chunk
            return _sse({**head, "choices": [choice], "usage": {
                "prompt_tokens": usage["prompt_tokens"], "completion_tokens": done,
                "total_tokens": usage["prompt_tokens"] + done}})
        return _sse({**head, "choices": [choice]})

    if chat:  # SGLang's first chat chunk: the role, no content
        await resp.write(chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None}, 0))
    async for done, delta in _paced(timings, n_tokens):
        choice = ({"index": 0, "delta": {"content": delta}} if chat
                  else {"index": 0, "text": delta})
        choice["finish_reason"] = reason if done == n_tokens else None
        await resp.write(chunk(choice, done))
    if options.get("include_usage"):
        await resp.write(_sse({**head, "choices": [], "usage": usage}))
    await resp.write(_sse(b"[DONE]"))
    await resp.write_eof()
    return resp


async def _generate(request: web.Request) -> web.StreamResponse:
    """SGLang's native ``/generate``: cumulative text per chunk, ``meta_info`` with counts."""
    timings: StubTimings = request.app["timings"]
    body = await request.json()
    params = body.get("sampling_params") or {}
    n_tokens, reason = timings.num_tokens(max_tokens=params.get("max_new_tokens", 128),
                                          ignore_eos=bool(params.get("ignore_eos")))
    rid, prompt_tokens = uuid.uuid4().hex, _prompt_tokens(body)

    def out(done: int, text: str) -> dict[str, Any]:
        finish = {"type": reason, "length": n_tokens} if done == n_tokens else None
        return {"text": text, "meta_info": {"id": rid, "prompt_tokens": prompt_tokens,
                                            "completion_tokens": done, "cached_tokens": 0,
                                            "finish_reason": finish}}

    if not body.get("stream"):
        text, done = "", 0
        async for done, delta in _paced(timings, n_tokens):
            text += delta
        return web.json_response(out(done, text))
    resp = await _open_stream(request)
    text = ""
    async for done, delta in _paced(timings, n_tokens):
        text += delta
        await resp.write(_sse(out(done, text)))
    await resp.write(_sse(b"[DONE]"))
    await resp.write_eof()
    return resp


def make_app(timings: StubTimings) -> web.Application:
    """The aiohttp application serving every route listed in the module docstring."""
    app = web.Application()
    app["timings"] = timings
    info = {"model_path": timings.model, "tokenizer_path": timings.tokenizer_path or timings.model,
            "is_generation": True}

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": timings.model, "object": "model", "owned_by": "sglang-rq-stub",
             "root": timings.model}]})

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response(info)

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({**info, "internal_states": [{}], "stub_timings": {
            "ttft_s": timings.ttft_s, "gap_s": timings.gap_s,
            "tokens_per_chunk": timings.tokens_per_chunk}})

    app.router.add_get("/health", ok)
    app.router.add_get("/health_generate", ok)
    app.router.add_post("/flush_cache", ok)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_post("/v1/completions", _openai)
    app.router.add_post("/v1/chat/completions", _openai)
    app.router.add_post("/generate", _generate)
    return app


async def _serve(timings: StubTimings, *, host: str, port: int) -> None:
    runner = web.AppRunner(make_app(timings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"stub listening on http://{host}:{bound}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python loadtest/stub_server.py --help``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0: a free port (printed)")
    p.add_argument("--ttft", type=float, default=2.0, help="seconds to the first chunk")
    p.add_argument("--gap", type=float, default=0.1, help="seconds between chunks")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--eos-after", type=int, default=None,
                   help="stop after this many tokens unless the request sets ignore_eos")
    p.add_argument("--model", default="stub", help="the id /v1/models reports")
    p.add_argument("--tokenizer-path", default=None, help="what /model_info reports")
    a = p.parse_args(argv)
    timings = StubTimings(ttft_s=a.ttft, gap_s=a.gap, tokens_per_chunk=a.tokens_per_chunk,
                          default_max_tokens=a.default_max_tokens, eos_after=a.eos_after,
                          model=a.model, tokenizer_path=a.tokenizer_path)
    try:
        asyncio.run(_serve(timings, host=a.host, port=a.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
