"""One deploy at a time per host: who holds a host's deploy lock, and whether that run is dead.

The lock is a JSON file on the host (dflash_host_lock module, created atomically); what it says of its holder is
made on the controller (action_plugins/dflash_host_lock.py): the user, the controller's host name, the pid of the
ansible-playbook process and that process's start (in clock ticks after the controller's boot, exact, so a recycled
pid is told apart; and as a UTC time for people, which moves with the controller's clock and is compared only in a
lock written before the ticks were kept). Its modification time is the run's heartbeat: the run touches it at each
stage and replica turn, and the engine's readiness probe on every attempt while a turn waits. A holder on this
controller whose process is gone is dead; one on another controller is trusted until its heartbeat is older than the
stale limit (15 min by default).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any

HOLDER_KEYS = ("owner", "controller", "pid", "start_ticks", "started_at", "playbook")


def process_start_ticks(pid: int, proc: str = "/proc") -> int | None:
    """When process `pid` started, in clock ticks after boot (field 22 of its stat): fixed for the process's life and
    exact, unlike a wall-clock time made from it; None when gone."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_started_at(pid: int, proc: str = "/proc") -> str | None:
    """When process `pid` started (UTC, ISO 8601, whole seconds); None when gone."""
    ticks = process_start_ticks(pid, proc)
    return None if ticks is None else started_at(ticks, proc)


def started_at(ticks: int, proc: str = "/proc") -> str | None:
    """A start `ticks` clock ticks after boot as a time (UTC, ISO 8601, whole seconds), from the boot time; None when
    that cannot be read. For people only: the kernel's boot time is the clock's time minus the time since boot, so it
    moves when the clock is set, and the same process can be given another second."""
    try:
        with open(f"{proc}/stat", encoding="ascii") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    started = boot + ticks // os.sysconf("SC_CLK_TCK")
    return dt.datetime.fromtimestamp(started, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(controller: str, pid: int, proc: str = "/proc") -> dict[str, Any] | None:
    """Process `pid` of this controller as the part of a holder that tells a run (controller, pid, its start in
    ticks and as a time); None when no such process runs."""
    ticks = process_start_ticks(pid, proc)
    if ticks is None:
        return None
    return {"controller": controller, "pid": pid, "start_ticks": ticks,
            "started_at": started_at(ticks, proc) or "unknown"}


def holder(owner: str, controller: str, pid: int, playbook: str, proc: str = "/proc") -> dict[str, Any]:
    """This run as a lock holder: the same answer for every task of the run."""
    me = running(controller, pid, proc) or {"controller": controller, "pid": pid, "start_ticks": None,
                                             "started_at": "unknown"}
    return {"owner": owner, **me, "playbook": playbook}


def same_run(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two holders are one run: its controller, pid and start (in ticks; by its start time where a holder was
    written before the ticks were kept)."""
    if not (a and b):
        return False
    start = "start_ticks" if a.get("start_ticks") is not None and b.get("start_ticks") is not None else "started_at"
    return all(a.get(k) == b.get(k) for k in ("controller", "pid", start))


def staleness(current: Mapping[str, Any], controller: str, now: dt.datetime, stale_after_s: int,
              proc: str = "/proc", heartbeat: dt.datetime | None = None) -> str:
    """Why the holder's run is dead ('' while it may be alive): gone from this controller, or its heartbeat (the lock
    file's modification time; its start time when none is known) older than the stale limit."""
    if current.get("controller") == controller:
        pid = current.get("pid")
        if not (isinstance(pid, int) and same_run(current, running(controller, pid, proc))):
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
