"""Preflight: the host is what its inventory group says, before anything on it is changed.

The wrong-container incident (the A6000 box taken for the PRO 6000 one) is refused here with a message
naming both, never discovered later by an engine crash.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

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


def port_problems(host: str, port: int, listeners: Sequence[Mapping[str, Any]], own_pids: Sequence[int]) -> list[str]:
    """The engine port must be free or held by our own unit (an unmanaged duplicate server is refused)."""
    strangers = [entry for entry in listeners if int(entry.get("pid") or 0) not in set(own_pids)]
    if not strangers:
        return []
    who = ", ".join(f"{e.get('process') or '?'} (pid {e.get('pid') or '?'})" for e in strangers)
    return [f"{host}: port {port} is held by {who}, which is not the engine service this deploy manages. "
            "Stop that server (or choose another dflash_service_port) and re-run."]


def parse_ss_listeners(text: str) -> list[dict[str, Any]]:
    """`ss -Hltnp` lines -> [{local, process, pid}] (users:(("python3",pid=123,fd=7)))."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        users = line[line.find("users:"):] if "users:" in line else ""
        process = users.split('"')[1] if users.count('"') >= 2 else None
        pid = None
        if "pid=" in users:
            pid = int(users.split("pid=")[1].split(",")[0].rstrip(")"))
        out.append({"local": fields[3], "process": process, "pid": pid})
    return out
