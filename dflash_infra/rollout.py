"""Serving through the gateway, on the host: one engine unit per replica and the order a redeploy touches them.

Each replica of a gateway plan (dflash_infra.planning.gateway) runs as its own full unit, `<stem>-r<i>.service`,
with its own environment file and its own state folder (record, unit snapshots, last good unit), so one replica
rolls back alone to its own last good unit. The names are fixed by index, so host_state can read every slot a
host may have (at most one per GPU) before the plan exists.

`rollout` decides, from host_state and the units the plan wants, what a deploy does and in which order:
  - the legacy single-process unit (`--dp-size` over every GPU, or the team's old hand-made one of the same name)
    is backed up, stopped and disabled before the first replica starts: it holds every GPU's memory;
  - replicas that do not run are started first (capacity before anything leaves the gateway), then the running
    ones take their turn one at a time; the sglang_service role decides whether a replica's unit changed, and one
    that did is taken out of the gateway, restarted, gated and put back;
  - replica units beyond the plan's count (a plan with fewer replicas) are taken out, stopped and disabled;
  - `outage` says up front when a migration cannot keep the endpoint up (the old process must stop before a
    replica can start); `single_outage` what a single replica's restart costs, said when its turn comes.
Pure functions of their arguments: the roles call them through filters, tests call them directly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_infra import host_state, serving
from dflash_infra.planning import gateway

MAX_REPLICAS = 8  # one per GPU at most: host_state lists this many slots up front
_STEM = re.compile(r"^[A-Za-z0-9@_.:-]+$")


class RolloutError(ValueError):
    """Replica units that cannot be named or rolled out (the message says what was expected and found)."""


def replica_unit(service_name: str, index: int) -> str:
    """The unit of replica `index` of the engine service (sglang-qwen.service -> sglang-qwen-r0.service)."""
    if not str(service_name).endswith(".service") or not _STEM.match(str(service_name)[: -len(".service")]):
        raise RolloutError(f"engine service name: expected a systemd unit name ending in .service, found "
                           f"{service_name!r}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_REPLICAS:
        raise RolloutError(f"replica index: expected 0-{MAX_REPLICAS - 1}, found {index!r}")
    return f"{str(service_name)[: -len('.service')]}-r{index}.service"


def replica_paths(service_name: str, index: int, env_dir: str, state_dir: str, libexec_dir: str) -> dict[str, Any]:
    """serving.service_paths of one replica: its unit, its environment file, and its own state folder under the
    host's (`<state_dir>/<replica stem>`: record, unit snapshots, last good unit); the helpers are shared."""
    unit = replica_unit(service_name, index)
    paths = serving.service_paths(unit, env_dir, f"{state_dir}/{unit[: -len('.service')]}", libexec_dir)
    return {**paths, "index": index, "name": unit}


def slots(service_name: str, env_dir: str, state_dir: str, libexec_dir: str,
          count: int = MAX_REPLICAS) -> list[dict[str, Any]]:
    """Every replica slot a host may have, in index order (what host_state reads before the plan exists)."""
    return [replica_paths(service_name, i, env_dir, state_dir, libexec_dir) for i in range(count)]


def _props(state: Mapping[str, Any], unit: str) -> Mapping[str, Any]:
    return (state.get("units") or {}).get(unit) or {}


def _present(state: Mapping[str, Any], unit: str) -> bool:
    """The unit runs or starts at boot: what a deploy must stop and disable (a stopped, disabled unit file, as a
    migration leaves it with its record, is left alone)."""
    props = _props(state, unit)
    return (props.get("ActiveState") in ("active", "activating", "reloading", "deactivating")
            or props.get("UnitFileState") == "enabled")


