"""The `hyla` command: serve | generate | inspect | plan | validate | bench serve. Heavy modules
are imported inside the commands so `hyla --help` and startup stay fast."""

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


def _print_version(value: bool) -> None:
    if value:
        from hyla import __version__

        typer.echo(f"hyla {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print hyla's version and exit."),
) -> None:  # fmt: skip
    """Inference and serving for hybrid linear/sparse-attention language models."""


MODEL_HELP = "Checkpoint directory (Hugging Face or hyla layout). Default: the embedded model."


def _engine_specs(exclude: tuple[str, ...] = ()) -> list:
    from hyla.config import CacheConfig, EngineConfig, SchedulerConfig

    return config_options(EngineConfig, CacheConfig, SchedulerConfig, exclude=exclude)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _check_args(model: str | None, engine_options: dict[str, Any], *, needs_tokenizer: bool
                ) -> None:  # fmt: skip
    """Exit 2 before importing torch on a missing model or config.json, a rejected option, a
    tokenizer directory without tokenizer files, or a text prompt for a model without one."""
    from hyla.assets import default_model_path
    from hyla.config import ConfigError, EngineConfig
    from hyla.engine.startup import TOKENIZER_FILES

    directory = default_model_path() if model is None else Path(model)
    if not directory.exists():
        _fail(f"model: {model} does not exist")
    if not (directory / "config.json").is_file():
        _fail(f"model: {model} is not a checkpoint directory (no config.json in it)")
    try:
        EngineConfig.from_kwargs(**engine_options)
    except ConfigError as e:
        _fail(str(e))
    tokenizer = engine_options.get("tokenizer")
    if tokenizer is not None:
        if not any((Path(tokenizer) / name).is_file() for name in TOKENIZER_FILES):
            _fail(f"tokenizer: {tokenizer} holds none of {', '.join(TOKENIZER_FILES)}")
    elif needs_tokenizer and not any((directory / n).is_file() for n in TOKENIZER_FILES):
        _fail(f"model: {directory} has no tokenizer ({' or '.join(TOKENIZER_FILES)}); pass "
              "--tokenizer DIR")  # fmt: skip


def _check_config_file(path: str) -> None:
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        _fail(f"no config.json at {file}")


def _check_options(engine_options: dict[str, Any]) -> None:
    device = engine_options.get("device")
    if device is not None and device != "auto":
        import torch

        try:
            kind = torch.device(device).type
        except (RuntimeError, ValueError) as e:
            _fail(f"device: {device!r} is not a torch device ({e})")
        if kind == "cuda" and not torch.cuda.is_available():
            _fail(f"device: {device!r} needs CUDA, which this torch build or machine lacks")


def _announce(engine: Any) -> None:
    from hyla.engine.startup import apply_cpu_threads, startup_line, tokenizer_notices

    apply_cpu_threads(engine)
    typer.echo(startup_line(engine), err=True)
    for notice in tokenizer_notices(engine):
        typer.echo(f"hyla: {notice}", err=True)


def _load_engine(model: str | None, engine_options: dict[str, Any]) -> Any:
    from hyla.config import ConfigError
    from hyla.engine.llm_engine import LLMEngine

    _check_options(engine_options)
    try:
        engine = LLMEngine.from_path(model, **engine_options)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    _announce(engine)
    return engine


def _start_core_process(model: str | None, engine_options: dict[str, Any]) -> Any:
    from hyla.config import ConfigError
    from hyla.engine.async_engine import AsyncEngine
    from hyla.engine.async_stream import EngineDeadError

    _check_options(engine_options)
    try:
        return AsyncEngine.from_process(model, engine_options)
    except (ConfigError, FileNotFoundError, ValueError, EngineDeadError) as e:
        _fail(str(e))


def _has_vision(model: str | None) -> bool:
    import json

    path = Path(model) / "config.json" if model is not None else None
    if path is None or not path.is_file():
        return False
    try:
        return "vision_config" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def _start_replicas(model: str | None, options: dict[str, Any], num_replicas: int,
                    ray_address: str | None) -> Any:  # fmt: skip
    from hyla.replicas import serve_replicas

    _check_options(options)
    try:
        client = serve_replicas(model, options, num_replicas, ray_address)
    except ImportError as e:
        _fail(f"data_parallel_size: replicas run on Ray, which is not installed ({e}): pip "
              "install 'hyla[replicas]'")  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a replica failed to load (RayActorError)
        cause = str(e).strip().splitlines()[-1]  # the replica's error, after Ray's traceback
        _fail(f"data_parallel_size: {num_replicas} replicas did not start: {cause}")
    typer.echo(f"hyla: {num_replicas} replicas on Ray, device {client.replicas.info['device']}",
               err=True)  # fmt: skip
    return client


