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

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import yaml  # ansible's dependency, on every controller

from dflash_infra import loadgate, serving

KEYS = ("speculative", "plan_overrides", "environment")
ENGINE_FLAGS = "engine_flags"  # the plan override dflash_infra.planning.engine_flags renders


def candidate(value: Any) -> dict[str, Any]:
    """The candidate with every key present, and its problems (an empty candidate is one). A string is read as
    YAML (JSON included): `-e 'candidate={"speculative": {"block_size": 8}}'` passes one."""
    problems: list[str] = []
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            return {"speculative": {}, "plan_overrides": {}, "environment": {},
                    "problems": [f"candidate: not YAML or JSON ({str(exc).splitlines()[0]})"]}
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
    problems += serving.environment_problems(out["environment"], "candidate.environment")
    for name, setting in out["environment"].items():
        if not isinstance(setting, str) and not any(p.startswith(f"candidate.environment.{name}:") for p in problems):
            problems.append(f"candidate.environment.{name}: expected a string, found {type(setting).__name__} "
                            f"(quote it: \"{setting}\")")
    if not any(out[key] for key in KEYS):
        problems.append("candidate: nothing to try (speculative, plan_overrides and environment are all empty)")
    return {**out, "problems": problems}


def _flag_values(argv: Sequence[str]) -> dict[str, list[str]]:
    """An engine argv as {--flag: its values} (`--flag=value` is one flag with its value)."""
    out: dict[str, list[str]] = {}
    flag = ""
    for word in map(str, argv):
        if word.startswith("--"):
            flag, _, value = word.partition("=")
            out[flag] = [value] if value else []
        elif flag:
            out[flag].append(word)
    return out


def _shown(values: list[str] | None) -> str:
    return "(absent)" if values is None else " ".join(values) or "(on)"


def changes(baseline: Mapping[str, Any], cand: Mapping[str, Any], index: int, base_env: Mapping[str, Any],
            cand_env: Mapping[str, Any]) -> dict[str, Any]:
    """What the candidate's plan (`cand`, the planner's, as `baseline` is) and environment change on replica `index`:
    `lines` (one per flag or variable: old -> new) and `problems`: the candidate must keep the baseline's replicas
    (GPUs, ports: the gateway and the other replicas stay as they are) and must change something on the replica."""
    problems: list[str] = []

    def layout(plan: Mapping[str, Any]) -> list[tuple[int, tuple[int, ...], str]]:
        return [(int(r["index"]), tuple(int(g) for g in r["gpu_ids"]), str(r["url"]))
                for r in plan.get("replicas") or []]

    def shown(plan: Mapping[str, Any]) -> str:
        return ", ".join(f"r{i} GPUs {','.join(map(str, g))} at {u}" for i, g, u in layout(plan))

    if layout(cand) != layout(baseline):
        problems.append(f"the candidate's plan changes the replicas ({shown(cand)}; the baseline's: {shown(baseline)}):"
                        " a canary changes one replica's settings, not the topology; deploy a new topology with "
                        "deploy_dflash.yml")
    lines: list[str] = []
    replicas = baseline.get("replicas") or []
    if 0 <= index < len(replicas) and not problems:
        old = _flag_values((baseline["replicas"][index]).get("args") or [])
        new = _flag_values((cand["replicas"][index]).get("args") or [])
        for flag in sorted(set(old) | set(new)):
            if old.get(flag) != new.get(flag):
                lines.append(f"{flag}: {_shown(old.get(flag))} -> {_shown(new.get(flag))}")
        for name in sorted(set(base_env) | set(cand_env)):
            if base_env.get(name) != cand_env.get(name):
                lines.append(f"{name}={base_env.get(name, '(unset)')} -> {cand_env.get(name, '(unset)')}")
        if not lines:
            problems.append("the candidate plans the same engine and environment as the baseline: nothing to try")
    return {"lines": lines, "problems": problems}


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


def measured(results: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The measurement's load runs (the dflash_load task's loop `results`, each `item` {side: baseline|candidate}):
    each side's figures over its rounds (`rounds_figures` of the load gate's figures) and the candidate's
    `problems` (its engine, unit `name`, restarted during a run)."""
    sides: dict[str, list[list[dict[str, Any]]]] = {"baseline": [], "candidate": []}
    problems: list[str] = []
    for result in results:
        side = str((result.get("item") or {}).get("side"))
        if side not in sides:
            raise ValueError(f"canary measurement: a run of side {side!r}; expected baseline or candidate")
        sides[side].append(loadgate.run_figures(result.get("runs") or []))
        if side == "candidate" and (problem := loadgate.restart_problem(result.get("unit"), name)):
            problems.append(problem)
    return {"baseline": rounds_figures(sides["baseline"]), "candidate": rounds_figures(sides["candidate"]),
            "problems": problems}


def judge(baseline: Sequence[Mapping[str, Any]], candidate_figures: Sequence[Mapping[str, Any]], *, margin: float,
          min_accept_length: float, speculative: bool, problems: Sequence[str] = ()) -> dict[str, Any]:
    """Whether the candidate wins (rounds_figures of each side): `promote`, the `lines` side by side and `reasons`
    (why it did not win; empty when it did). `problems`: what else went wrong with the candidate during its rounds
    (a restart under load), each a reason."""
    base = {int(f["concurrency"]): f for f in baseline}
    lines: list[str] = []
    reasons: list[str] = [str(p) for p in problems if p]
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


def merged(base: Mapping[str, Any] | None, part: Mapping[str, Any] | None) -> dict[str, Any]:
    """A candidate's part over the inventory's settings; `engine_flags` (a plan override) merges flag by flag, so a
    candidate trying one engine flag keeps the others the inventory sets (one given as null drops the inventory's)."""
    out = {**dict(base or {}), **dict(part or {})}
    flags = (base or {}).get(ENGINE_FLAGS), (part or {}).get(ENGINE_FLAGS)
    if isinstance(flags[0], Mapping) and isinstance(flags[1], Mapping):
        out[ENGINE_FLAGS] = {flag: value for flag, value in {**dict(flags[0]), **dict(flags[1])}.items()
                             if value is not None}
    return out


def keep_lines(cand: Mapping[str, Any], speculative: Mapping[str, Any], overrides: Mapping[str, Any],
               environment: Mapping[str, Any]) -> list[str]:
    """What to put in the group's group_vars so that the next deploy keeps a promoted candidate (the merged values:
    the inventory's settings with the candidate's over them), as YAML lines."""
    merged_parts = {name: merged(base, cand.get(key))
                    for name, key, base in (("dflash_speculative", "speculative", speculative),
                                            ("dflash_plan_overrides", "plan_overrides", overrides),
                                            ("sglang_service_extra_environment", "environment", environment))
                    if cand.get(key)}
    # Plain types for the dumper: Ansible hands its strings over as str subclasses (tagged with their origin).
    plain = json.loads(json.dumps(merged_parts))
    return yaml.safe_dump(plain, sort_keys=True, default_flow_style=False).splitlines()
