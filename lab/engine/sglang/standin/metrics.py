"""LAB STAND-IN: SGLang 0.5.23's Prometheus `/metrics` (served only with --enable-metrics), from the stand-in's state.

Names, types and labels as SGLang exports them (read in sgl-project/sglang, python/sglang/srt/metrics/collector.py
at 00ae9c1590d2: SchedulerMetricsCollector and TokenizerMetricsCollector; the labels in
srt/managers/scheduler_metrics_mixin.py at 01bb3c807f7e, `init_metrics`: model_name, engine_type "unified",
tp_rank, pp_rank, and dp_rank only with --dp-size; and srt/managers/tokenizer_manager.py at 001067fffe33,
`init_metric_collector_watchdog`: model_name, engine_type). SGLang runs prometheus_client in multiprocess mode,
whose exposition says "Multiprocess metric" for every HELP, names a counter's family with its `_total` (text
format 0.0.4, as generate_latest writes it), has no `_created` samples and sorts labels by name;
the scheduler's gauges are `mostrecent` (no pid label). Values follow the stand-in's own state: requests running
and queued behind --max-running-requests, tokens and requests finished, and the gauges of the last decode window
(generation throughput, mean acceptance length and rate of the requests finished in it), which keep their last
value while the engine is idle, as the real gauges do (they are set only when a decode batch is logged).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

ENGINE_TYPE = "unified"  # DisaggregationMode.NULL
WINDOW_S = 10.0  # the decode window the gauges are computed over
HELP = "Multiprocess metric"
# Scheduler gauges (labels: model_name, engine_type, tp_rank, pp_rank) and tokenizer counters (model_name,
# engine_type): the names the stand-in exports, in the order it prints them.
SCHEDULER_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                    "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:max_total_num_tokens")
TOKENIZER_COUNTERS = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                      "sglang:num_aborted_requests_total")


def format_value(value: float) -> str:
    """A sample value as prometheus_client writes it (floatToGoString): 1.0, 8.128902e+06, +Inf."""
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


@dataclass
class Metrics:
    """What /metrics reports: counters since start, the last decode window's gauges, and the recent requests."""

    served_model_name: str
    max_running_requests: int
    max_total_num_tokens: int
    dp_rank: int | None = None
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    gen_throughput: float = 0.0
    spec_accept_length: float = 0.0
    spec_accept_rate: float = 0.0
    recent: deque[tuple[float, int, float | None, float | None]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finished(self, meta: dict[str, Any], now: float | None = None) -> None:
        """One request finished: its tokens counted, the window's gauges recomputed."""
        now = time.monotonic() if now is None else now
        with self.lock:
            self.prompt_tokens += int(meta.get("prompt_tokens") or 0)
            self.generation_tokens += int(meta.get("completion_tokens") or 0)
            self.requests += 1
            self.recent.append((now, int(meta.get("completion_tokens") or 0), meta.get("spec_accept_length"),
                                meta.get("spec_accept_rate")))
            while self.recent and self.recent[0][0] < now - WINDOW_S:
                self.recent.popleft()
            started = min(self.recent[0][0], now - 1.0)
            self.gen_throughput = sum(r[1] for r in self.recent) / max(now - started, 1.0)
            lengths = [float(r[2]) for r in self.recent if r[2] is not None]
            rates = [float(r[3]) for r in self.recent if r[3] is not None]
            if lengths:
                self.spec_accept_length = sum(lengths) / len(lengths)
                self.spec_accept_rate = sum(rates) / len(rates) if rates else 0.0

    def abort(self) -> None:
        with self.lock:
            self.aborted += 1

    def exposition(self, in_flight: int) -> str:
        """The text exposition format (version 0.0.4) of SGLang's metrics, as of now."""
        scheduler = {"model_name": self.served_model_name, "engine_type": ENGINE_TYPE, "tp_rank": "0",
                     "pp_rank": "0"}
        if self.dp_rank is not None:
            scheduler["dp_rank"] = str(self.dp_rank)
        tokenizer = {"model_name": self.served_model_name, "engine_type": ENGINE_TYPE}
        running = min(in_flight, self.max_running_requests)
        with self.lock:
            gauges = dict(zip(SCHEDULER_GAUGES, (running, in_flight - running, self.gen_throughput,
                                                 self.spec_accept_length, self.spec_accept_rate,
                                                 self.max_total_num_tokens), strict=True))
            counters = dict(zip(TOKENIZER_COUNTERS, (self.prompt_tokens, self.generation_tokens, self.requests,
                                                     self.aborted), strict=True))
        lines: list[str] = []
        for name, value in gauges.items():
            lines += [f"# HELP {name} {HELP}", f"# TYPE {name} gauge",
                      f"{name}{{{_labels(scheduler)}}} {format_value(value)}"]
        for name, value in counters.items():
            lines += [f"# HELP {name} {HELP}", f"# TYPE {name} counter",
                      f"{name}{{{_labels(tokenizer)}}} {format_value(value)}"]
        return "\n".join(lines) + "\n"