def _bind(host: str, port: int) -> Any:
    from hyla.server.launch import bind_socket

    try:
        return bind_socket(host, port)
    except OSError as e:
        _fail(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})")


def _check_api_key(api_key: str | None) -> None:
    """Exit 2 on an empty API key: click reads an empty HYLA_API_KEY as unset (auth off)."""
    import os

    env_value = os.environ.get("HYLA_API_KEY")
    from_env = env_value is not None and api_key in (None, env_value)
    value = env_value if from_env else api_key
    if value is not None and (not value.strip() or value != value.strip()):
        source = "HYLA_API_KEY" if from_env else "--api-key"
        _fail(
            f"{source}: the API key must be non-empty without surrounding whitespace (leave "
            "it unset to serve without authentication)"
        )


def _record_interrupts() -> list[int]:
    """Note SIGINTs in the returned list too: a swallowed KeyboardInterrupt must end start-up."""
    import signal

    seen: list[int] = []

    def interrupt(sig: int, frame: Any) -> None:
        seen.append(sig)
        while frame is not None:  # inside a finalizer Python would print it as a traceback
            if frame.f_code.co_name == "__del__":
                return  # and go on; the note ends the start-up after loading
            frame = frame.f_back
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    return seen


def serve(
    model: str | None = typer.Argument(None, metavar="MODEL", help=MODEL_HELP, show_default=False),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port (0: any free port)."),
    api_key: str | None = typer.Option(
        None,
        envvar="HYLA_API_KEY",
        help="Require 'Authorization: Bearer <key>' on every "
        "route but /health (/v1/*, /metrics, /docs, /openapi.json); must not be empty.",
    ),
    served_model_name: str | None = typer.Option(
        None,
        help="Model name clients send (default: the checkpoint directory's name; "
        "'default' for the embedded model).",
    ),
    max_request_bytes: int | None = typer.Option(
        None,
        min=1,
        help="Larger request bodies get 413 (default: 8 MiB; for a vision model "
        "enough for one image of --max-image-bytes as a base64 data URL, plus 1 MiB).",
    ),
    engine_core_process: bool = typer.Option(
        True,
        help="Run the engine core (scheduler and steps) in a process of its own, so "
        "HTTP, JSON and tokenization never share its GIL (vision checkpoints run it in the "
        "server process for now).",
    ),
    drain_timeout: float = typer.Option(
        30.0,
        min=0.0,
        help="On SIGTERM/SIGINT, seconds to let requests finish before ending "
        "them with finish_reason 'abort' (0: at once). A second signal exits at once.",
    ),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    disable_uvicorn_access_log: bool = typer.Option(
        False,
        "--disable-uvicorn-access-log",
        help="No access-log line per request (vLLM's "
        "flag; the line is uvicorn's, at log level info).",
    ),
    header_timeout: float = typer.Option(
        10.0,
        min=0.001,
        help="Seconds a connection may take to send a request's line and "
        "headers (from its accept, or from the first byte of its next request when kept "
        "alive); then it is answered 408 and closed.",
    ),
    body_timeout: float = typer.Option(
        30.0, min=0.001, help="Seconds a request body may take to arrive in full (else 408)."
    ),
    timeout_keep_alive: int = typer.Option(
        5, min=1, help="Seconds an idle kept-alive connection stays open."
    ),
    max_connections: int | None = typer.Option(
        None,
        min=1,
        help="Most open connections; over it, the one waiting longest for a "
        "request head is closed (default: the file-descriptor limit, raised to its hard "
        "limit, less 128).",
    ),
    data_parallel_size: int = typer.Option(
        1,
        min=1,
        help="Engine replicas behind one front end, each a Ray actor with its own "
        "devices, requests routed prefix-aware and least-loaded (vLLM's flag).",
    ),
    ray_address: str | None = typer.Option(
        None,
        help="With --data-parallel-size > 1: the Ray cluster to join (default: start a local Ray).",
    ),
    engine_options: dict | None = None,
) -> None:
    """Serve MODEL over the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models)."""
    from hyla.console import tolerate_broken_stderr

    tolerate_broken_stderr()  # an unwritable stderr must not end the server (hyla/console.py)
    options = engine_options or {}
    _check_api_key(api_key)
    _check_args(model, options, needs_tokenizer=False)
    sock = _bind(host, port)  # before loading the model, which can take minutes
    port = sock.getsockname()[1]

    interrupts = _record_interrupts()
    try:  # a Ctrl-C before the server runs (imports, loading) ends it as `generate` does
        from hyla.engine.async_engine import AsyncEngine
        from hyla.server.api import build_app
        from hyla.server.launch import make_server, run_until_signal

        if data_parallel_size > 1:
            async_engine = _start_replicas(model, options, data_parallel_size, ray_address)
        elif engine_core_process and not _has_vision(model):
            async_engine = _start_core_process(model, options)
        else:
            async_engine = AsyncEngine(_load_engine(model, options))
        name = served_model_name or async_engine.model_name
        fastapi_app = build_app(
            async_engine,
            name,
            api_key=api_key,
            max_request_bytes=max_request_bytes,
            drain_timeout=drain_timeout,
            body_timeout=body_timeout,
        )
        typer.echo(
            f"hyla: serving {name!r} (max_model_len {async_engine.max_model_len}) on "
            f"http://{host}:{port}/v1",
            err=True,
        )
        server = make_server(
            fastapi_app,
            async_engine,
            host,
            port,
            log_level,
            drain_timeout,
            access_log=not disable_uvicorn_access_log,
            header_timeout=header_timeout,
            timeout_keep_alive=timeout_keep_alive,
            max_connections=max_connections,
        )
        if interrupts:  # its KeyboardInterrupt was swallowed (e.g. by an import's C code)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        raise typer.Exit(130) from None
    run_until_signal(server, sockets=[sock])


