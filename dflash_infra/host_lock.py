"""One deploy at a time per host: who holds a host's deploy lock, and whether that run is dead.

The lock is a JSON file on the host (dflash_host_lock module, created atomically); what it says of its holder is
made on the controller (action_plugins/dflash_host_lock.py): the user, the controller's host name, the pid of the
ansible-playbook process and that process's start time, which also tells a recycled pid apart. Its modification time
is the run's heartbeat: the run touches it at each stage and replica turn, and the engine's readiness probe on every
attempt while a turn waits. A holder on this controller whose process is gone is dead; one on another controller is
trusted until its heartbeat is older than the stale limit (15 min by default).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any

HOLDER_KEYS = ("owner", "controller", "pid", "started_at", "playbook")


def process_started_at(pid: int, proc: str = "/proc") -> str | None:
    """When process `pid` started (UTC, ISO 8601, whole seconds), from its stat and the boot time; None when gone."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open(f"{proc}/stat", encoding="ascii") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks after boot
    started = boot + ticks // os.sysconf("SC_CLK_TCK")
    return dt.datetime.fromtimestamp(started, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def holder(owner: str, controller: str, pid: int, playbook: str, proc: str = "/proc") -> dict[str, Any]:
    """This run as a lock holder: the same answer for every task of the run."""
    return {"owner": owner, "controller": controller, "pid": pid,
            "started_at": process_started_at(pid, proc) or "unknown", "playbook": playbook}


def same_run(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    return bool(a and b) and all((a or {}).get(k) == (b or {}).get(k) for k in ("controller", "pid", "started_at"))


def staleness(current: Mapping[str, Any], controller: str, now: dt.datetime, stale_after_s: int,
              proc: str = "/proc", heartbeat: dt.datetime | None = None) -> str:
    """Why the holder's run is dead ('' while it may be alive): gone from this controller, or its heartbeat (the lock
    file's modification time; its start time when none is known) older than the stale limit."""
    if current.get("controller") == controller:
        pid = current.get("pid")
        if not isinstance(pid, int) or process_started_at(pid, proc) != current.get("started_at"):
            return f"its process {pid} on this controller ({controller}) is gone"
        return ""
    if heartbeat is not None:
        age = (now - heartbeat).total_seconds()
        return (f"its last heartbeat was {age / 60:.0f} min ago, more than {stale_after_s / 60:g} min"
                if age > stale_after_s else "")
    try:
        started = dt.datetime.strptime(str(current.get("started_at")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return f"it names no start time ({current.get('started_at')!r})"
    age = (now - started).total_seconds()
    return f"it started {age / 3600:.1f} h ago, more than {stale_after_s / 3600:g} h" if age > stale_after_s else ""


def describe(current: Mapping[str, Any]) -> str:
    return (f"{current.get('playbook') or 'a playbook'} run by {current.get('owner')} on {current.get('controller')} "
            f"(pid {current.get('pid')}, since {current.get('started_at')})")
