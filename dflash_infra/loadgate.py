"""Load figures of an endpoint and the load gate that judges them against the previous deployment's.

A load run sends a bounded number of requests at one concurrency and keeps, per request, what the client saw
(`Outcome`). `figures` turns them into the numbers the record keeps per concurrency; `gate` says whether a
deployment may stay. The definitions follow z-lab's own client (`dflash benchmark --backend openai`, PyPI
`dflash` 0.1.0, dflash/benchmark.py `_run_openai`), so its figures and ours can be set side by side:

- output tokens/s: the sum of `usage.completion_tokens` over the wall time of the run (first request sent to
  last answer), failed requests counting no tokens;
- mean acceptance length: the plain mean of the requests' `spec_accept_length` (each request once, whatever
  its length), over the requests that report one; verify count: the sum of their `spec_verify_ct`.

Where SGLang 0.5.23 puts the speculative figures (`spec_figures`): `/v1/chat/completions` with
`return_meta_info: true` in `choices[i].meta_info`, with `return_spec_tokens_details: true` in
`sglext.spec_tokens_details`; `/generate` in the top-level `meta_info`. z-lab's client 0.1.0 reads only a
top-level `meta_info` from chat completions, which 0.5.23 does not send: it prints no acceptance length there.

Added here (z-lab's client has none): requests/s, failed requests, time to first token and inter-token latency
(streamed requests only), each as p50 and p99 by the nearest-rank method.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SPEC_KEYS = ("spec_accept_length", "spec_verify_ct")


@dataclass(frozen=True)
class Outcome:
    """One request as the load client saw it; times in seconds on one monotonic clock."""

    started: float
    finished: float
    ok: bool
    completion_tokens: int = 0
    first_token: float | None = None  # when the first token arrived (streamed requests), else None
    spec: Mapping[str, Any] = field(default_factory=dict)  # spec_figures of the answer
    error: str = ""


def spec_figures(answer: Mapping[str, Any]) -> dict[str, Any]:
    """spec_accept_length and spec_verify_ct of one answer, from wherever SGLang 0.5.23 put them (empty when the
    answer carries none: a run without speculative decoding, or a request that did not ask)."""
    places: list[Any] = [answer.get("meta_info")]
    for choice in answer.get("choices") or []:
        if isinstance(choice, Mapping):
            places.append(choice.get("meta_info"))
    details = (answer.get("sglext") or {}).get("spec_tokens_details") if isinstance(answer.get("sglext"),
                                                                                     Mapping) else None
    places += details if isinstance(details, list) else [details]
    for place in places:
        if isinstance(place, Mapping) and all(key in place for key in SPEC_KEYS):
            return {key: place[key] for key in SPEC_KEYS}
    return {}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (0 < q <= 100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def figures(outcomes: Iterable[Outcome], concurrency: int) -> dict[str, Any]:
    """The figures of one run at one concurrency (definitions: module docstring)."""
    runs = list(outcomes)
    if not runs:
        raise ValueError("load figures: expected at least one request, found none")
    wall = max(o.finished for o in runs) - min(o.started for o in runs)
    good = [o for o in runs if o.ok]
    tokens = sum(o.completion_tokens for o in good)
    ttft = [o.first_token - o.started for o in good if o.first_token is not None]
    itl = [(o.finished - o.first_token) / (o.completion_tokens - 1) for o in good
           if o.first_token is not None and o.completion_tokens > 1]
    accept = [float(o.spec["spec_accept_length"]) for o in good if "spec_accept_length" in o.spec]

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    return {
        "concurrency": int(concurrency), "requests": len(runs), "failed": len(runs) - len(good),
        "errors": sorted({o.error for o in runs if not o.ok and o.error})[:5],
        "wall_s": round(wall, 3), "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / max(wall, 1e-6), 2),
        "requests_per_s": round(len(good) / max(wall, 1e-6), 3),
        "ttft_ms_p50": ms(percentile(ttft, 50)), "ttft_ms_p99": ms(percentile(ttft, 99)),
        "itl_ms_p50": ms(percentile(itl, 50)), "itl_ms_p99": ms(percentile(itl, 99)),
        "accept_length_mean": round(statistics.mean(accept), 3) if accept else None,
        "accept_length_requests": len(accept),
        "verify_ct": sum(int(o.spec.get("spec_verify_ct", 0)) for o in good),
    }


def run_figures(runs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The figures per concurrency of the dflash_load module's `runs` (each request's `answer` holds only where
    0.5.23 put the speculative fields; read by `spec_figures`)."""
    out = []
    for run in runs:
        outcomes = [Outcome(started=float(o["started"]), finished=float(o["finished"]), ok=bool(o["ok"]),
                            completion_tokens=int(o.get("completion_tokens") or 0),
                            first_token=None if o.get("first_token") is None else float(o["first_token"]),
                            spec=spec_figures(o.get("answer") or {}), error=str(o.get("error") or ""))
                    for o in run.get("outcomes") or [] if o]
        out.append(figures(outcomes, int(run["concurrency"])))
    return out


