"""LAB STAND-IN for `python -m sglang.launch_server`: parses, checks, logs and serves like SGLang 0.5.23.

NOT the real engine: it loads no model and uses no GPU. What it does, in the real server's order:
1. parses argv with the parser rebuilt from the real wheel's flag table (exit 2 + argparse's
   message for unknown, removed or ambiguous flags);
2. reads the target's config.json and applies the DFLASH start-up rules (exit 1 with the real
   ValueError / OSError as the traceback's last line);
3. logs the start-up memory lines in SGLang's formats, with figures from a simulated GPU
   (see sglang.standin.memory), registers with the lab's nvidia-smi stand-in;
4. serves the SGLang HTTP surface on --host/--port until SIGTERM (then unregisters, exit 0).

Failure injection (environment):
  SGLANG_STANDIN_START_DELAY=S     spend S seconds "loading weights" (port closed meanwhile)
  SGLANG_STANDIN_WARMUP_DELAY=S    listen, but answer /health with 503 for S seconds
  SGLANG_STANDIN_HANG=1            listen, never become ready (/health 503 forever)
  SGLANG_STANDIN_CRASH_AT_START=1  CUDA out-of-memory crash right after the weight-load line, exit 1
  SGLANG_STANDIN_FAIL_GENERATE=1   /generate and the OpenAI routes answer 500
  SGLANG_STANDIN_GPU_MEMORY_MIB=N  simulated memory per GPU (default: lab GPU profile, else 97887)
  SGLANG_STANDIN_STEP_MS=MS        decode time of one forward step (verify step or token; default 2)
  SGLANG_STANDIN_SLOWDOWN=F        every step F times slower (a throughput regression)
  SGLANG_STANDIN_ACCEPT_COLLAPSE=1 acceptance length 1.0 while two or more requests run
  SGLANG_STANDIN_CRASH_UNDER_LOAD=N  an illegal memory access, exit 1, once N requests run at once
"""

from __future__ import annotations

import os
import signal
import ssl
import sys
import threading
import time
import traceback
import warnings
from typing import Any

from sglang.standin import flags, gpus, memory, rules, server
from sglang.standin import metrics as standin_metrics
from sglang.version import __version__

LOCK = threading.Lock()


def release_of(version: str) -> str:
    """The flag table the stand-in parses with: '0.5.23+lab' -> '0.5.23'; the DDTree variant '0.5.23+ddtree.lab'
    -> '0.5.23+ddtree' (the table of SGLang 0.5.23 with PR #29907, dflash_infra/data/sglang/0.5.23+ddtree.json)."""
    release, _, local = version.partition("+")
    build = local.split(".")[0]
    return f"{release}+{build}" if build and build != "lab" else release


def log(message: str, prefix: str = "") -> None:
    """One line in SGLang's format: `[YYYY-mm-dd HH:MM:SS<prefix>] message` on stderr."""
    with LOCK:
        sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {message}\n")
        sys.stderr.flush()


