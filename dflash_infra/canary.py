"""The canary's decisions (playbooks/canary.yml): what a candidate may change, and whether it beat the baseline.

A candidate is a setting the team wants to try on one replica behind the same gateway, as the deploy would plan it:
`speculative` (merged over dflash_speculative: another block size or draft window, `algorithm: none`, DDTree with a
tree budget), `plan_overrides` (merged over dflash_plan_overrides: any planner override) and `environment` (merged
over the engine's extra environment: e.g. SGLANG_ENABLE_SPEC_V2=1). The planner and the real flag table check the
candidate's plan as they check every plan.

The canary and a baseline replica are measured in alternating rounds (the load gate's prompts and definitions,
dflash_infra.loadgate), straight to each replica, both in the gateway. The candidate wins when, at every
concurrency, no request failed, a speculative candidate's mean acceptance length is at least min_accept_length, and
its median output tokens/s over the rounds is at least the baseline's times (1 + margin). The inventory stays the
truth: a promoted candidate is kept only once it is in group_vars (`keep_lines` says what to write).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

KEYS = ("speculative", "plan_overrides", "environment")
# Environment the deploy owns: a candidate cannot set the engine's key or move it to other GPUs.
RESERVED_ENVIRONMENT = ("SGLANG_API_KEY", "CUDA_VISIBLE_DEVICES")


def candidate(value: Any) -> dict[str, Any]:
    """The candidate with every key present, and its problems (an empty candidate is one)."""
    problems: list[str] = []
    if not isinstance(value, Mapping):
        return {"speculative": {}, "plan_overrides": {}, "environment": {},
                "problems": [f"candidate: expected a mapping with {', '.join(KEYS)}, found {type(value).__name__}"]}
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        problems.append(f"candidate: unknown keys {unknown}; expected {', '.join(KEYS)}")
    out: dict[str, Any] = {}
    for key in KEYS:
        part = value.get(key) or {}
        if not isinstance(part, Mapping):
            problems.append(f"candidate.{key}: expected a mapping, found {type(part).__name__}")
            part = {}
        out[key] = dict(part)
    for name, setting in out["environment"].items():
        if name in RESERVED_ENVIRONMENT:
            problems.append(f"candidate.environment.{name}: set by the deploy itself, not by a candidate")
        elif not isinstance(setting, str):
            problems.append(f"candidate.environment.{name}: expected a string, found {type(setting).__name__} "
                            f"(quote it: \"{setting}\")")
    if not any(out[key] for key in KEYS):
        problems.append("candidate: nothing to try (speculative, plan_overrides and environment are all empty)")
    return {**out, "problems": problems}


def rounds_figures(rounds: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One side's figures over its rounds, per concurrency: the median output tokens/s and requests/s, the failed and
    total requests summed, the mean acceptance length over every request that reported one."""
    by: dict[int, list[Mapping[str, Any]]] = {}
    for run in rounds:
        for figures in run:
            by.setdefault(int(figures["concurrency"]), []).append(figures)
    out = []
    for c, runs in sorted(by.items()):
        reported = sum(int(f.get("accept_length_requests") or 0) for f in runs)
        accept = (sum(float(f["accept_length_mean"]) * int(f.get("accept_length_requests") or 0)
                      for f in runs if f.get("accept_length_mean") is not None) / reported) if reported else None
        out.append({"concurrency": c, "rounds": len(runs),
                    "requests": sum(int(f["requests"]) for f in runs),
                    "failed": sum(int(f["failed"]) for f in runs),
                    "output_tokens_per_s": round(statistics.median(float(f["output_tokens_per_s"]) for f in runs), 2),
                    "requests_per_s": round(statistics.median(float(f["requests_per_s"]) for f in runs), 3),
                    "accept_length_mean": None if accept is None else round(accept, 3)})
    return out


def judge(baseline: Sequence[Mapping[str, Any]], candidate_figures: Sequence[Mapping[str, Any]], *, margin: float,
          min_accept_length: float, speculative: bool) -> dict[str, Any]:
    """Whether the candidate wins (rounds_figures of each side): `promote`, the `lines` side by side and `reasons`
    (why it did not win; empty when it did)."""
    base = {int(f["concurrency"]): f for f in baseline}
    lines: list[str] = []
    reasons: list[str] = []
    for now in candidate_figures:
        c = int(now["concurrency"])
        old = base.get(c)
        if old is None:
            reasons.append(f"concurrency {c}: the baseline was not measured there")
            continue
        ratio = float(now["output_tokens_per_s"]) / max(float(old["output_tokens_per_s"]), 1e-9)
        line = (f"concurrency {c}: candidate {now['output_tokens_per_s']} tok/s vs baseline "
                f"{old['output_tokens_per_s']} tok/s ({ratio - 1:+.1%}, needs {margin:+.1%})")
        if now.get("accept_length_mean") is not None or old.get("accept_length_mean") is not None:
            line += f"; acceptance {now.get('accept_length_mean')} vs {old.get('accept_length_mean')}"
        line += f"; failed {now['failed']} vs {old['failed']} of {now['requests']}"
        lines.append(line)
        if now["failed"]:
            reasons.append(f"concurrency {c}: {now['failed']} of the candidate's {now['requests']} requests failed")
        accept = now.get("accept_length_mean")
        if speculative and (accept is None or float(accept) < min_accept_length):
            reasons.append(f"concurrency {c}: the candidate's mean acceptance length {accept} is below "
                           f"{min_accept_length}")
        if ratio < 1 + margin:
            reasons.append(f"concurrency {c}: {ratio - 1:+.1%} tok/s is not the {margin:+.1%} "
                           "the candidate must win by")
    if not candidate_figures:
        reasons.append("the candidate was not measured")
    promote = not reasons
    lines.append("promote: the candidate wins at every concurrency" if promote else
                 "keep out: " + "; ".join(reasons))
    return {"promote": promote, "lines": lines, "reasons": reasons}


def keep_lines(cand: Mapping[str, Any], speculative: Mapping[str, Any], overrides: Mapping[str, Any],
               environment: Mapping[str, Any]) -> list[str]:
    """What to put in the group's group_vars so that the next deploy keeps a promoted candidate (the merged values:
    the inventory's settings with the candidate's over them), as YAML lines."""
    import yaml  # ansible's dependency, on every controller

    merged = {name: {**dict(base), **dict(cand.get(key) or {})}
              for name, key, base in (("dflash_speculative", "speculative", speculative),
                                      ("dflash_plan_overrides", "plan_overrides", overrides),
                                      ("sglang_service_extra_environment", "environment", environment))
              if cand.get(key)}
    return yaml.safe_dump(merged, sort_keys=True, default_flow_style=False).splitlines()
