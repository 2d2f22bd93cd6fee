"""Preflight: the host is what its inventory group says, before anything on it is changed.

The wrong-container incident (the A6000 box taken for the PRO 6000 one) is refused here with a message
naming both, never discovered later by an engine crash.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

# nvidia-smi reports memory.total a few MiB apart across driver builds and board revisions; ECC moves it
# by several GiB (an A6000 shows 46068 MiB with ECC on, 49140 MiB off), which must be noticed.
MEMORY_TOLERANCE = 0.01


def describe(gpus: Sequence[Mapping[str, Any]]) -> str:
    """'2x NVIDIA RTX A6000 (49140 MiB)' for a GPU list; mixed lists are listed per model."""
    if not gpus:
        return "no GPU visible to nvidia-smi"
    counts = Counter((str(g.get("name")), g.get("memory_total_mib")) for g in gpus)
    return ", ".join(f"{n}x {name} ({mib} MiB)" for (name, mib), n in counts.items())


def expected_text(hardware: Mapping[str, Any]) -> str:
    return f"{hardware['gpu_count']}x {hardware['gpu_name']} ({hardware['memory_total_mib']} MiB)"


def hardware_problems(host: str, group: str, hardware: Mapping[str, Any],
                      gpus: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the probed GPUs are not the group's expected hardware (empty when they are).

    The GPU name must start with the expected model name (editions such as 'Workstation Edition' may
    follow), the count must be equal and memory within MEMORY_TOLERANCE; compute capability must match
    when both sides give it.
    """
    want_name = str(hardware["gpu_name"])
    want_count = int(hardware["gpu_count"])
    want_mib = int(hardware["memory_total_mib"])
    want_cc = str(hardware.get("compute_cap") or "")
    wrong = [g for g in gpus if not str(g.get("name", "")).startswith(want_name)
             or abs(int(g.get("memory_total_mib") or 0) - want_mib) > want_mib * MEMORY_TOLERANCE
             or (want_cc and g.get("compute_cap") and str(g["compute_cap"]) != want_cc)]
    if len(gpus) == want_count and not wrong:
        return []
    return [f"{host} has {describe(gpus)}; group {group} expects {expected_text(hardware)}"
            + (f", compute capability {want_cc}" if want_cc else "")
            + ". Refusing to deploy. Check -l / inventory."]


def identity_problems(host: str, hardware: Mapping[str, Any], identity: Mapping[str, Any]) -> list[str]:
    """Why the host's GPUs are not its group's, from nvidia-smi or, when NVML cannot run (a driver/library
    mismatch), from the kernel module's /proc information files: model and count only, memory unreadable."""
    source = str(identity.get("source") or "none")
    gpus = list(identity.get("gpus") or [])
    group = str(hardware.get("group") or "?")
    if source == "nvidia-smi":
        return hardware_problems(host, group, hardware, gpus)
    if not gpus:
        return [f"{host}: no GPU is visible, neither to nvidia-smi nor in /proc/driver/nvidia/gpus; group {group} "
                f"expects {expected_text(hardware)}. Refusing to deploy. Check the container's GPU passthrough."]
    want_name = str(hardware["gpu_name"])
    names = Counter(str(g.get("name")) for g in gpus)
    if len(gpus) == int(hardware["gpu_count"]) and all(n.startswith(want_name) for n in names):
        return []
    found = ", ".join(f"{n}x {name}" for name, n in names.items())
    return [f"{host} has {found} (read from {source}: nvidia-smi cannot run); group {group} expects "
            f"{expected_text(hardware)}. Refusing to deploy. Check -l / inventory."]


# NCCL keeps its intra-node buffers in /dev/shm; container runtimes default to 64 MiB, which breaks TP > 1.
MIN_SHM_BYTES_PER_RANK = 512 * 1024 * 1024


def shm_problems(host: str, tp: int, shm_bytes: int | None) -> list[str]:
    """Whether /dev/shm can hold NCCL's buffers for a TP group of this size."""
    if tp <= 1:
        return []
    need = tp * MIN_SHM_BYTES_PER_RANK
    if shm_bytes is None:
        return [f"{host}: tp {tp} needs a /dev/shm for NCCL, found none mounted. Mount a tmpfs of at least "
                f"{need // 2**20} MiB (LXC: lxc.mount.entry for /dev/shm) and re-run."]
    if shm_bytes < need:
        return [f"{host}: tp {tp} needs at least {need // 2**20} MiB of /dev/shm for NCCL, found "
                f"{shm_bytes // 2**20} MiB. Enlarge the container's /dev/shm and re-run."]
    return []


# Listen addresses that take a port on every address.
WILDCARDS = ("0.0.0.0", "[::]", "::", "*", "")