def _flag(env: dict[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _seconds(env: dict[str, str], name: str) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise SystemExit(f"{name}: expected a number of seconds, found {raw!r}") from None


def rank_prefixes(tp: int, dp: int) -> list[str]:
    """Log prefixes of the scheduler processes (scheduler.py): ' DP<d>' when dp > 1, ' TP<t>' when tp > 1."""
    return [(f" DP{d}" if dp > 1 else "") + (f" TP{t}" if tp > 1 else "") for d in range(dp) for t in range(tp)]


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError so the traceback's last line reads like PyTorch's."""


OutOfMemoryError.__module__ = "torch"


def oom_traceback(total_gib: float, used_gib: float, ask_gib: float) -> str:
    """A real traceback text ending in PyTorch's CUDA out-of-memory message."""
    free_mib = max(0.0, (total_gib - used_gib) * 1024)
    message = (
        f"CUDA out of memory. Tried to allocate {ask_gib:.2f} GiB. GPU 0 has a total capacity of "
        f"{total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this "
        f"process has {used_gib:.2f} GiB memory in use. Of the allocated memory {used_gib - 0.52:.2f} GiB "
        "is allocated by PyTorch, and 18.00 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    try:
        raise OutOfMemoryError(message)
    except OutOfMemoryError:
        return traceback.format_exc()


def crash(prefix: str, scheduler_traceback: str) -> int:
    """A scheduler dying at start-up, as SGLang logs it: the scheduler's traceback, then the launcher."""
    log("Scheduler hit an exception: " + scheduler_traceback, prefix)
    log("Received sigquit from a child process. It usually means the child failed.")
    return 1


def crash_under_load(running: int) -> None:
    """The scheduler dying of an illegal memory access under concurrent load (z-lab/dflash#146), as SGLang logs it,
    and the process exiting 1 at once (systemd's Restart= brings it back)."""
    log("Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2871, in '
        "run_scheduler_process\n    scheduler.event_loop_overlap()\n"
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        f"(lab stand-in: SGLANG_STANDIN_CRASH_UNDER_LOAD with {running} requests running)", " TP0")
    log("Received sigquit from a child process. It usually means the child failed.")
    os._exit(1)


def capture_batch_sizes(max_bs: int) -> list[int]:
    """Decode CUDA-graph batch sizes captured up to max_bs."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 513, 16)]
    return [s for s in sizes if s <= max_bs] or [1]


def memory_inputs(args: dict[str, Any], resolved: rules.Resolved, setup: gpus.GpuSetup) -> memory.Inputs:
    return memory.Inputs(
        gpu_mib=setup.memory_total_mib,
        gpu_used_mib=setup.memory_used_mib,
        tp=resolved.tp_size,
        mem_fraction_static=args.get("mem_fraction_static"),
        target_config=resolved.target_config,
        draft_config=resolved.draft_config,
        num_draft_tokens=verify_width(resolved),
        max_running_requests=resolved.max_running_requests,
        mamba_full_memory_ratio=float(args.get("mamba_full_memory_ratio") or 0.9),
        mamba_ssm_dtype=args.get("mamba_ssm_dtype"),
        kv_cache_dtype=args.get("kv_cache_dtype"),
        chunked_prefill_size=args.get("chunked_prefill_size"),
        cuda_graph_max_bs=args.get("cuda_graph_max_bs_decode"),
    )


def verify_width(resolved: rules.Resolved) -> int:
    """Tokens verified per running request and step: the block (DFLASH), the tree budget + 1 (DDTREE, PR #29907:
    it sizes the speculative scratch and the verify CUDA graphs)."""
    if resolved.tree_budget is not None:
        return resolved.tree_budget + 1
    return resolved.num_draft_tokens or 0


def architecture(config: dict[str, Any] | None) -> str:
    return str(((config or {}).get("architectures") or ["UnknownModel"])[0])


def startup_lines(s: memory.Startup, resolved: rules.Resolved, args: dict[str, Any]) -> list[tuple[str, str]]:
    """(phase, message) lines one scheduler logs after its weights are loaded, in SGLang's formats."""
    lines: list[tuple[str, str]] = []
    if s.hybrid:
        text = (f"Mamba Cache is allocated. max_mamba_cache_size: {s.mamba_slots}, "
                f"conv_state size: {s.conv_state:.2f}GB, ssm_state size: {s.ssm_state:.2f}GB ")
        if resolved.draft_config:
            text += (f"intermediate_ssm_state_cache size: {s.intermediate_ssm:.2f}GB "
                     f"intermediate_conv_window_cache size: {s.intermediate_conv:.2f}GB ")
        lines.append(("pool", text))
    lines.append(("pool", f"KV Cache is allocated. dtype: {s.kv_dtype}, #tokens: {s.kv_tokens}, "
                          f"K size: {s.k_size:.2f} GB, V size: {s.v_size:.2f} GB"))
    lines.append(("pool", f"Memory pool end. avail mem={s.after_target_pool:.2f} GB"))
    if resolved.draft_config:
        lines.append(("pool", f"KV Cache is allocated. dtype: {s.kv_dtype}, #tokens: {s.kv_tokens}, "
                              f"K size: {s.draft_k_size:.2f} GB, V size: {s.draft_v_size:.2f} GB"))
        lines.append(("pool", f"Memory pool end. avail mem={s.after_draft_pool:.2f} GB"))
    verify = resolved.algorithm is not None
    name = "target verify" if verify else "target decode"
    per_req = verify_width(resolved) if verify and resolved.num_draft_tokens else 1
    max_bs = min(s.cuda_graph_max_bs, s.max_running_requests)
    lines.append(("graph", f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                           f"avail mem={s.after_draft_pool:.2f} GB"))
    lines.append(("graph", f"Capture {name} CUDA graph end. bs={capture_batch_sizes(max_bs)}, elapsed=1.53 s, "
                           f"mem usage={s.graph_usage:.2f} GB, avail mem={s.after_graphs:.2f} GB."))
    lines.append(("rank0", f"max_total_num_tokens={s.kv_tokens}, chunked_prefill_size={s.chunked_prefill_size}, "
                           f"max_prefill_tokens={args.get('max_prefill_tokens') or 16384}, "
                           f"max_running_requests={s.max_running_requests}, context_len={resolved.context_length}, "
                           f"available_gpu_mem={s.after_graphs:.2f} GB"))
    return lines


def server_info(args: dict[str, Any], resolved: rules.Resolved, s: memory.Startup) -> dict[str, Any]:
    """/server_info: the parsed args with what resolution decided, plus version and scheduler state."""
    info = {k: v for k, v in args.items()}
    info.update(
        mem_fraction_static=s.mem_fraction_static,
        chunked_prefill_size=s.chunked_prefill_size,
        cuda_graph_max_bs_decode=s.cuda_graph_max_bs,
        max_running_requests=s.max_running_requests,
        context_length=resolved.context_length,
        served_model_name=resolved.served_model_name,
    )
    if resolved.algorithm in rules.DRAFTER_ALGORITHMS:
        info.update(speculative_num_draft_tokens=resolved.num_draft_tokens, speculative_num_steps=1,
                    speculative_eagle_topk=1, speculative_draft_attention_backend=resolved.draft_attention_backend)
    info.update(startup_time=time.time(), version=__version__, frontend="python",
                internal_states=[{"max_total_num_tokens": s.kv_tokens,
                                  "max_running_requests": s.max_running_requests,
                                  "memory_usage": {"weight": round(s.target_weights + s.draft_weights, 2),
                                                   "kvcache": round(s.k_size + s.v_size + s.draft_k_size
                                                                    + s.draft_v_size, 2),
                                                   "graph": round(s.graph_usage, 2)}}])
    return info


def model_info(args: dict[str, Any], resolved: rules.Resolved) -> dict[str, Any]:
    """/model_info as http_server.model_info builds it."""
    cfg = resolved.target_config
    return {
        "model_path": resolved.model_path,
        "served_model_name": resolved.served_model_name,
        "tokenizer_path": args.get("tokenizer_path") or resolved.model_path,
        "is_generation": True,
        "preferred_sampling_params": args.get("preferred_sampling_params"),
        "weight_version": args.get("weight_version") or "default",
        "load_format": args.get("load_format"),
        "reasoning_parser": args.get("reasoning_parser"),
        "tool_call_parser": args.get("tool_call_parser"),
        "disaggregation_mode": args.get("disaggregation_mode"),
        "has_image_understanding": "vision_config" in cfg,
        "has_audio_understanding": False,
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
    }


def run(argv: list[str], env: dict[str, str]) -> int:
    """The whole start-up and serving sequence; returns the exit status."""
    release = release_of(__version__)
    parser = flags.build_parser(flags.load_table(release))
    if "--config" in argv:
        raise NotImplementedError("lab stand-in: --config files are not supported; pass the options on "
                                  "the command line instead")
    args = vars(parser.parse_args(argv))
    t0 = time.monotonic()
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"lab stand-in: sglang {__version__} imitates SGLang {release}; it uses no GPU and infers nothing. "
        "Never use it in production.")
    log("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")

    resolved = rules.resolve(args)
    for line in resolved.warnings:
        log(line)
    setup = gpus.gpu_setup(env, resolved.tp_size * resolved.dp_size)
    if len(setup.gpus) < resolved.tp_size * resolved.dp_size:
        raise RuntimeError("CUDA error: invalid device ordinal")
    s = memory.simulate(memory_inputs(args, resolved, setup))
    prefixes = rank_prefixes(resolved.tp_size, resolved.dp_size)

    for p in prefixes:
        log(f"Load weight begin. avail mem={s.avail_begin:.2f} GB", p)
    if stop.wait(_seconds(env, "SGLANG_STANDIN_START_DELAY")):
        log("lab stand-in: stopped by a signal while loading weights")
        return 0
    total = setup.memory_total_mib / 1024
    if s.after_draft_weights < 0:  # the weights alone do not fit: the real load dies in torch
        return crash(prefixes[0], oom_traceback(total, s.avail_begin, s.target_weights + s.draft_weights))
    elapsed = time.monotonic() - t0
    for p in prefixes:
        log(f"Load weight end. elapsed={elapsed:.2f} s, type={architecture(resolved.target_config)}, "
            f"avail mem={s.after_target_weights:.2f} GB, mem usage={s.target_weights:.2f} GB.", p)
    if _flag(env, "SGLANG_STANDIN_CRASH_AT_START"):
        return crash(prefixes[0], oom_traceback(total, total - s.after_target_weights, 2.0))
    if resolved.draft_config:
        for p in prefixes:
            log(f"Load weight begin. avail mem={s.after_target_weights:.2f} GB", p)
            log(f"Load weight end. elapsed=0.41 s, type={architecture(resolved.draft_config)}, "
                f"avail mem={s.after_draft_weights:.2f} GB, mem usage={s.draft_weights:.2f} GB.", p)
    if s.kv_tokens <= 0:
        raise memory.not_enough_memory(args.get("mem_fraction_static"))
    lines = startup_lines(s, resolved, args)
    for phase in ("pool", "graph"):
        for p in prefixes:
            for kind, text in lines:
                if kind == phase:
                    log(text, p)
    log(next(text for kind, text in lines if kind == "rank0"), prefixes[0])
    return serve(args, resolved, s, setup, env, t0, stop)


def serve(args: dict[str, Any], resolved: rules.Resolved, s: memory.Startup, setup: gpus.GpuSetup,
          env: dict[str, str], t0: float, stop: threading.Event) -> int:
    """Register with nvidia-smi, listen, become ready (unless told not to), stop on SIGTERM."""
    state = server.EngineState(
        served_model_name=resolved.served_model_name, model_path=resolved.model_path,
        context_length=resolved.context_length, server_info=server_info(args, resolved, s),
        model_info=model_info(args, resolved),
        num_draft_tokens=resolved.num_draft_tokens if resolved.algorithm in rules.DRAFTER_ALGORITHMS else None,
        tree_budget=resolved.tree_budget, accelerator=setup.name,
        eos_token_id=rules.text_config(resolved.target_config).get("eos_token_id"),
        fail_generate=_flag(env, "SGLANG_STANDIN_FAIL_GENERATE"), log=log,
        api_key=args.get("api_key") or None, admin_api_key=args.get("admin_api_key") or None,
        step_s=float(env.get("SGLANG_STANDIN_STEP_MS") or 2) / 1000 * float(env.get("SGLANG_STANDIN_SLOWDOWN") or 1),
        accept_collapse=_flag(env, "SGLANG_STANDIN_ACCEPT_COLLAPSE"),
        crash_under_load=int(env.get("SGLANG_STANDIN_CRASH_UNDER_LOAD") or 0), crash=crash_under_load,
        metrics=standin_metrics.Metrics(resolved.served_model_name, s.max_running_requests, s.kv_tokens)
        if args.get("enable_metrics") else None,
    )
    host, port = str(args.get("host") or "127.0.0.1"), int(args.get("port") or 30000)
    try:
        httpd = server.make_server(host, port, state)
    except OSError as e:
        log(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ({host!r}, {port}): "
            f"{(e.strerror or str(e)).lower()}")
        return 1
    scheme = "http"
    if args.get("ssl_certfile") and args.get("ssl_keyfile"):  # as uvicorn serves with SGLang's --ssl-* (HTTPS only)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(args["ssl_certfile"]), str(args["ssl_keyfile"]))
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https"
    registration = gpus.register(env, setup.gpus, s.used_mib(setup.memory_total_mib, setup.memory_used_mib))
    thread = threading.Thread(target=httpd.serve_forever, name="http", daemon=True)
    thread.start()
    try:
        log(f"INFO:     Started server process [{os.getpid()}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        log(f"INFO:     Uvicorn running on {scheme}://{host}:{port} (Press CTRL+C to quit)")
        if _flag(env, "SGLANG_STANDIN_HANG"):
            log("lab stand-in: SGLANG_STANDIN_HANG is set; the server will never become ready")
        elif not stop.wait(_seconds(env, "SGLANG_STANDIN_WARMUP_DELAY")):
            state.ready.set()
            log("The server is fired up and ready to roll!")
            log(f"lab stand-in: ready {time.monotonic() - t0:.2f} s after start")
        while not stop.wait(1.0):
            pass
        log("INFO:     Shutting down")
        return 0
    finally:
        httpd.shutdown()
        httpd.server_close()
        gpus.unregister(registration)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m sglang.launch_server`."""
    return run(sys.argv[1:] if argv is None else list(argv), dict(os.environ))


if __name__ == "__main__":
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    sys.exit(main())