def generate(
    args: list[str] = typer.Argument(
        ...,
        metavar="[MODEL] PROMPT",
        show_default=False,
        help="Optional checkpoint directory, then the prompt.",
    ),
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
    from hyla.request import InvalidRequestError, SamplingParams

    if len(args) > 2:
        _fail(f"expected [MODEL] PROMPT, got {len(args)} arguments (quote the prompt)")
    if len(args) == 1 and Path(args[0]).is_dir():  # not a prompt to run the default model on
        _fail(f"PROMPT: missing; {args[0]} is a directory, not a prompt (hyla generate "
              f"{args[0]} \"your prompt\")")  # fmt: skip
    model, text = (None, args[0]) if len(args) == 1 else (args[0], args[1])
    options = engine_options or {}
    _check_args(model, options, needs_tokenizer=True)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=tuple(stop),
        )
    except InvalidRequestError as e:
        _fail(str(e))
    _check_options(options)
    from hyla.engine.llm import LLM

    try:
        llm = LLM(model, **options)
        _announce(llm.engine)
        if llm.tokenizer is None:
            _fail(
                "this model has no tokenizer (no tokenizer.json or tokenizer_config.json in "
                "its directory); pass --tokenizer DIR"
            )
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
        typer.echo(
            f"[{len(out.prompt_token_ids)} prompt tokens, {len(c.token_ids)} generated, "
            f"finish_reason={c.finish_reason}]",
            err=True,
        )