def present_units(state: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The named units that run or start at boot, in the given order (what playbooks/stop_serving.yml stops)."""
    return [str(n) for n in names if _present(state, str(n))]


def served_url(url: str, deployment: Any) -> str:
    """Where the gateway reaches a replica while `deployment` (a record, or its `previous`) runs: the slot's URL with
    the scheme that deployment serves (plan.serve.tls; a record from before TLS serves plain HTTP). A deploy that
    turns a replica's TLS on or off changes only the scheme: its turn drains the URL it is served at now and adds it
    back at the new one. No deployment: the URL as planned."""
    serve = _serve(deployment)
    if serve is None or "://" not in url:
        return url
    return ("https" if serve.get("tls") is True else "http") + url[url.index("://"):]


def _serve(deployment: Any) -> Mapping[str, Any] | None:
    """A deployment record's plan.serve (how its unit serves); None where it names none."""
    plan = deployment.get("plan") if isinstance(deployment, Mapping) else None
    serve = plan.get("serve") if isinstance(plan, Mapping) else None
    return serve if isinstance(serve, Mapping) else None


def _record(state: Mapping[str, Any], slot: Mapping[str, Any]) -> dict[str, Any]:
    found = host_state.path_entry(state, str(slot.get("record") or "")).get("json")
    return dict(found) if isinstance(found, Mapping) else {}


def rollout(state: Mapping[str, Any], wanted: Sequence[Mapping[str, Any]], legacy: Sequence[Mapping[str, str]],
            all_slots: Sequence[Mapping[str, Any]], slot_urls: Sequence[str] = (),
            shared: bool = False) -> dict[str, Any]:
    """What a gateway deploy does to the engine units of one host, in order (see the module's docstring).

    wanted: per planned replica, in index order: `index`, `name` (its unit) and `url` (where the gateway reaches
    it once this deploy converged it; each replica's `from_url` is where its recorded deployment is reached now,
    which its turn drains: `served_url`). Whether a running replica's unit changed is the sglang_service role's
    comparison, made as its turn comes: a replica that changed is drained, restarted, gated and added back; one that
    did not is only checked.
    legacy: units of the single-process topology, each `name` and `unit` (its file's path).
    all_slots: every replica slot (`slots`): those beyond `wanted` are retired when they run or start at boot.
    slot_urls: where the gateway reaches each slot (`state_inputs`' urls), to take a retired one out of it.
    shared: other hosts' replicas serve behind the same gateway (a serving group of several hosts), so one replica
    of this host restarting is no outage.
    """
    indexes = [int(w["index"]) for w in wanted]
    if indexes != list(range(len(wanted))):
        raise RolloutError(f"replicas: expected indexes 0..{len(wanted) - 1} in order, found {indexes}")
    if not wanted:
        raise RolloutError("replicas: a gateway plan has at least one replica, found none")
    migrate = [{"name": u["name"], "unit": u["unit"], "active": _props(state, u["name"]).get("ActiveState") == "active",
                "enabled": _props(state, u["name"]).get("UnitFileState") == "enabled"}
               for u in legacy if _present(state, u["name"])]
    replicas = []
    for w in wanted:
        running = _props(state, str(w["name"])).get("ActiveState") == "active"
        slot = all_slots[int(w["index"])] if int(w["index"]) < len(all_slots) else {}
        replicas.append({"index": w["index"], "name": w["name"], "url": w.get("url", ""),
                         "from_url": served_url(str(w.get("url", "")), _record(state, slot)),
                         "action": "roll" if running else "start"})
    # Capacity first: replicas that are down start before any running one may leave the gateway; the running ones
    # follow one at a time, so while one restarts every other replica serves.
    order = ([r["index"] for r in replicas if r["action"] == "start"]
             + [r["index"] for r in replicas if r["action"] == "roll"])
    retire = [{"index": s["index"], "name": s["name"], "unit": s["unit"],
               "url": slot_urls[int(s["index"])] if int(s["index"]) < len(slot_urls) else ""}
              for s in all_slots[len(wanted):] if _present(state, str(s["name"]))]
    if migrate and any(m["active"] for m in migrate):
        active = ", ".join(str(m["name"]) for m in migrate if m["active"])
        outage = (f"{active} serves every GPU and must stop before the first replica starts: the endpoint is down "
                  "until the replicas and the gateway pass their gates")
    else:
        outage = ""
    # One replica that restarts leaves nothing serving: said as its turn comes (only the role knows it changed).
    single = (f"{replicas[0]['name']} is the only replica: the endpoint is down while it restarts "
              "(an outage that one replica cannot avoid)") if len(replicas) == 1 and not outage and not shared else ""
    return {"replicas": replicas, "order": order, "migrate": migrate, "retire": retire, "outage": outage,
            "single_outage": single}


def summary_lines(plan: Mapping[str, Any]) -> list[str]:
    """What `rollout` decided, one line per unit it touches (for --check and the run's summary)."""
    lines = [f"{m['name']}: back up, stop and disable (the single-process unit; replicas replace it)"
             for m in plan["migrate"]]
    by_index = {r["index"]: r for r in plan["replicas"]}
    for index in plan["order"]:
        r = by_index[index]
        lines.append(f"{r['name']}: " + ("start (not running)" if r["action"] == "start" else
                                        "when its unit changed: drain from the gateway, restart, gate, add back"))
    lines += [f"{r['name']}: drain, stop and disable (beyond the plan's {len(plan['replicas'])} replica(s))"
              for r in plan["retire"]]
    if plan["outage"]:
        lines.append(f"outage: {plan['outage']}")
    return lines


def state_inputs(all_slots: Sequence[Mapping[str, Any]], settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """What host_state reads of every replica slot before the plan exists: each unit file, state folder (record)
    and snapshots folder, the units, each slot's port and /health where the gateway reaches it, and the
    gateway's metrics port (settings: the request's gateway section, planner defaults under it). `urls` are where
    the gateway reaches each slot, `health` where the host itself does."""
    merged = {**gateway.DEFAULTS, **(settings or {})}
    routed = gateway.Gateway(merged, "", 0)
    files: list[dict[str, Any]] = []
    for s in all_slots:
        files += [{"path": s["unit"]}, {"path": s["state_dir"], "children": True},
                  {"path": s["units_dir"], "children": True}]
    urls = [routed.worker_url(int(s["index"])) for s in all_slots]
    return {"files": files, "units": [s["name"] for s in all_slots], "urls": urls,
            "ports": [routed.worker_port(int(s["index"])) for s in all_slots] + [int(merged["prometheus_port"])],
            "health": [{"url": routed.local_url(int(s["index"])) + "/health", "timeout": 3} for s in all_slots]}


SCOPES = ("deploy", "measure", "canary")


def gateway_topology(host: str, gateway_host: str, fronted_by: Mapping[str, str], play_hosts: Sequence[str],
                     through_gateway: bool, scope: str = "deploy") -> list[str]:
    """What stops a run of `host` in a serving group of several hosts, before anything changes.

    fronted_by: every container of the inventory -> the host whose gateway fronts its replicas (its
    dflash_gateway_host; itself for a host with its own gateway). scope: what the run does (dflash_run_scope).
    - deploy: a host fronted by another host's gateway is drained there as its replicas roll, so that gateway's host
      is in the run; a gateway host's workers include every host it fronts, so they are all in the run (a gateway
      restarted without them would stop serving them);
    - measure (playbooks/benchmark.yml): the endpoint is measured where it is, on the gateway's host, which may run
      alone (the gateway is not changed); a host another host's gateway fronts has no endpoint to measure;
    - canary (playbooks/canary.yml): a group of one host only, for now: a promotion rolls the canary host's replicas,
      and those of the other hosts would stay on the baseline."""
    if scope not in SCOPES:
        return [f"{host}: dflash_run_scope: expected one of {', '.join(SCOPES)}, found {scope!r}"]
    if not through_gateway:
        return [] if gateway_host == host else [
            f"{host}: dflash_gateway_host is {gateway_host}, but {host} serves without the gateway "
            "(dflash_serve_through_gateway: false); set both or neither"]
    if gateway_host not in fronted_by:
        return [f"{host}: dflash_gateway_host {gateway_host!r} is not a container of the inventory "
                f"(expected one of {', '.join(sorted(fronted_by))})"]
    if gateway_host != host and fronted_by[gateway_host] != gateway_host:
        return [f"{host}: dflash_gateway_host is {gateway_host}, whose own replicas are fronted by "
                f"{fronted_by[gateway_host]}: a gateway host runs its own gateway; point {host} at "
                f"{fronted_by[gateway_host]}"]
    peers = sorted(h for h, g in fronted_by.items() if g == gateway_host and h != gateway_host)
    if scope == "canary" and peers:
        return [f"{host}: its endpoint is served by the replicas of {', '.join([gateway_host, *peers])} behind "
                f"{gateway_host}'s gateway; a canary's promotion would leave the other hosts' replicas on the "
                "baseline. Try candidates on a serving group of one host, then deploy the winner to the group"]
    if scope == "measure" and gateway_host != host:
        return [f"{host}: its replicas are served by {gateway_host}'s gateway, which is the endpoint to measure; run "
                f"with -l {gateway_host}"]
    if gateway_host != host:
        if gateway_host not in play_hosts:
            return [f"{host}: its replicas are served by {gateway_host}'s gateway, which is not in this run; run with "
                    f"-l {gateway_host},{host} (or their groups), so each replica is drained there as it rolls"]
        return []
    missing = [h for h in peers if h not in play_hosts]
    if missing and scope == "deploy":
        return [f"{host}: its gateway also fronts the replicas of {', '.join(missing)}, not in this run; run with "
                f"-l {','.join([host, *missing])} (or their groups), so the gateway's workers are all known"]
    return []


def replica_plan(plan: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The plan as the sglang_service role runs one replica from it: the replica's argv, GPUs and listen address
    (the endpoint, its served model name, the speculative settings and the sizing stay the plan's)."""
    replicas = plan.get("replicas") or []
    if not 0 <= int(index) < len(replicas):
        raise RolloutError(f"replica {index}: the plan has {len(replicas)} replica(s)")
    r = replicas[int(index)]
    serve = {**(plan.get("serve") or {}), "host": r["host"], "port": r["port"], "tls": bool(r.get("tls"))}
    return {**plan, "args": list(r["args"]), "gpu_ids": list(r["gpu_ids"]), "dp_size": 1, "serve": serve,
            "replica": {"index": r["index"], "url": r["url"], "gpu_ids": list(r["gpu_ids"])}}


def tls_leftovers(state: Mapping[str, Any], all_slots: Sequence[Mapping[str, Any]],
                  serving_plan: Mapping[str, Any]) -> list[str]:
    """The certificate and key files of the plan's replicas that serve without HTTPS now (worker TLS turned off) and
    are still on the host: the serve stage removes them once every gate of the run passed, the load gate through the
    gateway included, since until then the unit a failed gate puts back may load them."""
    from dflash_infra import host_state

    slots = [all_slots[int(r["index"])] for r in serving_plan.get("replicas") or [] if not r.get("tls")]
    return [slot[f"tls_{part}"] for slot in slots for part in ("cert", "key")
            if host_state.path_entry(state, slot[f"tls_{part}"]).get("exists")]


def turns(plan: Mapping[str, Any], all_slots: Sequence[Mapping[str, Any]],
          serving_plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The running replicas of a rollout (`plan`: what `rollout` returned) as the sglang_service role takes them,
    in their order: index, unit name, paths (`all_slots`' entry) and the replica's plan (`replica_plan`). A replica
    that must start is left out: it cannot be converged."""
    by_index = {int(r["index"]): r for r in plan["replicas"]}
    return [{"index": i, "name": all_slots[i]["name"], "paths": all_slots[i],
             "plan": replica_plan(serving_plan, i)} for i in (int(x) for x in plan["order"])
            if by_index[i]["action"] == "roll"]


def converged_notes(state: Mapping[str, Any], indexes: Sequence[int], plan: Mapping[str, Any],
                    all_slots: Sequence[Mapping[str, Any]], serving_plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The summary's entry of each replica that took no turn (`indexes`: found converged): unchanged, not drained,
    with the gates and time of its deployment record as host_state read it."""
    from dflash_infra import host_state  # the state's readers

    by_index = {int(r["index"]): r for r in plan["replicas"]}
    out = []
    for i in (int(x) for x in indexes):
        record = host_state.path_entry(state, all_slots[i]["record"]).get("json") or {}
        out.append({"index": i, "name": all_slots[i]["name"], "url": by_index[i]["url"], "action": "roll", "would": "",
                    "gpu_ids": replica_plan(serving_plan, i)["gpu_ids"], "restarted": False, "drained": False,
                    "gates": record.get("gates") or {}, "deployed_at": record.get("deployed_at") or "",
                    "load": record.get("load")})
    return out


def wanted(plan: Mapping[str, Any], service_name: str) -> list[dict[str, Any]]:
    """The plan's replicas as `rollout` takes them: index, unit name and the URL the gateway reaches it at."""
    return [{"index": r["index"], "name": replica_unit(service_name, int(r["index"])), "url": r["url"]}
            for r in plan.get("replicas") or []]


__all__ = ["MAX_REPLICAS", "RolloutError", "converged_notes", "gateway_topology", "present_units", "replica_paths",
           "replica_plan", "replica_unit", "rollback_turns", "rollout", "slots", "state_inputs", "summary_lines",
           "tls_leftovers", "turns", "wanted"]


def rollback_turns(state: Mapping[str, Any], all_slots: Sequence[Mapping[str, Any]], slot_urls: Sequence[str],
                   asked: Sequence[Any] | None = None, exactly: bool = False) -> dict[str, Any]:
    """The replicas an on-demand rollback puts back on their previous deployment (playbooks/rollback.yml
    -e dflash_rollback=replicas), one turn each: `turns` (index, name, `from_url` where the gateway reaches it now
    and `url` where its previous deployment serves (`served_url`), the previous deployment's time and unit snapshot,
    the current one's time) and `problems` (each naming the replica, what was expected and found).

    asked: the indices to roll back (`dflash_rollback_replicas`); None or empty: every replica that has a record,
    unless `exactly` (the replicas a run restarted, playbooks/tasks/rollback_restarted.yml): then none is none, with
    nothing to say. A replica without a record, or whose record names no previous deployment with a unit snapshot,
    is a problem when it was asked for, and left alone otherwise; asking for an index beyond the slots is a
    problem.
    """
    problems: list[str] = []
    wanted: list[int] | None = None
    if exactly and not asked:
        return {"turns": [], "problems": [], "lines": []}
    if asked:
        wanted = []
        for value in asked:
            if isinstance(value, bool) or not str(value).isdigit() or int(value) >= len(all_slots):
                problems.append(f"dflash_rollback_replicas: expected replica indices 0-{len(all_slots) - 1}, "
                                f"found {value!r}")
            else:
                wanted.append(int(value))
    turns = []
    for slot in all_slots:
        index = int(slot["index"])
        if wanted is not None and index not in wanted:
            continue
        record = _record(state, slot)
        previous = record.get("previous") if isinstance(record.get("previous"), Mapping) else None
        if not record or not previous or not previous.get("unit_backup"):
            if wanted is not None:
                found = ("no deployment record" if not record else
                         f"a record of {record.get('deployed_at') or '?'} that names no previous deployment with a "
                         "unit snapshot")
                problems.append(f"{slot['name']}: expected a deployment record naming a previous deployment to go "
                                f"back to, found {found}; nothing to roll back to")
            continue
        if not host_state.path_entry(state, str(previous["unit_backup"])).get("exists"):
            problems.append(f"{slot['name']}: expected the unit snapshot of its previous deployment at "
                            f"{previous['unit_backup']}, found nothing there; nothing to roll back to (its record "
                            "names a snapshot that was removed)")
            continue
        tls = serving.engine_tls_problem(state, slot, (_serve(previous) or {}).get("tls"))
        if tls:
            problems.append(f"{slot['name']}: expected the TLS certificate and key that the unit of its previous "
                            f"deployment ({previous.get('deployed_at') or '?'}) loads, found {tls}")
            continue
        url = slot_urls[index] if index < len(slot_urls) else ""
        turns.append({"index": index, "name": slot["name"], "from_url": served_url(url, record),
                      "url": served_url(url, previous),
                      "from": record.get("deployed_at") or "?", "to": previous.get("deployed_at") or "?",
                      "to_unit": previous["unit_backup"], "to_unit_sha256": previous.get("unit_sha256"),
                      "to_models": previous.get("models") or {}})
    if not turns and not problems:
        problems.append("no replica has a previous deployment to go back to (deployment.json's `previous` with a "
                        "unit snapshot): nothing to roll back")
    return {"turns": turns, "problems": problems,
            "lines": [f"{t['name']}: back from the deployment of {t['from']} to that of {t['to']} ({t['to_unit']})"
                      for t in turns]}


def reconcile(state: Mapping[str, Any], workers: Sequence[str], plan: Mapping[str, Any],
              all_slots: Sequence[Mapping[str, Any]], key_file: str, notes: Sequence[Mapping[str, Any]] = (),
              peers: Sequence[Mapping[str, Any]] = (), check: bool = False) -> dict[str, Any]:
    """What the gateway routes to against what the plan says it should (every run, on the gateway's host): a worker of
    the plan missing from the gateway (a replica drained by a run that died, or removed by hand) is added back; one
    the plan no longer has is removed. Decided from host_state's read of the gateway (`gateway`: its /workers).

    workers: the plan's workers (the gateway section's, with those of the hosts it fronts). plan: this run's
    `rollout` of this host (its replicas; a replica of this host is added with its environment file's key, read on
    the host, another host's with the endpoint's, `key_file`). notes: the replicas' notes of this run's turns, on every
    host the gateway fronts (serve_replica.yml): one that rolled was taken out and put back by its turn, one retired
    by the retirement (this host's `plan`, or the `rollout` of a host it fronts, `peers`), so neither is this step's.
    check: a --check run (the lines say what a run would do).
    Returns `read` (whether the gateway answered), `add` [{url, name, env_file, key_file (the worker's API key, one of
    the two)}], `remove` [url] and `lines`
    (what it does, for the run's output and --check)."""
    gw = state.get("gateway") or {}
    if not gw.get("asked"):
        return {"read": False, "add": [], "remove": [], "lines": []}
    if gw.get("status") != 200 or gw.get("error"):  # no answer, a refusal, or an answer that is not a workers list
        detail = gw.get("error") or f"answered {gw.get('status')}"
        return {"read": False, "add": [], "remove": [],
                "lines": [f"its workers were not read ({gw.get('url')}/workers: {detail}); a gateway that starts in "
                          "this run registers every worker of its command line"]}
    seen = {str(w.get("url") or "").rstrip("/") for w in gw.get("workers") or []}
    mine = {str(r["url"]).rstrip("/"): r for r in plan.get("replicas") or []}
    done = {str(n["url"]).rstrip("/") for n in notes if n.get("would") == "roll"}
    done |= {str(r["url"]).rstrip("/") for p in [plan, *peers] for r in p.get("retire") or []}
    wanted_urls = [str(u).rstrip("/") for u in workers]
    add = []
    for url in wanted_urls:
        if url in seen or url in done:
            continue
        replica = mine.get(url)
        # Where the worker's API key is read on the gateway's host (dflash_gateway_worker): a replica of this host
        # from its environment file, another host's the endpoint's, from the gateway's credentials.
        add.append({"url": url, "name": str(replica["name"]) if replica else url,
                    "env_file": str(all_slots[int(replica["index"])]["env_file"]) if replica else None,
                    "key_file": None if replica else key_file})
    remove = sorted(seen - set(wanted_urls) - done)
    added, removed = (("would be added back once ready (check mode)", "would be removed (check mode)") if check
                      else ("added back once ready", "removed"))
    lines = [f"{a['name']} ({a['url']}) is a worker of the plan the gateway does not route to: {added}" for a in add]
    lines += [f"{url} is routed to but not a worker of the plan: {removed}" for url in remove]
    return {"read": True, "add": add, "remove": remove, "lines": lines}


def rollback_models(recorded: Sequence[Mapping[str, Any]], models: Mapping[str, Mapping[str, Any]],
                    every: bool = False) -> list[dict[str, Any]]:
    """The model versions a rollback serves again, for dflash_model_sync's check_versions and promote: from the
    records' `models` (role -> {path: the version folder, manifest_sha256}), each with the catalogue's name and
    configured path. For promote, one entry per model (the first record's: one version of a model is the one in
    use). `every`, for the check before anything stops: every version folder any record names, replicas that go
    back to different versions included, and a model the catalogue no longer has (by its folder alone)."""
    out: dict[Any, dict[str, Any]] = {}
    for record_models in recorded:
        for role, m in (record_models or {}).items():
            if not isinstance(m, Mapping):
                continue
            model = models.get(role) or {}
            folder = str(m.get("path") or "")
            key = (role, folder) if every else role
            if key in out or not (model or (every and folder)):
                continue
            out[key] = {"name": model.get("name") or role, "path": model.get("path") or folder, "folder": folder,
                        "manifest_sha256": m.get("manifest_sha256")}
    return list(out.values())


def snapshot_problems(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The replicas whose unit snapshot cannot be put back, each with what was found (playbooks/rollback.yml, before
    any replica drains): Ansible's stat results of each turn's `<to_unit>/<name>`, with the turn as the item."""
    out = []
    for result in results:
        turn = result.get("item") or {}
        problem = serving.snapshot_unit_problem(result.get("stat") or {}, turn.get("to_unit_sha256"))
        if problem:
            out.append(f"{turn.get('name')} ({turn.get('to_unit')}/{turn.get('name')}): {problem}")
    return out