def endpoint_concurrency(plan: Mapping[str, Any], levels: Sequence[int] = (1, 4)) -> list[int]:
    """The concurrencies of an on-demand benchmark of the endpoint: `levels` and the plan's maximum (each engine's
    max_running_requests times its replicas behind the gateway), ascending, each once."""
    peak = int(plan.get("max_running_requests") or 1) * max(1, len(plan.get("replicas") or []))
    return sorted({int(c) for c in levels if 0 < int(c) <= peak} | {peak})


def restart_problem(unit: Mapping[str, Any] | None, name: str) -> str:
    """A problem when the engine restarted during its load run (the dflash_load module's `unit`), else ''."""
    if not unit or not unit.get("restarted"):
        return ""
    before, after = unit.get("before") or {}, unit.get("after") or {}
    return (f"{name} restarted during the load run (NRestarts {before.get('NRestarts', '?')} -> "
            f"{after.get('NRestarts', '?')}, now {after.get('ActiveState', '?')}): it crashed under load")


def restarts_problem(units: Mapping[str, Mapping[str, Any]] | None) -> str:
    """restart_problem for several engines (the dflash_load module's `units`, by name): each that restarted."""
    return "; ".join(p for p in (restart_problem(unit, name) for name, unit in (units or {}).items()) if p)


