"""The `hyla` command: serve | generate | inspect | bench serve.

Engine, cache and scheduler options are generated from the config dataclasses
(`hyla.cli_options`); heavy modules (torch, transformers, the server) are imported inside the
commands so `hyla --help` and startup stay fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from hyla.cli_options import add_options, config_options

app = typer.Typer(
    name="hyla",
    help="Inference and serving for hybrid linear/sparse-attention language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(
    help="Benchmarks against a running server.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(bench_app, name="bench")

MODEL_HELP = "Checkpoint directory (Hugging Face or hyla layout). Default: the embedded model."


def _engine_specs(exclude: tuple[str, ...] = ()) -> list:
    from hyla.config import CacheConfig, EngineConfig, SchedulerConfig

    return config_options(EngineConfig, CacheConfig, SchedulerConfig, exclude=exclude)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _check_options(engine_options: dict[str, Any]) -> None:
    """Fail cleanly (exit 2) on a device torch cannot use or a tokenizer directory without
    tokenizer files, before loading any weights (torch and the loader would raise tracebacks
    or, for the tokenizer, silently serve without one)."""
    device = engine_options.get("device")
    if device is not None and device != "auto":
        import torch

        try:
            kind = torch.device(device).type
        except (RuntimeError, ValueError) as e:
            _fail(f"device: {device!r} is not a torch device ({e})")
        if kind == "cuda" and not torch.cuda.is_available():
            _fail(f"device: {device!r} needs CUDA, which this torch build or machine lacks")
    tokenizer = engine_options.get("tokenizer")
    if tokenizer is not None:
        from hyla.engine.llm import TOKENIZER_FILES

        directory = Path(tokenizer)
        if not any((directory / name).is_file() for name in TOKENIZER_FILES):
            _fail(f"tokenizer: {tokenizer} holds none of {', '.join(TOKENIZER_FILES)}")


def _load_engine(model: str | None, engine_options: dict[str, Any]) -> Any:
    from hyla.config import ConfigError
    from hyla.engine.llm_engine import LLMEngine

    _check_options(engine_options)
    try:
        return LLMEngine.from_path(model, **engine_options)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        _fail(str(e))


def _check_port(host: str, port: int) -> None:
    """Fail cleanly (exit 2) when `host:port` cannot be bound (in use, no such interface)."""
    from hyla.server.launch import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as e:
        _fail(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})")


def serve(
    model: str | None = typer.Argument(None, metavar="MODEL", help=MODEL_HELP,
                                       show_default=False),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port (0: any free port)."),
    api_key: str | None = typer.Option(None, envvar="HYLA_API_KEY",
                                       help="Require 'Authorization: Bearer <key>' on /v1/*."),
    served_model_name: str | None = typer.Option(
        None, help="Model name clients send (default: the checkpoint directory's name; "
        "'default' for the embedded model)."),
    max_request_bytes: int = typer.Option(8 << 20, min=1, help="Larger request bodies get 413."),
    drain_timeout: float = typer.Option(30.0, min=0.0,
                                        help="Seconds to finish requests on SIGTERM."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    engine_options: dict | None = None,
) -> None:
    """Serve MODEL over the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models)."""
    from hyla.engine.async_engine import AsyncEngine
    from hyla.server.api import build_app
    from hyla.server.launch import make_server, run_until_signal

    options = engine_options or {}
    _check_port(host, port)  # before loading the model, which can take minutes
    engine = _load_engine(model, options)
    async_engine = AsyncEngine(engine)  # timeouts and the queue bound are the engine's
    name = served_model_name or engine.model_name
    fastapi_app = build_app(async_engine, name, api_key=api_key,
                            max_request_bytes=max_request_bytes, drain_timeout=drain_timeout)
    typer.echo(f"hyla: serving {name!r} (max_model_len {engine.max_model_len}) on "
               f"http://{host}:{port}/v1", err=True)
    run_until_signal(make_server(fastapi_app, async_engine, host, port, log_level, drain_timeout))


def generate(
    args: list[str] = typer.Argument(..., metavar="[MODEL] PROMPT", show_default=False,
                                     help="Optional checkpoint directory, then the prompt."),
    max_tokens: int = typer.Option(64, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, help="Sample from the k most likely tokens (0: off)."),
    seed: int | None = typer.Option(None, help="Sampling seed."),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    engine_options: dict | None = None,
) -> None:
    """Generate from PROMPT and stream the text to the terminal."""
    from hyla.config import ConfigError
    from hyla.engine.llm import LLM
    from hyla.request import InvalidRequestError, SamplingParams

    if len(args) > 2:
        _fail(f"expected [MODEL] PROMPT, got {len(args)} arguments (quote the prompt)")
    model, text = (None, args[0]) if len(args) == 1 else (args[0], args[1])
    options = engine_options or {}
    _check_options(options)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                top_k=top_k, seed=seed, stop=tuple(stop))
        llm = LLM(model, **options)
        if llm.tokenizer is None:
            _fail("this model has no tokenizer (no tokenizer.json or tokenizer_config.json in "
                  "its directory); pass --tokenizer DIR")
        _stream_to_terminal(llm, text, params)
    except (ConfigError, InvalidRequestError, FileNotFoundError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        raise typer.Exit(130) from None


def _stream_to_terminal(llm: Any, prompt: str, params: Any) -> None:
    printed = 0
    out = None
    for out in llm.stream(prompt, params):
        text = out.outputs[0].text
        sys.stdout.write(text[printed:])
        sys.stdout.flush()
        printed = max(printed, len(text))
    sys.stdout.write("\n")
    if out is not None:
        c = out.outputs[0]
        typer.echo(f"[{len(out.prompt_token_ids)} prompt tokens, {len(c.token_ids)} generated, "
                   f"finish_reason={c.finish_reason}]", err=True)


def inspect(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint directory to describe."),
) -> None:
    """Describe a checkpoint: family, layer pattern, cache bytes per token and per state slot."""
    try:
        from hyla.models.inspect import format_report, inspect_model
    except ImportError as e:
        _fail(f"inspect is unavailable: {e}")
    try:
        typer.echo(format_report(inspect_model(path)))
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))


@bench_app.command("serve")
def bench_serve(
    url: str = typer.Option(
        "http://127.0.0.1:8000", help="Server URL, with or without the /v1 that serve prints."
    ),
    model: str | None = typer.Option(None, help="Model name (default: the server's first)."),
    num_requests: int = typer.Option(64, help="Requests to send."),
    concurrency: int = typer.Option(16, help="Requests in flight at once."),
    input_len: int = typer.Option(128, help="Prompt length in words (about tokens)."),
    output_len: int = typer.Option(64, help="Tokens to generate per request (ignore_eos)."),
    endpoint: str = typer.Option("completions", help="completions | chat"),
    api_key: str | None = typer.Option(None, envvar="HYLA_API_KEY", help="Bearer token."),
    seed: int = typer.Option(0, help="Seed of the synthetic prompts."),
    json_out: str | None = typer.Option(None, "--json", help="Also write the results here."),
) -> None:
    """Send N concurrent streaming requests; print TTFT/TPOT/ITL/E2E percentiles, throughput."""
    from hyla.bench_serve import BenchConfig, format_table, run_bench, write_json

    config = BenchConfig(url=url, model=model, num_requests=num_requests,
                         concurrency=concurrency, input_len=input_len, output_len=output_len,
                         endpoint=endpoint, api_key=api_key, seed=seed)
    try:
        result = run_bench(config)
    except (ValueError, OSError) as e:
        _fail(str(e))
    typer.echo(format_table(result))
    if json_out:
        write_json(result, json_out)
        typer.echo(f"wrote {json_out}", err=True)
    if result.num_ok == 0:
        _fail(f"all {result.num_failed} requests failed (errors above)")


app.command()(add_options(serve, _engine_specs()))
app.command()(add_options(generate, _engine_specs(exclude=("seed",))))
app.command()(inspect)


def main() -> None:  # pragma: no cover - `python -m hyla.cli`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