def _address(local: str) -> str:
    """The address part of 'address:port' (IPv6 in brackets)."""
    return local.rsplit(":", 1)[0] if ":" in local else local


def overlaps(listen: str, local: str) -> bool:
    """Whether a socket bound to `local` (address:port) takes the port from an engine listening on `listen`: the
    same address, or a wildcard on either side (one network namespace may carry other hosts' addresses)."""
    theirs = _address(local)
    return listen in WILDCARDS or theirs in WILDCARDS or theirs == listen or theirs.strip("[]") == listen.strip("[]")


def holder_problems(host: str, port: int, holders: Sequence[Mapping[str, Any]], unit: str | Sequence[str],
                    listen: str = "", setting: str = "dflash_service_port") -> list[str]:
    """The port's listeners (dflash_host_state: pid, process, unit, local) that would take it from the service
    listening on `listen` must all belong to the unit(s) this deploy runs there; `setting` is where the port is
    chosen, for the way out."""
    units = [unit] if isinstance(unit, str) else list(unit)
    strangers = [h for h in holders if h.get("unit") not in units and overlaps(listen, str(h.get("local") or ""))]
    if not strangers:
        return []
    who = ", ".join(f"{h.get('process') or 'a process of another PID namespace'} (pid {h.get('pid') or '?'}"
                    + (f", unit {h['unit']}" if h.get("unit") else "") + f", on {h.get('local')})" for h in strangers)
    ours = (f"the engine service this deploy manages ({units[0]})" if len(units) == 1
            else f"a service this deploy runs there ({', '.join(units)})")
    return [f"{host}: port {port} is held by {who}, which is not {ours}. Stop that server (or choose another "
            f"{setting}) and re-run."]


def _holders(state: Mapping[str, Any], port: int) -> list[Mapping[str, Any]]:
    return list((state.get("ports") or {}).get(str(port)) or [])


def serving_problems(host: str, state: Mapping[str, Any], tp: int, port: int, unit: str, listen: str = "",
                     replicas: Sequence[Mapping[str, Any]] = (), gateway_unit: str = "",
                     gateway_ports: Sequence[tuple[int, str]] = ()) -> list[str]:
    """Host checks that need the plan: /dev/shm for the TP group's NCCL buffers and the ports. Without a gateway
    the endpoint's port is the engine unit's; behind one it is the gateway's (or the single-process unit's, which
    the deploy migrates), each replica's port its own unit's (`name`, `host`, `port`), and the gateway's other
    ports (metrics: port and the address it listens on) the gateway's."""
    shm = (state.get("system") or {}).get("shm") or {}
    shm_bytes = shm.get("size_bytes") if shm.get("mounted") else None
    problems = shm_problems(host, int(tp), shm_bytes)
    if not replicas:
        if gateway_unit and any(h.get("unit") == gateway_unit for h in _holders(state, port)):
            return [*problems, f"{host}: port {port} is held by {gateway_unit}: this host serves through the SGLang "
                    "Model Gateway, and this plan is one engine process on that port. Serve through the gateway "
                    "again (dflash_serve_through_gateway: true for its group), or stop serving first "
                    f"(ansible-playbook playbooks/stop_serving.yml -l {host}) and re-run."]
        return problems + holder_problems(host, int(port), _holders(state, port), unit, listen)
    problems += holder_problems(host, int(port), _holders(state, port), [gateway_unit, unit], listen)
    for r in replicas:
        problems += holder_problems(host, int(r["port"]), _holders(state, int(r["port"])), str(r["name"]),
                                    str(r["host"]), "dflash_gateway_settings.worker_base_port")
    for extra, extra_host in gateway_ports:
        problems += holder_problems(host, int(extra), _holders(state, int(extra)), gateway_unit, str(extra_host),
                                    "dflash_gateway_settings.prometheus_port")
    return problems


def endpoint_problems(host: str, listen: str, port: int, api_key_set: bool, allow_anonymous: bool,
                      setting: str = "dflash_service_listen") -> list[str]:
    """An endpoint beyond loopback must ask its callers for an API key, unless serving anonymously was chosen.
    `setting`: the inventory variable that chose `listen` (the replicas of a host another host's gateway fronts
    listen on dflash_worker_listen)."""
    try:
        loopback = ipaddress.ip_address(str(listen)).is_loopback
    except ValueError:
        loopback = str(listen) == "localhost"
    if loopback or api_key_set or allow_anonymous:
        return []
    return [f"{host}: the endpoint would listen on {listen}:{port}, beyond loopback, with no API key: anyone who can "
            f"reach {host} could use the model and its admin API. Put a key in ansible-vault as "
            "vault_dflash_service_api_key (docs/serving.md, \"API keys\"), listen on loopback only "
            f"({setting}), or set dflash_service_allow_anonymous: true to serve without a key on purpose."]
