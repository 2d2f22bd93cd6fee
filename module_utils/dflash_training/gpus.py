"""Who holds the GPUs: nvidia-smi's compute-process and GPU queries, read on the host, mapped to GPU indexes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .commands import Output, run
from .errors import TrainingError
from .procs import PROC, cgroup_path, unit_of

APPS_QUERY = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"
GPUS_QUERY = "--query-gpu=index,name,memory.total,uuid"
CSV = "--format=csv,noheader,nounits"


def _value(text: str) -> str | None:
    """A CSV cell; nvidia-smi prints '[N/A]', '[Not Supported]' and similar where it has no value."""
    text = text.strip()
    return None if not text or text.startswith("[") else text


def _int(text: str) -> int | None:
    value = _value(text)
    return int(value) if value is not None and value.isdigit() else None


def _rows(text: str, source: str) -> list[tuple[str, str, str, str]]:
    """(first, middle, next to last, last) of each line of a four-column query; the middle (a process or GPU
    name) may itself contain ', '."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split(", ")
        if len(cells) < 4:
            raise TrainingError(f"{source}: line {number}: expected 4 comma-separated fields, found {line.strip()!r}")
        rows.append((cells[0], ", ".join(cells[1:-2]), cells[-2], cells[-1]))
    return rows


def parse_apps(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid` (noheader, nounits)."""
    return [{"pid": _int(pid), "process_name": _value(name), "used_memory_mib": _int(mem), "gpu_uuid": _value(uuid)}
            for pid, name, mem, uuid in _rows(text, f"nvidia-smi {APPS_QUERY}")]


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=index,name,memory.total,uuid` (noheader, nounits)."""
    return [{"index": _int(index), "name": _value(name), "memory_total_mib": _int(mem), "uuid": _value(uuid)}
            for index, name, mem, uuid in _rows(text, f"nvidia-smi {GPUS_QUERY}")]


@dataclass(frozen=True)
class Reading:
    """One look at the GPUs: the compute processes and the GPUs they run on."""

    apps: list[dict[str, Any]]
    gpus: list[dict[str, Any]]


def _query(nvidia_smi: str, query: str) -> Output:
    out = run([nvidia_smi, query, CSV])
    if out.rc != 0:
        raise TrainingError(f"expected nvidia-smi to list the GPUs and their processes, found {out.describe()}; "
                            "the GPUs cannot be checked. Fix nvidia-smi (the driver) and run again")
    return out


def read(nvidia_smi: str) -> Reading:
    """The compute processes and the GPUs, from two read-only nvidia-smi queries."""
    return Reading(parse_apps(_query(nvidia_smi, APPS_QUERY).stdout), parse_gpus(_query(nvidia_smi, GPUS_QUERY).stdout))


def gpu_index_by_uuid(gpus: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return {str(g["uuid"]): int(g["index"]) for g in gpus if g.get("uuid") is not None and g.get("index") is not None}


def gpus_held(apps: Iterable[Mapping[str, Any]], gpus: Iterable[Mapping[str, Any]]) -> dict[int, list[int]]:
    """pid -> sorted GPU indexes it holds, from --query-compute-apps rows and --query-gpu index,uuid rows."""
    index = gpu_index_by_uuid(gpus)
    held: dict[int, set[int]] = {}
    for app in apps:
        if app.get("pid") is None:
            continue
        held.setdefault(int(app["pid"]), set()).add(index.get(str(app.get("gpu_uuid")), -1))
    return {pid: sorted(v) for pid, v in held.items()}


def gpu_holders(apps: Iterable[Mapping[str, Any]], gpus: Iterable[Mapping[str, Any]], needed: Iterable[int] = (),
                allowed_pids: Iterable[int] = ()) -> list[dict[str, Any]]:
    """Processes still holding a needed GPU (all GPUs when `needed` is empty), except the allowed pids; one row
    per process and GPU."""
    index = gpu_index_by_uuid(gpus)
    want = {int(i) for i in needed} or set(index.values())
    allowed = {int(p) for p in allowed_pids}
    out = []
    for app in apps:
        gpu = index.get(str(app.get("gpu_uuid")), -1)
        if app.get("pid") is not None and int(app["pid"]) not in allowed and (gpu in want or gpu == -1):
            out.append({"pid": int(app["pid"]), "process_name": app.get("process_name"), "gpu": gpu,
                        "used_memory_mib": app.get("used_memory_mib")})
    return out


def holders_message(host: str, holders: Sequence[Mapping[str, Any]]) -> str:
    """The sentence the stop fails with when GPUs are still held after it."""
    items = "; ".join(f"pid {h['pid']} ({h['process_name']}) on GPU {h['gpu']} with {h['used_memory_mib']} MiB"
                      for h in holders)
    return (f"{host}: expected the GPUs the plan needs to be free after stopping the training job, found {items}. "
            "Nothing else was changed. Find the owner with `ps -o pid,user,lstart,args -p <pid>`, stop it, "
            "and run the play again")


def unit_of_pid(pid: int, proc_root: Path = PROC) -> str:
    """The systemd unit that runs a process ('' for none or when it is gone)."""
    try:
        return unit_of(cgroup_path((proc_root / str(pid) / "cgroup").read_text()))
    except OSError:
        return ""


def holders_by_owner(holders: Iterable[Mapping[str, Any]], unit_of_pid: Callable[[int], str]) -> dict[str, Any]:
    """The holders grouped once each: {units: {unit: {pids, gpus}}, processes: {pid: {process_name, gpus}}} where
    processes are those outside any systemd unit."""
    units: dict[str, dict[str, set[int]]] = {}
    procs: dict[int, dict[str, Any]] = {}
    for h in holders:
        pid, unit = int(h["pid"]), unit_of_pid(int(h["pid"]))
        if unit:
            entry = units.setdefault(unit, {"pids": set(), "gpus": set()})
            entry["pids"].add(pid)
            entry["gpus"].add(int(h["gpu"]))
        else:
            procs.setdefault(pid, {"process_name": h.get("process_name"), "gpus": set()})["gpus"].add(int(h["gpu"]))
    return {"units": {u: {"pids": sorted(e["pids"]), "gpus": sorted(e["gpus"])} for u, e in sorted(units.items())},
            "processes": {pid: {"process_name": e["process_name"], "gpus": sorted(e["gpus"])}
                          for pid, e in sorted(procs.items())}}


def _gpu_list(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in gpus)


def resume_refusal(host: str, job_gpus: Sequence[int], owners: Mapping[str, Any],
                   stop_hints: Mapping[str, str] | None = None) -> str:
    """The sentence a resume refuses with while other processes hold the job's GPUs: each unit once with its pids,
    each process outside a unit once, and what to do, each command once (`stop_hints`: unit -> the command that
    stops it properly, e.g. the serving engine's playbook for every engine unit; else systemctl stop)."""
    held = [f"{unit} (pids {', '.join(str(p) for p in e['pids'])}; GPUs {_gpu_list(e['gpus'])})"
            for unit, e in owners["units"].items()]
    held += [f"pid {pid} ({e['process_name']}, in no systemd unit; GPUs {_gpu_list(e['gpus'])})"
             for pid, e in owners["processes"].items()]
    hints = stop_hints or {}
    todo = list(dict.fromkeys(hints.get(unit) or f"systemctl stop {unit}" for unit in owners["units"]))
    todo += [f"find the owner of pid {pid} with `ps -o pid,user,lstart,args -p {pid}` and stop it"
             for pid in owners["processes"]]
    return (f"{host}: expected the stopped job's GPUs {_gpu_list(job_gpus) or '(all)'} to be free before it starts "
            f"again, found them held by {'; '.join(held)}. Nothing was started. Stop the holder first ("
            f"{'; '.join(todo)}), then run again; or force the resume (training_stop_resume_force=true) to "
            "start it anyway")


def wait_free(nvidia_smi: str, needed: Sequence[int], allowed_pids: Iterable[int], retries: int, delay_s: float,
              sleep: Callable[[float], None] = time.sleep) -> tuple[Reading, list[dict[str, Any]]]:
    """Read the GPUs until no process but the allowed ones holds a needed GPU, at most retries + 1 times: the driver
    frees a dead process's memory a moment after it died. Returns the last reading and its holders."""
    allowed = list(allowed_pids)
    reading = read(nvidia_smi)
    holders = gpu_holders(reading.apps, reading.gpus, needed, allowed)
    for _ in range(retries):
        if not holders:
            break
        sleep(delay_s)
        reading = read(nvidia_smi)
        holders = gpu_holders(reading.apps, reading.gpus, needed, allowed)
    return reading, holders