def gateway_run(settings: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    """The load gate through the gateway, after every replica passed its own: the endpoint's capacity at once.
    `concurrency`: the settings' gateway_concurrency, else each engine's max_running_requests times the plan's
    replicas; `requests`: the settings' requests times the replicas (each replica about as many as its own gate
    sent), at least the largest concurrency, so that every level runs full."""
    replicas = max(1, len(plan.get("replicas") or []))
    concurrency = [int(c) for c in settings.get("gateway_concurrency") or []] or [
        int(plan.get("max_running_requests") or 1) * replicas]
    return {"concurrency": concurrency, "requests": max(int(settings["requests"]) * replicas, max(concurrency))}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    problems: list[str]
    lines: list[str]


def inputs(settings: Mapping[str, Any], transport: str = "http") -> dict[str, Any]:
    """What makes two load runs comparable: the prompts (their sha256), max_tokens, thinking and requests, and the
    transport when it is not plain HTTP (a TLS handshake per connection weighs on a short run: figures over HTTPS are
    not held against figures over HTTP)."""
    prompts = json.dumps(list(settings.get("prompts") or []), sort_keys=True, separators=(",", ":"))
    out = {"prompts_sha256": hashlib.sha256(prompts.encode()).hexdigest(),
           "prompts": [str(p.get("name", "")) for p in settings.get("prompts") or []],
           "max_tokens": int(settings["max_tokens"]), "thinking": bool(settings.get("thinking")),
           "requests": int(settings["requests"])}
    if transport != "http":
        out["transport"] = transport
    return out


def verdict(current: Sequence[Mapping[str, Any]], previous_load: Mapping[str, Any] | None,
            settings: Mapping[str, Any], speculative: bool, restarted: str = "",
            transport: str = "http") -> dict[str, Any]:
    """`gate` as the roles call it. previous_load: the `load` of the deployment record this one replaces (its figures
    are compared only when it ran the same inputs); settings: dflash_load_gate's; `restarted`: a restart_problem.
    A dict: passed, problems, lines, and `load`, what the new record keeps (inputs and figures)."""
    now = inputs(settings, transport)
    previous = None
    note = []
    if previous_load and previous_load.get("figures"):
        if previous_load.get("inputs") == now:
            previous = previous_load["figures"]
        else:
            note = ["the previous deployment ran other load inputs (prompts, max_tokens, thinking, requests or the "
                    "transport, HTTP or HTTPS): recorded without comparing"]
    judged = gate(current, previous, speculative=speculative,
                  min_accept_length=float(settings["min_accept_length"]),
                  max_regression=float(settings["max_regression"]),
                  accept_regression=bool(settings.get("accept_regression")))
    problems = ([restarted] if restarted else []) + judged.problems
    lines = [line for line in judged.lines if not (note and line.startswith("first deployment"))] + note
    return {"passed": not problems, "problems": problems, "lines": lines,
            "load": {"inputs": now, "figures": list(current)}}


def gate(current: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]] | None, *,
         speculative: bool, min_accept_length: float, max_regression: float,
         accept_regression: bool = False) -> Verdict:
    """Whether a deployment passes its load runs: no failed request; with speculative decoding, a mean
    acceptance length of at least min_accept_length at every concurrency; and output tokens/s not below the
    previous deployment's at the same concurrency by more than max_regression (a fraction; a first deployment,
    or a concurrency the previous one did not run, is recorded without comparing; accept_regression lets a
    slower deployment pass on purpose, saying so)."""
    before = {int(p["concurrency"]): p for p in previous or []}
    problems: list[str] = []
    lines: list[str] = []
    for now in current:
        c = int(now["concurrency"])
        line = (f"concurrency {c}: {now['requests']} requests, {now['failed']} failed, "
                f"{now['output_tokens_per_s']} tok/s, {now['requests_per_s']} req/s")
        if now.get("accept_length_mean") is not None:
            line += f", acceptance {now['accept_length_mean']} over {now['accept_length_requests']} requests"
        old = before.get(c)
        if old:
            line += f" (previous deployment: {old['output_tokens_per_s']} tok/s"
            if old.get("accept_length_mean") is not None:
                line += f", acceptance {old['accept_length_mean']}"
            line += ")"
        lines.append(line)
        if now["failed"]:
            problems.append(f"concurrency {c}: {now['failed']} of {now['requests']} requests failed "
                            f"({'; '.join(now.get('errors') or []) or 'no error text'})")
        if speculative:
            accept = now.get("accept_length_mean")
            if accept is None:
                problems.append(f"concurrency {c}: no request reported spec_accept_length; a speculative "
                                "deployment must (ask with return_meta_info or return_spec_tokens_details)")
            elif accept < min_accept_length:
                problems.append(f"concurrency {c}: mean acceptance length {accept} is below {min_accept_length}: "
                                "the drafter costs time without saving it")
        if old and old.get("output_tokens_per_s"):
            floor = float(old["output_tokens_per_s"]) * (1 - max_regression)
            if float(now["output_tokens_per_s"]) < floor:
                drop = 1 - float(now["output_tokens_per_s"]) / float(old["output_tokens_per_s"])
                message = (f"concurrency {c}: {now['output_tokens_per_s']} tok/s is {drop:.0%} below the previous "
                           f"deployment's {old['output_tokens_per_s']} (at most {max_regression:.0%} allowed)")
                if accept_regression:
                    lines.append(message + "; accepted on purpose")
                else:
                    problems.append(message)
    if not previous:
        lines.append("first deployment with load figures: recorded, nothing to compare with")
    return Verdict(not problems, problems, lines)


COMPARED = (("output_tokens_per_s", "output tok/s"), ("requests_per_s", "requests/s"), ("failed", "failed"),
            ("ttft_ms_p50", "TTFT p50 ms"), ("ttft_ms_p99", "TTFT p99 ms"), ("itl_ms_p50", "ITL p50 ms"),
            ("itl_ms_p99", "ITL p99 ms"), ("accept_length_mean", "acceptance length"), ("verify_ct", "verify count"))


def compare(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], names: tuple[str, str]) -> list[str]:
    """Two deployments' load figures side by side, per concurrency (the ratio b/a where both are numbers)."""
    left, right = ({int(f["concurrency"]): f for f in side} for side in (a, b))
    out = [f"{'':22}{names[0]:>14}{names[1]:>14}{'ratio':>8}"]
    for c in sorted(set(left) | set(right)):
        out.append(f"concurrency {c}")
        for key, label in COMPARED:
            x, y = (left.get(c) or {}).get(key), (right.get(c) or {}).get(key)
            ratio = f"{y / x:.2f}" if isinstance(x, int | float) and isinstance(y, int | float) and x else ""
            out.append(f"  {label:20}{'-' if x is None else x!s:>14}{'-' if y is None else y!s:>14}{ratio:>8}")
    return out
