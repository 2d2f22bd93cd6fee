"""What runs where, read-only: one host's serving state from one host_state read, against the inventory's plan.

playbooks/status.yml gathers the inputs (the host's read, the plan the deploy would make, each unit as the deploy
would render it, the venvs against their locks, the routes of the gateway that fronts the host) and prints what
`report` returns: the engine's and the gateway's releases and locks, the plan in force (from the deployment records)
and what the inventory's plan would change, each replica's unit, route and health, the models served, the last load
gate's figures and their age, and the deploy lock's holder. `drift` names every way a deploy would change the host.
Pure functions of their arguments: the playbook calls them through filters, tests call them directly.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_infra import host_lock, host_state, rollout, serving, summary

Json = dict[str, Any]

# The plan's settings the view compares between the records and the inventory, in the order they are named.
PLAN_KEYS = ("topology", "tp_size", "replicas", "engine", "mem_fraction_static", "max_running_requests",
             "context_length")
SPECULATIVE_KEYS = ("algorithm", "block_size", "draft_window", "max_draft_tokens", "tree_budget")
MARKER_BEGIN = "--- dflash status json begin ---"
MARKER_END = "--- dflash status json end ---"


# How a unit file stands against the deploy's rendering, in the table's words.
UNIT_WORDS = {"matches": "unit as planned", "differs": "unit DIFFERS from the plan", "missing": "no unit",
              "not rendered": "unit not compared"}

def parse_time(stamp: Any) -> dt.datetime | None:
    """An ISO 8601 time of a record ('...Z' or with an offset; naive means UTC); None when absent or unreadable."""
    if not stamp:
        return None
    text = str(stamp).strip()
    for fmt in ("%Y%m%dT%H%M%SZ",):
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def age_s(now: str, stamp: Any) -> int | None:
    """Whole seconds from `stamp` to `now` (None when either is unknown)."""
    start, end = parse_time(stamp), parse_time(now)
    return int((end - start).total_seconds()) if start and end else None


def age_text(seconds: int | None) -> str:
    if seconds is None:
        return "age unknown"
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def _unit(state: Mapping[str, Any], name: str) -> Json:
    props = (state.get("units") or {}).get(name) or {}
    return {"ActiveState": props.get("ActiveState") or "unknown", "UnitFileState": props.get("UnitFileState") or ""}


def _present(unit: Mapping[str, Any]) -> bool:
    """Runs or starts at boot (rollout._present's rule: what a deploy stops and disables)."""
    return (unit["ActiveState"] in ("active", "activating", "reloading", "deactivating")
            or unit["UnitFileState"] == "enabled")


def _record(state: Mapping[str, Any], path: str) -> Json | None:
    found = host_state.path_entry(state, path).get("json")
    return dict(found) if isinstance(found, Mapping) else None


def _health(state: Mapping[str, Any], url: str) -> Json:
    """host_state's read of a /health URL: {url, status, error}; status None when nothing answered or not read."""
    seen = (state.get("health") or {}).get(url)
    if not isinstance(seen, Mapping):
        return {"url": url, "status": None, "error": "not read"}
    return {"url": url, "status": seen.get("status"), "error": str(seen.get("error") or "")}


def venv_summary(lock: Mapping[str, Any] | None) -> Json | None:
    """A venv against its lock (locks.venv_status): the lock file, its sha256, whether the venv holds exactly it."""
    if not lock:
        return None
    return {"venv": lock.get("venv"), "lock_file": lock.get("source"), "requirement": lock.get("requirement"),
            "lock_sha256": lock.get("lock_sha256"), "in_sync": bool(lock.get("in_sync")),
            "differs": list(lock.get("lines") or []), "no_venv": bool(lock.get("needs_venv"))}


def venv_drift(what: str, venv: Mapping[str, Any] | None) -> list[str]:
    if not venv or venv["in_sync"]:
        return []
    found = ("no venv" if venv["no_venv"] else "; ".join(venv["differs"])
             or "a venv installed from another lock (its copy of the lock differs)")
    return [f"{what} venv {venv['venv']}: expected exactly {venv['lock_file']} ({venv['requirement']}), found {found}"]


def plan_summary(plan: Mapping[str, Any] | None, topology: str, replicas: int | None = None) -> Json | None:
    """The settings of a plan (the planner's, or a deployment record's `plan`) that the view shows and compares."""
    if not plan:
        return None
    spec = plan.get("speculative") or {}
    return {"topology": topology, "tp_size": plan.get("tp_size"),
            "replicas": replicas if replicas is not None else plan.get("dp_size"),
            "engine": (plan.get("engine") or {}).get("version"),
            "mem_fraction_static": plan.get("mem_fraction_static"),
            "max_running_requests": plan.get("max_running_requests"), "context_length": plan.get("context_length"),
            "speculative": {k: spec.get(k) for k in SPECULATIVE_KEYS}}


def _flags(argv: Sequence[Any]) -> dict[str, list[str]]:
    """An engine argv as flag -> values (serving.command_lines' grouping)."""
    return {line[0]: line[1:] for line in serving.command_lines([], [str(w) for w in argv])[1:] if line}


def argv_changes(recorded: Sequence[Any], planned: Sequence[Any]) -> list[str]:
    """The flags whose values differ between a recorded argv and a planned one ('--flag a -> b', '+--flag v',
    '---flag v'), in flag order."""
    before, after = _flags(recorded), _flags(planned)
    out = []
    for flag in sorted(set(before) | set(after)):
        if flag not in before:
            out.append(f"+{flag} {' '.join(after[flag])}".rstrip())
        elif flag not in after:
            out.append(f"-{flag} {' '.join(before[flag])}".rstrip())
        elif before[flag] != after[flag]:
            out.append(f"{flag} {' '.join(before[flag]) or '(on)'} -> {' '.join(after[flag]) or '(on)'}")
    return out


def plan_changes(in_force: Mapping[str, Any] | None, inventory: Mapping[str, Any] | None) -> list[str]:
    """What the inventory's plan changes against the plan in force, one item per setting ('tp_size 2 -> 4')."""
    if not inventory:
        return []
    if not in_force:
        return ["no deployment record: a deploy serves the plan for the first time"]
    out = [f"{k} {in_force.get(k)} -> {inventory.get(k)}" for k in PLAN_KEYS if in_force.get(k) != inventory.get(k)]
    spec_before, spec_after = in_force.get("speculative") or {}, inventory.get("speculative") or {}
    out += [f"speculative.{k} {spec_before.get(k)} -> {spec_after.get(k)}" for k in SPECULATIVE_KEYS
            if spec_before.get(k) != spec_after.get(k)]
    return out


def _unit_file(state: Mapping[str, Any], path: str, rendered: str | None) -> str:
    """How the unit file on the host stands against the deploy's rendering: matches, differs, missing, not rendered."""
    if not host_state.path_entry(state, path).get("exists"):
        return "missing"
    if not rendered:
        return "not rendered"
    return "matches" if host_state.file_matches(state, path, rendered, "0644", "root", "root") else "differs"


def _routes(routes: Mapping[str, Any] | None) -> Json:
    """The gateway's workers as host_state read them (its `gateway` section): read (bool), why not, by URL."""
    if routes is None:
        return {"read": False, "why": "the gateway's host is not in this run", "by_url": {}}
    if not routes.get("asked"):
        return {"read": False, "why": "host_state did not ask the gateway", "by_url": {}}
    if routes.get("status") != 200:
        detail = routes.get("error") or f"answered {routes.get('status')}"
        return {"read": False, "why": f"{routes.get('url')}/workers: {detail}", "by_url": {}}
    return {"read": True, "why": "",
            "by_url": {str(w.get("url") or "").rstrip("/"): dict(w) for w in routes.get("workers") or []}}


def _replica_entry(state: Mapping[str, Any], name: str, index: int | None, paths: Mapping[str, Any], url: str,
                   health_url: str, rendered: str | None, routes: Mapping[str, Any], planned: bool) -> Json:
    record = _record(state, str(paths["record"])) or {}
    route = routes["by_url"].get(url.rstrip("/")) if url else None
    recorded_plan = record.get("plan") if isinstance(record.get("plan"), Mapping) else {}
    return {
        "index": index, "name": name, "planned": planned, "url": url, **_unit(state, name),
        "unit_file": _unit_file(state, str(paths["unit"]), rendered),
        "env_file": "matches" if host_state.secret_matches(state, str(paths["env_file"]), "0600", "root", "root")
        else "differs",
        "routed": (route is not None) if routes["read"] and url else None,
        "route": {"status": route.get("status"), "healthy": route.get("healthy")} if route else None,
        "health": _health(state, health_url),
        "deployed_at": record.get("deployed_at"), "gates": (record.get("gates") or {}).get("state"),
        "gpu_ids": record.get("gpu_ids"), "args": list(record.get("args") or []),
        "plan": (plan_summary(recorded_plan, "gateway", 1) if index is not None
                 else plan_summary(recorded_plan, "single")) if record else None,
        "models": dict(record.get("models") or {}) or None, "load": record.get("load"),
    }


def _replica_drift(r: Mapping[str, Any], gateway_name: str) -> list[str]:
    name, out = r["name"], []
    if not _present(r) and r["unit_file"] == "missing":
        return [f"{name}: expected by the plan, found no unit (a deploy starts it)"]
    if r["ActiveState"] != "active" or r["UnitFileState"] != "enabled":
        out.append(f"{name}: expected active and enabled, found {r['ActiveState']}/{r['UnitFileState'] or '?'}")
    if r["unit_file"] == "differs":
        out.append(f"{name}: its unit differs from what the inventory's plan renders (a deploy restarts it)")
    elif r["unit_file"] == "missing":
        out.append(f"{name}: expected its unit file, found none")
    if r["env_file"] != "matches":
        out.append(f"{name}: its environment file does not hold the inventory's keys")
    if r["ActiveState"] == "active" and r["health"]["status"] != 200:
        found = r["health"]["status"] or r["health"]["error"] or "no answer"
        out.append(f"{name}: expected {r['health']['url']} to answer 200, found {found}")
    if r["routed"] is False:
        out.append(f"{name} ({r['url']}): expected among the workers {gateway_name} routes to, found missing "
                   "(a deploy adds it back)")
    return out


def _in_force(replicas: Sequence[Mapping[str, Any]], single: Mapping[str, Any] | None) -> Json | None:
    """The plan in force, from the deployment records: the replicas' (those whose unit runs or starts at boot; every
    recorded one when none does), else the single process's."""
    recorded = [r for r in replicas if r["plan"]]
    running = [r for r in recorded if _present(r)] or recorded
    if running:
        first = running[0]["plan"]
        out = {**first, "replicas": len(running), "running": any(_present(r) for r in running)}
        out["mixed"] = [r["name"] for r in running[1:]
                        if {k: v for k, v in (r["plan"] or {}).items() if k != "replicas"}
                        != {k: v for k, v in first.items() if k != "replicas"}]
        return out
    if single and single.get("plan"):
        return {**single["plan"], "running": _present(single), "mixed": []}
    return None


def candidates(plan: Mapping[str, Any] | None, slots: Sequence[Mapping[str, Any]], service_name: str,
               service_paths: Mapping[str, Any], through_gateway: bool) -> list[Json]:
    """The units the deploy would write for the plan, as the sglang_service role renders them (`tasks_from:
    rendered`): each replica's behind the gateway, else the single process's; none without a plan."""
    if not plan:
        return []
    if through_gateway:
        return [{"name": slots[i]["name"], "paths": dict(slots[i]), "plan": rollout.replica_plan(plan, i)}
                for i in range(len(plan.get("replicas") or []))]
    return [{"name": service_name, "paths": dict(service_paths), "plan": dict(plan)}]


def _replicas(inputs: Mapping[str, Any], state: Mapping[str, Any], planned: Sequence[Mapping[str, Any]],
              routes: Mapping[str, Any]) -> list[Json]:
    """Each unit of the engine as the view shows it: behind the gateway every planned replica and every other slot
    whose unit runs or starts at boot; else the single process."""
    service, rendered = inputs["service"], dict(inputs.get("rendered") or {})
    if not inputs.get("through_gateway"):
        return [_replica_entry(state, str(service["name"]), None, service["paths"], "", f"{service['url']}/health",
                               rendered.get(str(service["name"])), routes, True)]
    slot_urls, slot_health = list(inputs.get("slot_urls") or []), list(inputs.get("slot_health") or [])
    out = []
    for slot in inputs.get("slots") or []:
        i, name = int(slot["index"]), str(slot["name"])
        if i < len(planned):
            url = str(planned[i]["url"])
            health_url = str(planned[i].get("local_url") or url) + "/health"
        elif _present(_unit(state, name)):
            url = str(slot_urls[i]) if i < len(slot_urls) else ""
            health_url = str(slot_health[i]) if i < len(slot_health) else ""
        else:
            continue
        out.append(_replica_entry(state, name, i, slot, url, health_url, rendered.get(name), routes, i < len(planned)))
    return out


def _plan_view(state: Mapping[str, Any], inputs: Mapping[str, Any], replicas: Sequence[Mapping[str, Any]],
               planned: Sequence[Mapping[str, Any]]) -> Json:
    """The plan in force (from the records), the inventory's, and what the inventory's changes, argv included (the
    replicas whose argv changes alike named together)."""
    plan, through = inputs.get("plan") or None, bool(inputs.get("through_gateway"))
    in_force = (_in_force(replicas, None) or _in_force([], _single_from_records(state, inputs["service"]))
                if through else _in_force([], replicas[0]))
    inventory = plan_summary(plan, "gateway" if through else "single", len(planned) if through else None)
    changes = plan_changes({k: v for k, v in (in_force or {}).items() if k not in ("running", "mixed")} or None,
                           inventory)
    argvs: dict[tuple[str, ...], list[str]] = {}
    for r in replicas:
        if not (plan and r["planned"] and r["plan"]):
            continue
        wanted = (planned[int(r["index"])].get("args") if r["index"] is not None else plan.get("args")) or []
        argv = tuple(argv_changes(r["args"], wanted))
        if argv:
            argvs.setdefault(argv, []).append(str(r["name"]))
    changes += [f"argv of {', '.join(names)}: " + "; ".join(argv) for argv, names in argvs.items()]
    if in_force and in_force.get("mixed"):
        changes.append("replicas on another plan than the first: " + ", ".join(in_force["mixed"]))
    return {"in_force": in_force, "inventory": inventory, "changes": changes}


def report(inputs: Mapping[str, Any]) -> Json:
    """One host's status (keys: see docs/serving.md, "What runs where: status.yml").

    inputs: host, now (ISO 8601, UTC), state (host_state_current), plan (the inventory's plan, None when it could not
    be made) and plan_error, through_gateway (the inventory's topology), service {name, paths, url}, slots (every
    replica slot), slot_urls (where the gateway reaches each slot), slot_health (where the host reaches each slot's
    /health), rendered (unit name -> sha256 of the unit the deploy would write), engine {name, version, lock
    (locks.venv_status)}, models (the host's verified copies: plan_inputs.manifests), gateway {host, here, name, paths,
    version, lock, record, load_record, health_url, rendered (sha256 of the unit the deploy would write), peer_workers
    (the planned workers of the other hosts it fronts, in this run), peers_missing (those not in this run), routes
    (host_state's `gateway` section of the gateway's host; None when that host is not in the run)}, lock {path,
    stale_after_s}.
    """
    state = inputs.get("state") or {}
    now = str(inputs.get("now") or "")
    plan = inputs.get("plan") or None
    through = bool(inputs.get("through_gateway"))
    service = inputs["service"]
    gw = dict(inputs.get("gateway") or {})
    section = (plan or {}).get("gateway") or {}
    gw["workers"] = [*(section.get("workers") or []), *(gw.get("peer_workers") or [])]
    gw["endpoint"] = f"{section.get('host')}:{section.get('port')}" if section else ""
    here = through and bool(gw.get("here"))
    routes: Json = _routes(gw.get("routes")) if through else {"read": False, "why": "", "by_url": {}}
    drift: list[str] = []
    notes: list[str] = []

    engine_in = inputs.get("engine") or {}
    engine = {"name": engine_in.get("name"), "version": engine_in.get("version"),
              "lock": venv_summary(engine_in.get("lock"))}
    drift += venv_drift("engine", engine["lock"])

    planned = list((plan or {}).get("replicas") or []) if through else []
    replicas = _replicas(inputs, state, planned, routes)
    if through and _present(_unit(state, str(service["name"]))):
        drift.append(f"{service['name']}: the single process (--dp-size) runs, the plan serves through the "
                     "gateway (a deploy backs it up, stops and disables it)")
    for r in replicas:
        if r["planned"]:
            drift += _replica_drift(r, str(gw.get("name") or "the gateway"))
        elif plan is None:  # no plan to judge against: a deploy would refuse, not retire it
            continue
        else:
            drift.append(f"{r['name']}: runs beyond the plan's {len(planned)} replica(s) (a deploy drains, stops and "
                         "disables it)")

    # Workers the gateway routes to that the plan does not have (judged where every host it fronts is in the run).
    extra_workers: list[str] = []
    if here and routes["read"] and plan is not None:
        if gw.get("peers_missing"):
            notes.append("workers of " + ", ".join(gw["peers_missing"]) + " not judged: not in this run")
        else:
            extra_workers = sorted(set(routes["by_url"]) - {str(u).rstrip("/") for u in gw["workers"]})
            drift += [f"{gw.get('name')}: routes to {u}, a worker the plan does not have (a deploy removes it)"
                      for u in extra_workers]
    if through and not routes["read"] and routes["why"]:
        notes.append(f"routes not read: {routes['why']}")
    gateway = _gateway(state, gw, routes, extra_workers, drift) if here else None

    plan_view = _plan_view(state, inputs, replicas, planned)
    if plan is None:
        error = (str(inputs.get("plan_error") or "").strip().splitlines() or ["unknown error"])[0]
        notes.append(f"the inventory's plan could not be made: {error}")
    drift += [f"plan: {c}" for c in plan_view["changes"]]

    models = _models(replicas, inputs.get("models") or {}, drift)
    load = {"replicas": {r["name"]: {"at": r["deployed_at"], "age_s": age_s(now, r["deployed_at"]),
                                     "figures": list((r["load"] or {}).get("figures") or [])}
                         for r in replicas if r["load"]},
            "gateway": _gateway_load(state, gw, now) if here else None}
    for r in replicas:
        del r["load"], r["args"]
    return {"host": inputs.get("host"), "at": now, "drifted": bool(drift), "drift": drift, "notes": notes,
            "engine": engine, "gateway": gateway, "plan": plan_view, "replicas": replicas, "models": models,
            "load": load, "lock": _lock(state, inputs.get("lock") or {}, now)}


def _single_from_records(state: Mapping[str, Any], service: Mapping[str, Any]) -> Json | None:
    record = _record(state, str(service["paths"]["record"]))
    if not record or not isinstance(record.get("plan"), Mapping):
        return None
    return {**_unit(state, str(service["name"])), "plan": plan_summary(record["plan"], "single")}


def _gateway(state: Mapping[str, Any], gw: Mapping[str, Any], routes: Mapping[str, Any],
             extra: Sequence[str], drift: list[str]) -> Json:
    """The gateway on this host against its lock, its record and the plan's workers; its drift added to `drift`."""
    name = str(gw.get("name"))
    paths = gw.get("paths") or {}
    unit = _unit(state, name)
    record = _record(state, str(gw.get("record"))) or {}
    venv = venv_summary(gw.get("lock"))
    drift += venv_drift("gateway", venv)
    if unit["ActiveState"] != "active" or unit["UnitFileState"] != "enabled":
        drift.append(f"{name}: expected active and enabled, found {unit['ActiveState']}/{unit['UnitFileState'] or '?'}")
    health = _health(state, str(gw.get("health_url") or ""))
    if unit["ActiveState"] == "active" and gw.get("health_url") and health["status"] != 200:
        drift.append(f"{name}: expected {health['url']} to answer 200, found "
                     f"{health['status'] or health['error'] or 'no answer'}")
    sha = host_state.file_sha256(state, str(paths.get("unit")))
    rendered = str(gw.get("rendered") or "")
    # Against the unit the inventory's plan renders (judged where every host it fronts is in the run: their workers
    # are in its command line).
    unit_file = ("not rendered" if not rendered or gw.get("peers_missing") else
                 "matches" if sha == rendered else "differs")
    if unit_file == "differs":
        drift.append(f"{name}: its unit differs from what the inventory's plan renders (a deploy restarts it)")
    if not record:
        drift.append(f"{name}: expected its deployment record {gw.get('record')}, found none (a deploy writes it)")
    else:
        if sha != record.get("unit_sha256"):
            drift.append(f"{name}: its unit differs from the one its deploy recorded (sha256 "
                         f"{str(record.get('unit_sha256'))[:16]}, found {str(sha)[:16] if sha else 'no unit'})")
        wanted = [str(u).rstrip("/") for u in gw.get("workers") or []]
        had = [str(u).rstrip("/") for u in record.get("workers") or []]
        # Judged only where every host it fronts is in the run (the others' workers are not planned here).
        if wanted and not gw.get("peers_missing") and sorted(wanted) != sorted(had):
            plus, minus = sorted(set(wanted) - set(had)), sorted(set(had) - set(wanted))
            drift.append(f"{name}: its unit names the workers of another plan (the plan adds {plus or 'none'}, "
                         f"removes {minus or 'none'}; a deploy restarts it)")
        if gw.get("version") and record.get("smg") != gw.get("version"):
            drift.append(f"{name}: expected smg {gw.get('version')}, its record says {record.get('smg')}")
        if gw.get("endpoint") and record.get("endpoint") != gw.get("endpoint"):
            drift.append(f"{name}: expected the endpoint {gw.get('endpoint')}, its record says "
                         f"{record.get('endpoint')}")
    if paths.get("api_key") and not host_state.secret_matches(state, str(paths["api_key"]), "0600", "root", "root"):
        drift.append(f"{name}: its key file {paths['api_key']} does not hold the inventory's endpoint key")
    return {"name": name, "version": gw.get("version"), "lock": venv, **unit, "health": health, "unit_file": unit_file,
            "deployed_at": record.get("deployed_at"), "endpoint": record.get("endpoint"),
            "recorded_smg": record.get("smg"), "routes_read": routes["read"],
            "routes": [{"url": u, "status": w.get("status"), "healthy": w.get("healthy")}
                       for u, w in sorted(routes["by_url"].items())],
            "unknown_workers": list(extra)}


def _gateway_load(state: Mapping[str, Any], gw: Mapping[str, Any], now: str) -> Json | None:
    record = _record(state, str(gw.get("load_record") or "")) if gw.get("load_record") else None
    if not record:
        return None
    return {"at": record.get("recorded_at"), "age_s": age_s(now, record.get("recorded_at")),
            "figures": list((record.get("load") or {}).get("figures") or [])}


def _models(replicas: Sequence[Mapping[str, Any]], verified: Mapping[str, Any], drift: list[str]) -> Json:
    """The models the records say are served (path, manifest sha256) and the host's verified copies; a record whose
    manifest is not the verified copy's is drift (the unit names the manifest: a deploy restarts the engine)."""
    served: Json = {}
    for r in replicas:
        for role, m in (r.get("models") or {}).items():
            m = m or {}
            served.setdefault(role, {"path": m.get("path"), "manifest_sha256": m.get("manifest_sha256")})
    for role, m in served.items():
        now_sha = (verified.get(role) or {}).get("manifest_sha256")
        if now_sha and m["manifest_sha256"] != now_sha:
            drift.append(f"models.{role}: the records serve manifest {str(m['manifest_sha256'])[:16]}, the host's "
                         f"verified copy is {now_sha[:16]} (a deploy restarts the engine on it)")
    return {"served": served, "verified": {k: dict(v) for k, v in verified.items()}}


def _lock(state: Mapping[str, Any], lock: Mapping[str, Any], now: str) -> Json | None:
    """The deploy lock's holder as host_state read its file (None when there is none); its heartbeat is the file's
    modification time where the read carries it (`mtime`, seconds since the epoch)."""
    path = str(lock.get("path") or "")
    entry = host_state.path_entry(state, path) if path else {}
    if not entry.get("exists"):
        return None
    holder = entry.get("json") if isinstance(entry.get("json"), Mapping) else None
    mtime = entry.get("mtime")
    beat = (dt.datetime.fromtimestamp(float(mtime), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if isinstance(mtime, (int, float)) else None)
    beat_age = age_s(now, beat)
    stale = int(lock.get("stale_after_s") or 900)
    return {"path": path, "holder": dict(holder) if holder else None,
            "describe": host_lock.describe(holder) if holder else f"unreadable ({entry.get('error') or 'not JSON'})",
            "since": (holder or {}).get("started_at"), "age_s": age_s(now, (holder or {}).get("started_at")),
            "heartbeat": beat, "heartbeat_age_s": beat_age,
            "stale": beat_age > stale if beat_age is not None else None}


def document(reports: Mapping[str, Any]) -> str:
    """The JSON document of `-e status_format=json` between its marker lines: one object, the hosts as keys."""
    return f"{MARKER_BEGIN}\n{json.dumps(dict(reports), indent=2, sort_keys=True)}\n{MARKER_END}"


def extract(text: str) -> Json:
    """The document of a run's output (the text between the markers; the callback's indentation is whitespace
    outside JSON strings)."""
    start, end = text.index(MARKER_BEGIN) + len(MARKER_BEGIN), text.index(MARKER_END)
    found: Json = json.loads(text[start:end])
    return found


def _short(digest: Any) -> str:
    return str(digest)[:16] if digest else "not verified"


def _spec_text(spec: Mapping[str, Any] | None) -> str:
    spec = spec or {}
    if not spec.get("algorithm"):
        return "no speculative decoding"
    out = f"{spec.get('algorithm')} block {spec.get('block_size')}, draft tokens {spec.get('max_draft_tokens')}"
    return out + (f", tree budget {spec['tree_budget']}" if spec.get("tree_budget") is not None else "")


def _plan_text(p: Mapping[str, Any]) -> str:
    shape = (f"tp {p.get('tp_size')} x {p.get('replicas')} replica(s) through the gateway"
             if p.get("topology") == "gateway" else f"tp {p.get('tp_size')} x dp {p.get('replicas')} (one process)")
    return f"{shape}, {_spec_text(p.get('speculative'))}, sglang {p.get('engine')}"


def _venv_text(what: str, v: Mapping[str, Any] | None) -> str:
    if not v:
        return "lock not compared"
    state = "in sync with" if v["in_sync"] else "OUT OF its lock"
    return f"{what} at {v['venv']}, {state} {v['lock_file']} (sha256 {str(v['lock_sha256'])[:16]})"


def _replica_text(r: Mapping[str, Any]) -> str:
    head = (f"replica {r['index']}: {r['name']}" if r["index"] is not None else f"engine: {r['name']}")
    route = ("" if r["routed"] is None else
             f", routed ({(r['route'] or {}).get('status')}, "
             f"{'healthy' if (r['route'] or {}).get('healthy') else 'UNHEALTHY'})"
             if r["routed"] else ", NOT routed by the gateway")
    health = r["health"]["status"] or r["health"]["error"] or "no answer"
    unit = UNIT_WORDS[r["unit_file"]]
    return (f"{head} {r['ActiveState']}/{r['UnitFileState'] or '?'}{route}, /health {health}, {unit}"
            + (f", deployed {r['deployed_at']}" if r["deployed_at"] else "")
            + ("" if r["planned"] else ", beyond the plan"))


def lines(rep: Mapping[str, Any], groups: Sequence[str] = ()) -> list[str]:
    """The view of one host for people, one line per concern (the JSON document holds the same)."""
    named = [g for g in groups if g not in ("proxmox_containers", "all", "ungrouped")]
    head = f"{rep['host']}" + (f" ({', '.join(named)})" if named else "")
    out = [f"{head}: " + (f"DRIFTED, a deploy would change {len(rep['drift'])} thing(s)" if rep["drifted"]
                          else "as the inventory says: a deploy would change nothing")]
    eng = rep["engine"]
    out.append(f"engine: {_venv_text(str(eng['name']) + ' ' + str(eng['version']), eng['lock'])}")
    gw = rep.get("gateway")
    if gw:
        out.append(f"gateway: {_venv_text('smg ' + str(gw['version']), gw['lock'])}; {gw['name']} "
                   f"{gw['ActiveState']}/{gw['UnitFileState'] or '?'}, /health "
                   f"{gw['health']['status'] or gw['health']['error'] or 'no answer'}, "
                   f"{UNIT_WORDS[gw['unit_file']]}, "
                   f"deployed {gw['deployed_at'] or 'never'}, "
                   + (f"routes to {len(gw['routes'])} worker(s)" if gw["routes_read"] else "routes not read"))
    plan = rep["plan"]
    out.append("plan in force: " + (_plan_text(plan["in_force"]) + ("" if plan["in_force"].get("running")
                                                                    else " (not running)")
                                    if plan["in_force"] else "none (no deployment record)"))
    if plan["inventory"]:
        out.append("inventory's plan: " + ("the same" if not plan["changes"] else
                                           f"{_plan_text(plan['inventory'])}; differs in {len(plan['changes'])} "
                                           "way(s), each under drift"))
    out += [_replica_text(r) for r in rep["replicas"]]
    served = rep["models"]["served"]
    if served:
        out.append("models: " + ", ".join(f"{role} {m['path']} manifest {_short(m['manifest_sha256'])}"
                                          for role, m in served.items()))
    for name, load in rep["load"]["replicas"].items():
        out += [f"load gate of {name} ({load['at']}, {age_text(load['age_s'])}): {line.strip().removeprefix('load ')}"
                for line in summary.load_lines({"figures": load["figures"]}, "")]
    if rep["load"]["gateway"]:
        g = rep["load"]["gateway"]
        out += [f"load gate through the gateway ({g['at']}, {age_text(g['age_s'])}): "
                f"{line.strip().removeprefix('load ')}"
                for line in summary.load_lines({"figures": g["figures"]}, "")]
    lock = rep["lock"]
    if lock:
        beat = (f"heartbeat {age_text(lock['heartbeat_age_s'])}" + (", stale" if lock["stale"] else "")
                if lock["heartbeat"] else "heartbeat not read")
        out.append(f"deploy lock: held by {lock['describe']}, {age_text(lock['age_s'])}; {beat}")
    else:
        out.append("deploy lock: free")
    out += [f"note: {n}" for n in rep["notes"]]
    out += [f"drift: {d}" for d in rep["drift"]]
    return out


__all__ = ["MARKER_BEGIN", "MARKER_END", "age_s", "argv_changes", "candidates", "document", "extract", "lines",
           "plan_changes", "plan_summary", "report", "venv_summary"]