def inspect(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint directory to describe."),
    gaps: bool = typer.Option(
        False,
        "--gaps",
        help="List which modules map to hyla's ops and "
        "which are missing (works for unsupported architectures too).",
    ),
    tensor_parallel_size: int = typer.Option(
        1,
        "--tensor-parallel-size",
        help="Also print the weight, cache and state bytes of one rank.",
    ),
    enable_expert_parallel: bool = typer.Option(
        False, "--enable-expert-parallel", help="Ranks hold whole experts (with TP > 1)."
    ),
    dtype: str | None = typer.Option(
        None,
        help="The dtype the cache figures are for, as "
        "`serve --dtype` (default: what serve uses here: float32 "
        "on the CPU, the checkpoint's on a GPU).",
    ),
) -> None:
    """Describe a checkpoint: family, layer pattern, cache bytes per token and per state slot."""
    _check_config_file(path)
    if gaps:
        from hyla.models.module_gaps import format_gaps, gap_report

        try:
            typer.echo(format_gaps(gap_report(path)))
        except (FileNotFoundError, ValueError) as e:
            _fail(str(e))
        return
    try:
        from hyla.models.inspect import format_report, inspect_model
    except ImportError as e:
        _fail(f"inspect is unavailable: {e}")
    try:
        report = inspect_model(path, _serve_dtype(dtype))
        typer.echo(format_report(report))
        if tensor_parallel_size > 1:
            from hyla.distributed.inspect import format_rank_report, rank_report
            from hyla.models.inspect import _bytes

            ranks = rank_report(report.config, report.weight_bytes, tensor_parallel_size,
                                enable_expert_parallel)  # fmt: skip
            typer.echo(format_rank_report(ranks, _bytes))
    except (FileNotFoundError, ValueError) as e:
        hint = " (`hyla inspect --gaps` lists what is missing)" if "unsupported" in str(e) else ""
        _fail(f"{e}{hint}")


def _serve_dtype(dtype: str | None) -> str | None:
    """The dtype `hyla serve` loads in here (unset `--dtype`: float32 without CUDA, else None)."""
    import torch

    from hyla.config import ConfigError, EngineConfig

    try:
        chosen = EngineConfig.from_kwargs(dtype=dtype).dtype
    except ConfigError as e:
        _fail(str(e))
    if chosen is None and not torch.cuda.is_available():
        return "float32"
    return chosen


def plan(
    path: str = typer.Argument(
        ...,
        metavar="MODEL_OR_CONFIG",
        help="Checkpoint directory or config.json (no weights needed).",
    ),
    gpu: str = typer.Option(
        "H200", help="GPU kind (A100, H100, H20, H200, B200, GB200, L40S, MI300X, MI325X)."
    ),
    num_gpus: int = typer.Option(8, min=1, help="GPUs to spread the model over."),
    context: int = typer.Option(131072, min=1, help="Tokens per sequence (prompt + output)."),
    concurrency: int = typer.Option(64, min=1, help="Sequences running at once."),
    dtype: str | None = typer.Option(
        None,
        help="Weight dtype: bfloat16, float16, fp8, float32 "
        "(default: the config's); a float one is the cache's too.",
    ),
    kv_cache_dtype: str | None = typer.Option(None, help="Cache dtype (default: the model's)."),
    memory_fraction: float = typer.Option(
        0.9, min=0.01, max=1.0, help="Share of each GPU's memory hyla may use."
    ),
    reserve_gib: float = typer.Option(
        2.0, min=0.0, help="GiB per GPU kept for activations and workspace."
    ),
    memory_gib: float | None = typer.Option(None, help="Override the GPU's memory (GiB)."),
    memory_bw_tbs: float | None = typer.Option(None, help="Override HBM bandwidth (TB/s)."),
    bf16_tflops: float | None = typer.Option(None, help="Override dense bf16 TFLOP/s."),
    fp8_tflops: float | None = typer.Option(None, help="Override dense fp8 TFLOP/s."),
    link_gbs: float | None = typer.Option(None, help="Override GPU-GPU GB/s per direction."),
    json_out: str | None = typer.Option(None, "--json", help="Also write the plan here."),
) -> None:
    """Plan memory, concurrency, TTFT/TPOT and parallel layouts from config.json alone."""
    _check_config_file(path)
    import json

    from hyla.plan.estimate import Workload
    from hyla.plan.gpus import GiB, gpu_spec
    from hyla.plan.planner import plan as make_plan
    from hyla.plan.report import format_plan, plan_to_json

    def scaled(value: float | None, scale: float) -> float | None:
        return None if value is None else value * scale

    try:
        spec = gpu_spec(gpu).replace(
            memory=None if memory_gib is None else int(memory_gib * GiB),
            memory_bw=scaled(memory_bw_tbs, 1e12),
            bf16_flops=scaled(bf16_tflops, 1e12),
            fp8_flops=scaled(fp8_tflops, 1e12),
            link_bw=scaled(link_gbs, 1e9),
        )
        from hyla.models.loader import load_config

        config = load_config(path)
        work = Workload(
            num_gpus=num_gpus,
            context=context,
            concurrency=concurrency,
            weight_dtype=dtype or config.dtype,
            memory_fraction=memory_fraction,
            reserve_bytes=int(reserve_gib * GiB),
        )
        report = make_plan(path, spec, work, kv_cache_dtype=kv_cache_dtype)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    typer.echo(format_plan(report))
    if json_out:
        Path(json_out).write_text(json.dumps(plan_to_json(report), indent=1) + "\n")
        typer.echo(f"wrote {json_out}", err=True)


