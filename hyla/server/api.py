"""The OpenAI-compatible HTTP app: `build_app(engine, served_model_name, ...)`.

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (JSON or SSE with
`stream: true`), GET /health, GET /metrics. Middleware, outermost first: per-status counts,
a 503 for requests cut by the shutdown, API key (every route but /health), body size and time
limits. Errors are OpenAI error JSON (see `errors.py`); the POST routes' statuses are listed in
the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from hyla.engine.async_engine import AsyncEngine
from hyla.multimodal.chat import chat_images
from hyla.server import convert, limits
from hyla.server.chat_output import ChatOutput
from hyla.server.documents import PATH as DOCUMENTS_PATH
from hyla.server.documents import add_document_routes
from hyla.server.errors import (
    GET_RESPONSES,
    POST_RESPONSES,
    APIError,
    install_error_handlers,
    to_api_error,
)
from hyla.server.metrics import ServerMetrics
from hyla.server.middleware import (
    APIKeyGuard,
    BodyLimit,
    ShutdownAnswer,
    StatusCounter,
    check_api_key,
)
from hyla.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ModelCard,
    ModelList,
    random_id,
)
from hyla.server.serving import (
    Batch,
    Context,
    UsageCounter,
    collect,
    sse,
    sse_events,
    start_streams,
    usage_of,
)

logger = logging.getLogger("hyla.server")

# Chats with http(s) images rendered at once (each waits on a remote host, up to
# media_fetch_timeout per image); more queue for these threads, not for the loop's default ones,
# which render every other chat and tokenize completions.
MEDIA_FETCH_THREADS = 4
ROUTES = {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics",
          DOCUMENTS_PATH}  # fmt: skip
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def build_app(
    engine: AsyncEngine,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_request_bytes: int | None = None,
    drain_timeout: float | None = 30.0,
    body_timeout: float = 30.0,
) -> FastAPI:
    """The FastAPI app serving `engine` under the name `served_model_name`.

    Args:
        engine: the AsyncEngine; started on app startup, drained and stopped on shutdown.
        served_model_name: the `model` clients must send (default: the engine's model name).
        api_key: when set, every route but `/health` requires `Authorization: Bearer
            <api_key>` (else 401); an empty key is a ValueError.
        max_request_bytes: larger request bodies get 413 (None: 8 MiB, more for a vision
            model: `limits.request_bytes_limit`).
        body_timeout: a request body not received in full within this many seconds gets 408.
        drain_timeout: on shutdown, seconds to let requests in flight finish before aborting.
    """
    metrics = ServerMetrics(engine)
    ctx = Context(engine, served_model_name or engine.model_name, metrics,
                  media_executor=_make_media_executor(engine))

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # noqa: ANN202
        engine.start()
        try:
            yield
            await engine.shutdown(drain=True, timeout=drain_timeout)
        finally:
            if ctx.media_executor is not None:
                ctx.media_executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="hyla", version="0.1.0", lifespan=lifespan)
    app.router.route_class = limits.FastJSONRoute  # before the routes are added
    app.state.ctx = ctx
    install_error_handlers(app)
    max_bytes = limits.request_bytes_limit(max_request_bytes, engine)
    app.add_middleware(BodyLimit, max_bytes=max_bytes, timeout=body_timeout)
    if api_key is not None:
        check_api_key(api_key)
        app.add_middleware(APIKeyGuard, api_key=api_key)
    app.add_middleware(ShutdownAnswer)
    app.add_middleware(StatusCounter, metrics=metrics, routes=ROUTES)
    _add_routes(app, ctx)
    add_document_routes(app, engine)  # pinned documents (issue 37)
    return app


def _add_routes(app: FastAPI, ctx: Context) -> None:
    @app.get("/health", responses={503: {"description": "draining: the server is shutting "
                                         "down", "content": {"application/json": {}}}})
    async def health() -> Response:
        if ctx.engine.is_draining:
            return JSONResponse({"status": "draining"}, 503, headers={"Retry-After": "5"})
        if hasattr(ctx.engine, "health"):  # replicas (hyla/replicas): which ones serve
            return JSONResponse(*reversed(ctx.engine.health()))
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", response_class=PlainTextResponse, responses={
        200: {"description": "Prometheus text exposition format"}, **GET_RESPONSES})
    async def metrics() -> Response:
        body, content_type = ctx.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models", response_model=ModelList, responses=GET_RESPONSES)
    async def models() -> Response:
        card = ModelCard(id=ctx.model_name, max_model_len=ctx.engine.max_model_len)
        return _json(ModelList(data=[card]))

    # Sizes are checked on the raw JSON before the body is validated (`limits.py`).
    async def completion_input(request: Request) -> None:
        data = await limits.raw_json(request)
        limits.check_completion_sizes(data, ctx.engine.max_model_len)

    async def chat_input(request: Request) -> None:
        data = await limits.raw_json(request)
        limits.check_chat_sizes(data, ctx.engine.max_model_len)

    @app.post("/v1/completions", response_model=CompletionResponse, responses=POST_RESPONSES,
              dependencies=[Depends(completion_input)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _guard(create_completion(ctx, body, request),
                            {"prompt_logprobs": "logprobs"})  # echo's logprobs

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses=POST_RESPONSES, dependencies=[Depends(chat_input)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        # the engine checks the rendered prompt; the client sent `messages`
        sent = {"prompt": "messages"}
        if body.max_completion_tokens is not None:
            sent["max_tokens"] = "max_completion_tokens"
        return await _guard(create_chat_completion(ctx, body, request), sent)


def _make_media_executor(engine: AsyncEngine) -> ThreadPoolExecutor | None:
    inner = getattr(engine, "engine", None)
    domains = getattr(getattr(inner, "config", None), "allowed_media_domains", ())
    if getattr(inner, "multimodal", None) is None or not domains:
        return None
    return ThreadPoolExecutor(MEDIA_FETCH_THREADS, thread_name_prefix="hyla-media")


def _fetches_media(req: ChatCompletionRequest) -> bool:
    """Whether rendering `req` fetches an image from a remote host."""
    return any(
        isinstance(part, dict) and part.get("type") == "image_url"
        and isinstance(part.get("image_url"), dict)
        and str(part["image_url"].get("url", ""))[:8].lower().startswith(("http:", "https:"))
        for m in req.messages if isinstance(m.content, list) for part in m.content
    )  # fmt: skip


async def _guard(coro: Any, sent: dict[str, str] | None = None) -> Response:
    """Await a route's work; any error becomes an APIError naming the field the client sent
    (`sent` maps the engine's field names to the request's)."""
    try:
        return await coro
    except Exception as e:
        err = to_api_error(e)
        field = (sent or {}).get(err.param or "")
        if field:
            detail = err.message.removeprefix(f"{err.param}: ")
            if err.param == "prompt":
                err.message = f"{field} (as rendered to the prompt): {detail}"
            else:
                err.message = f"{field}: {detail.replace(err.param, field)}"
            err.param = field
        raise err from e


def _json(model: Any) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


# -- completions ----------------------------------------------------------------------------


async def create_completion(ctx: Context, req: CompletionRequest, request: Request) -> Response:
    convert.check_model(req.model, ctx.model_name)
    prompts = convert.normalize_prompts(req.prompt)
    params = convert.completion_params(req, ctx.engine.max_model_len)
    batch = await start_streams(ctx, prompts, params, random_id("cmpl"))
    if req.stream:
        return StreamingResponse(_completion_events(ctx, req, batch), headers=SSE_HEADERS,
                                 media_type="text/event-stream")
    finals = await collect(request, batch)
    if finals is None:
        return Response(status_code=499)
    choices = [
        _completion_choice(ctx, req, i * batch.n + c.index, out, c)
        for i, out in enumerate(finals)
        for c in out.outputs
    ]
    return _json(CompletionResponse(id=batch.id, created=batch.created, model=ctx.model_name,
                                    choices=choices, usage=usage_of(finals)))


def _prompt_text(ctx: Context, output: Any) -> str:
    if output.prompt is not None:
        return output.prompt
    tok = ctx.engine.tokenizer
    return tok.decode(output.prompt_token_ids) if tok is not None else ""


def _completion_choice(ctx: Context, req: CompletionRequest, index: int, out: Any,
                       completion: Any) -> CompletionChoice:
    prefix = _prompt_text(ctx, out) if req.echo else ""
    logprobs = None
    if req.logprobs is not None:
        logprobs = _completion_logprobs(ctx, req, out, completion, 0, prefix)
    return CompletionChoice(index=index, text=prefix + completion.text, logprobs=logprobs,
                            finish_reason=completion.finish_reason,
                            stop_reason=completion.stop_reason)


def _completion_logprobs(ctx: Context, req: CompletionRequest, out: Any, completion: Any,
                         first: int, prefix: str, offset: int = 0) -> Any:
    """Logprobs of generated tokens from position `first` (plus the echoed prompt's)."""
    tok, top = ctx.engine.tokenizer, req.logprobs or 0
    ids, lps = list(completion.token_ids[first:]), list((completion.logprobs or [])[first:])
    if prefix:
        prompt_lps = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
        ids = list(out.prompt_token_ids) + ids
        lps = list(prompt_lps) + lps
    return convert.completion_logprobs(tok, ids, lps, top, offset)


async def _completion_events(ctx: Context, req: CompletionRequest, batch: Batch) -> Any:
    echoed: set[int] = set()
    usage = UsageCounter(len(batch.streams))
    offsets: dict[int, int] = {}

    def events(i: int, out: Any) -> list[str]:
        usage.observe(i, out)
        chunks = []
        for c in out.outputs:  # deltas: each token, piece of text and finish once
            index = i * batch.n + c.index
            prefix = ""
            if req.echo and index not in echoed:
                echoed.add(index)
                prefix = _prompt_text(ctx, out)
            logprobs = None
            if req.logprobs is not None:
                logprobs = _completion_logprobs(ctx, req, out, c, 0, prefix,
                                                offsets.get(index, 0))
                if logprobs.tokens:  # offsets count token strings, as in the non-stream answer
                    offsets[index] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
            choice = CompletionChoice(index=index, text=prefix + c.text, logprobs=logprobs,
                                      finish_reason=c.finish_reason, stop_reason=c.stop_reason)
            chunks.append(sse(CompletionResponse(id=batch.id, created=batch.created,
                                                 model=ctx.model_name, choices=[choice])))
        return chunks

    def finish() -> list[str]:
        if not (req.stream_options and req.stream_options.include_usage):
            return []
        return [sse(CompletionResponse(id=batch.id, created=batch.created, model=ctx.model_name,
                                       choices=[], usage=usage.usage()))]

    async for event in sse_events(batch, events, finish):
        yield event


# -- chat completions -----------------------------------------------------------------------


async def create_chat_completion(ctx: Context, req: ChatCompletionRequest,
                                 request: Request) -> Response:
    convert.check_model(req.model, ctx.model_name)
    params = convert.chat_params(req, ctx.engine.max_model_len)
    if ctx.media_executor is not None and _fetches_media(req):
        loop = asyncio.get_running_loop()
        prompt = await loop.run_in_executor(ctx.media_executor, _chat_prompt, ctx, req)
    else:  # not on the loop: a few ms for a small conversation
        prompt = await asyncio.to_thread(_chat_prompt, ctx, req)
    output = ChatOutput.for_request(req, ctx.engine, prompt)  # content, reasoning, calls
    batch = await start_streams(ctx, [prompt], params, random_id("chatcmpl"))
    if req.stream:
        return StreamingResponse(_chat_events(ctx, req, batch, output), headers=SSE_HEADERS,
                                 media_type="text/event-stream")
    finals = await collect(request, batch)
    if finals is None:
        return Response(status_code=499)
    out = finals[0]
    choices = []
    for c in out.outputs:
        message, finish_reason = output.message(c)
        choices.append(ChatChoice(index=c.index, message=message,
                                  logprobs=_chat_logprobs(ctx, req, c, 0),
                                  finish_reason=finish_reason, stop_reason=c.stop_reason))
    return _json(ChatCompletionResponse(id=batch.id, created=batch.created, model=ctx.model_name,
                                        choices=choices, usage=usage_of(finals)))


def _chat_prompt(ctx: Context, req: ChatCompletionRequest) -> Any:
    """Token ids of the rendered conversation, or a `PreparedPrompt` when it holds images
    (decoded and processed here, in a worker thread, not on the engine's)."""
    images = chat_images(getattr(ctx.engine, "engine", None), ctx.engine.tokenizer)
    prompt_ids = convert.chat_prompt_ids(ctx.engine.tokenizer, req, images)
    return prompt_ids if images is None or not images.images else images.prepare(prompt_ids)


def _chat_logprobs(ctx: Context, req: ChatCompletionRequest, completion: Any, first: int) -> Any:
    if not req.logprobs:
        return None
    ids = list(completion.token_ids[first:])
    lps = list((completion.logprobs or [])[first:])
    return convert.chat_logprobs(ctx.engine.tokenizer, ids, lps, req.top_logprobs or 0)


async def _chat_events(ctx: Context, req: ChatCompletionRequest, batch: Batch,
                       output: ChatOutput) -> Any:
    usage = UsageCounter(1)

    def chunk(choices: list[ChatChunkChoice], usage: Any = None) -> str:
        return sse(ChatCompletionChunk(id=batch.id, created=batch.created, model=ctx.model_name,
                                       choices=choices, usage=usage))

    start = [chunk([ChatChunkChoice(index=k, delta=DeltaMessage(role="assistant", content=""))
                    for k in range(batch.n)])]

    def events(i: int, out: Any) -> list[str]:
        usage.observe(i, out)
        choices = []
        for c in out.outputs:  # deltas: each token, piece of text and finish once
            delta, finish_reason = output.delta(c)
            choices.append(ChatChunkChoice(
                index=c.index, delta=delta or DeltaMessage(),
                logprobs=_chat_logprobs(ctx, req, c, 0),
                finish_reason=finish_reason, stop_reason=c.stop_reason,
            ))
        return [chunk(choices)] if choices else []

    def finish() -> list[str]:
        if not (req.stream_options and req.stream_options.include_usage):
            return []
        return [chunk([], usage.usage())]

    async for event in sse_events(batch, events, finish, start):
        yield event


__all__ = ["APIError", "build_app"]
