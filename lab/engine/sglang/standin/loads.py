"""GET /v1/loads as SGLang 0.5.23 answers it (srt/entrypoints/v1_loads.py; the per-rank LoadSnapshot of
srt/managers/load_snapshot.py and its to_dict): every core key of the snapshot, the `speculative` section when the
engine drafts (the other sections are absent, as they are on a server that does not fill them), `include` and
`dp_rank` filters, the 400 of an unknown section, and format=prometheus. The stand-in has one DP rank; its queue
is the requests it is answering now (running up to max_running_requests, the rest waiting)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# LoadSnapshot's flat fields, in its declaration order (to_dict's `core`).
CORE_KEYS = ("timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
             "num_used_tokens", "num_total_tokens", "num_active_tokens", "num_prealloc_ready_tokens",
             "max_total_num_tokens", "max_running_requests", "token_usage", "gen_throughput", "cache_hit_rate",
             "utilization", "total_prefill_uncached_tokens", "total_prefill_busy_us", "decode_moments")
VALID_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
SECTION_PREFIXES = {"speculative": "spec", "disaggregation": "disagg"}
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Queue:
    """What one rank is doing now."""

    in_flight: int
    max_running_requests: int
    max_total_num_tokens: int
    gen_throughput: float
    spec: tuple[float, float] | None  # (accept_length, accept_rate) when the engine drafts


def snapshot(queue: Queue) -> dict[str, Any]:
    running = min(queue.in_flight, queue.max_running_requests)
    core: dict[str, Any] = dict.fromkeys(CORE_KEYS, 0)
    core.update(timestamp=time.time(), num_running_reqs=running, num_waiting_reqs=queue.in_flight - running,
                max_total_num_tokens=queue.max_total_num_tokens, max_running_requests=queue.max_running_requests,
                token_usage=0.0, gen_throughput=float(queue.gen_throughput), cache_hit_rate=0.0,
                utilization=running / queue.max_running_requests if queue.max_running_requests else 0.0,
                decode_moments=None)
    sections = {} if queue.spec is None else {"speculative": {"accept_length": queue.spec[0],
                                                              "accept_rate": queue.spec[1]}}
    return {"core": core, "sections": sections}


def answer(query: dict[str, list[str]], queue: Queue, version: str, num_accelerators: int,
           accelerator: str | None) -> tuple[int, Any, str]:
    """(status, body, content type): a JSON body as a mapping, the prometheus format as text."""
    include = [s.strip() for s in query["include"][0].split(",")] if query.get("include") else None
    include_set = set(include) if include else None
    if include_set is not None and not include_set <= VALID_SECTIONS:
        return 400, {"detail": f"Invalid include sections: {include_set - VALID_SECTIONS}. "
                               f"Valid options: {sorted(VALID_SECTIONS)}"}, "application/json"
    loads = [snapshot(queue)]
    if query.get("dp_rank"):
        rank = int(query["dp_rank"][0])
        loads = loads if rank == 0 else []
    include_all = include_set is None or "all" in include_set
    dicts = []
    for load in loads:
        d = dict(load["core"])
        for field, value in load["sections"].items():
            if include_all or SECTION_PREFIXES.get(field, field) in (include_set or set()):
                d[field] = value
        dicts.append(d)
    if (query.get("format") or [""])[0] == "prometheus":
        return 200, prometheus(dicts), PROMETHEUS_CONTENT_TYPE
    return 200, {"timestamp": datetime.now(UTC).isoformat(), "version": version,
                 "accelerator": accelerator, "num_accelerators": num_accelerators, "loads": dicts}, "application/json"


def prometheus(dicts: list[dict[str, Any]]) -> str:
    """_format_loads_prometheus: one gauge per number, sections' keys prefixed, labelled by dp_rank."""
    samples: dict[str, list[tuple[int, Any]]] = {}
    for load in dicts:
        load = dict(load)
        rank = load.pop("dp_rank")
        for key, value in load.items():
            if isinstance(value, dict):
                prefix = SECTION_PREFIXES.get(key, key)
                for sub_key, sub_value in value.items():
                    if isinstance(sub_value, (int, float)):
                        samples.setdefault(f"sglang_{prefix}_{sub_key}", []).append((rank, sub_value))
            elif isinstance(value, (int, float)):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values]
    return "\n".join(lines) + "\n"