def validate(
    model: str | None = typer.Argument(None, metavar="MODEL", help=MODEL_HELP, show_default=False),
    out: str = typer.Option(
        "validate-report",
        help="Report directory (report.md, report.html, summary.json, PNG plots).",
    ),
    checks: str = typer.Option(
        "precision,long_context,throughput,service,vision", help="Comma-separated checks to run."
    ),
    quick: bool = typer.Option(False, "--quick", help="Small samples and grids (CI)."),
    reference: str | None = typer.Option(
        None, help="Checkpoint the reference loads (default: MODEL)."
    ),
    url: str | None = typer.Option(None, help="A running deployment for the service checks."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto."),
    dtype: str | None = typer.Option(
        None,
        help="float32, bfloat16 or float16 (default: float32 "
        "on the CPU, the checkpoint's dtype on a GPU).",
    ),
    engine_options: dict | None = None,
) -> None:
    """Run the acceptance checklist on MODEL; exit 0 only when every check passes its bound.
    Takes `hyla serve`'s engine options (--max-model-len, --kv-cache-memory, ...)."""
    names = tuple(c.strip() for c in checks.split(",") if c.strip())
    options = engine_options or {}
    _check_validate_args(model, names, options)
    import torch

    from hyla.engine.loading import DEFAULT_MODEL_DIR
    from hyla.models.loader import load_config
    from hyla.validate.runner import Context, run_validate

    path = Path(model) if model else DEFAULT_MODEL_DIR
    try:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = dtype or ("float32" if device == "cpu" else load_config(path).dtype)
        ctx = Context(
            model=path,
            reference=Path(reference) if reference else path,
            out_dir=Path(out),
            device=device,
            dtype=dtype,
            quick=quick,
            url=url,
            engine_options=options,
        )
        _, results = run_validate(ctx, names)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    for r in results:
        typer.echo(
            f"{r.status:>7}  {r.title}"
            + "".join(f"\n         {f}" for f in r.failures)
            + "".join(f"\n         note: {n}" for n in r.notes)
        )
    typer.echo(f"report: {out}/report.md, {out}/report.html, {out}/summary.json", err=True)
    if not all(r.passed for r in results):
        raise typer.Exit(1)


def _check_validate_args(model: str | None, names: tuple[str, ...], options: dict[str, Any]
                         ) -> None:  # fmt: skip
    import importlib.util

    from hyla.validate.runner import CHECK_NAMES

    unknown = [c for c in names if c not in CHECK_NAMES]
    if unknown:
        _fail(f"checks: unknown {unknown}; choose from {', '.join(CHECK_NAMES)}")
    _check_args(model, options, needs_tokenizer=False)
    plotted = [c for c in names if c in ("precision", "long_context", "throughput")]
    if plotted and importlib.util.find_spec("matplotlib") is None:
        hint = "pip install 'hyla[validate]' (from a checkout: pip install -e '.[validate]')"
        _fail(f"checks {', '.join(plotted)} plot with matplotlib, which is not installed: {hint}")


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
    seed: int = typer.Option(0, help="Seed of the synthetic prompts and arrival times."),
    request_rate: float = typer.Option(
        float("inf"), help="Requests per second, Poisson arrivals (inf: all at once)."
    ),
    disable_tqdm: bool = typer.Option(False, "--disable-tqdm", help="No progress bar."),
    json_out: str | None = typer.Option(None, "--json", help="Also write the results here."),
) -> None:
    """Send N concurrent streaming requests; print TTFT/TPOT/ITL/E2E percentiles, throughput."""
    from hyla.bench_serve import BenchConfig, format_table, run_bench, write_json

    config = BenchConfig(
        url=url,
        model=model,
        num_requests=num_requests,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        endpoint=endpoint,
        api_key=api_key,
        seed=seed,
        request_rate=request_rate,
        progress=not disable_tqdm,
    )
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
app.command()(plan)
app.command()(add_options(validate, _engine_specs()))


def main() -> None:  # pragma: no cover - `python -m hyla.cli`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
