"""Serving through the gateway, on the host: one engine unit per replica and the order a redeploy touches them.

Each replica of a gateway plan (dflash_infra.planning.gateway) runs as its own full unit, `<stem>-r<i>.service`,
with its own environment file and its own state folder (record, unit snapshots, last good unit), so one replica
rolls back alone to its own last good unit. The names are fixed by index, so host_state can read every slot a
host may have (at most one per GPU) before the plan exists.

`rollout` decides, from host_state and the units the plan wants, what a deploy does and in which order:
  - the legacy single-process unit (`--dp-size` over every GPU, or the team's old hand-made one of the same name)
    is backed up, stopped and disabled before the first replica starts: it holds every GPU's memory;
  - replicas that do not run are started first (capacity before anything leaves the gateway), then the replicas
    whose unit changed are restarted one at a time: out of the gateway, restarted, gated, back in;
  - replica units beyond the plan's count (a plan with fewer replicas) are taken out, stopped and disabled;
  - `outage` says up front when the endpoint cannot stay up: a single replica that must restart, or a migration
    (the old process must stop before a replica can start).
Pure functions of their arguments: the roles call them through filters, tests call them directly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_infra import host_state, serving

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


def _present(state: Mapping[str, Any], unit: str, unit_path: str) -> bool:
    """The unit is there in any way a deploy must deal with: its file, running, or enabled at boot."""
    props = _props(state, unit)
    return (bool(host_state.path_entry(state, unit_path).get("exists"))
            or props.get("ActiveState") in ("active", "activating", "reloading", "deactivating")
            or props.get("UnitFileState") == "enabled")


def rollout(state: Mapping[str, Any], wanted: Sequence[Mapping[str, Any]], legacy: Sequence[Mapping[str, str]],
            all_slots: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a gateway deploy does to the engine units of one host, in order (see the module's docstring).

    wanted: per planned replica, in index order: `index`, `name` (its unit), `unit` (the unit file's path) and
    `unit_sha256` / `env_sha256` (of the unit and environment file the plan renders; env path `env_file`).
    legacy: units of the single-process topology, each `name` and `unit` (its file's path).
    all_slots: every replica slot (`slots`): those beyond `wanted` are retired when present.
    """
    indexes = [int(w["index"]) for w in wanted]
    if indexes != list(range(len(wanted))):
        raise RolloutError(f"replicas: expected indexes 0..{len(wanted) - 1} in order, found {indexes}")
    if not wanted:
        raise RolloutError("replicas: a gateway plan has at least one replica, found none")
    migrate = [{"name": u["name"], "unit": u["unit"], "active": _props(state, u["name"]).get("ActiveState") == "active",
                "enabled": _props(state, u["name"]).get("UnitFileState") == "enabled"}
               for u in legacy if _present(state, u["name"], u["unit"])]
    replicas = []
    for w in wanted:
        props = _props(state, str(w["name"]))
        running = props.get("ActiveState") == "active"
        changed = not (host_state.file_matches(state, str(w["unit"]), str(w["unit_sha256"]), "0644", "root", "root")
                       and host_state.file_matches(state, str(w["env_file"]), str(w["env_sha256"]), "0600", "root",
                                                   "root"))
        action = "start" if not running else "restart" if changed else "keep"
        replicas.append({"index": w["index"], "name": w["name"], "action": action, "changed": changed,
                         "drain": action == "restart", "enable": props.get("UnitFileState") != "enabled"})
    # Capacity first: replicas that are down start before any running one leaves the gateway.
    order = ([r["index"] for r in replicas if r["action"] == "start"]
             + [r["index"] for r in replicas if r["action"] == "restart"])
    retire = [{"index": s["index"], "name": s["name"], "unit": s["unit"]} for s in all_slots[len(wanted):]
              if _present(state, str(s["name"]), str(s["unit"]))]
    # One at a time, the down ones started first: while one restarts, every other replica serves.
    restarts = [r for r in replicas if r["action"] == "restart"]
    if migrate and any(m["active"] for m in migrate):
        active = ", ".join(str(m["name"]) for m in migrate if m["active"])
        outage = (f"{active} serves every GPU and must stop before the first replica starts: the endpoint is down "
                  "until replica 0 passes its gates")
    elif restarts and len(replicas) == 1:
        outage = (f"{restarts[0]['name']} is the only replica: the endpoint is down while it restarts "
                  "(an outage that one replica cannot avoid)")
    else:
        outage = ""
    return {"replicas": replicas, "order": order, "migrate": migrate, "retire": retire, "outage": outage,
            "any": bool(order or migrate or retire or any(r["enable"] for r in replicas))}


def summary_lines(plan: Mapping[str, Any]) -> list[str]:
    """What `rollout` decided, one line per unit it touches (for --check and the run's summary)."""
    lines = [f"{m['name']}: back up, stop and disable (the single-process unit; replicas replace it)"
             for m in plan["migrate"]]
    by_index = {r["index"]: r for r in plan["replicas"]}
    for index in plan["order"]:
        r = by_index[index]
        lines.append(f"{r['name']}: " + ("start (not running)" if r["action"] == "start" else
                                        "drain from the gateway, restart on the new unit, gate, add back"))
    lines += [f"{r['name']}: drain, stop and disable (beyond the plan's {len(plan['replicas'])} replica(s))"
              for r in plan["retire"]]
    lines += [f"{r['name']}: unchanged" for r in plan["replicas"] if r["action"] == "keep"]
    if plan["outage"]:
        lines.append(f"outage: {plan['outage']}")
    return lines


__all__ = ["MAX_REPLICAS", "RolloutError", "replica_paths", "replica_unit", "rollout", "slots", "summary_lines"]
