"""Stopping processes safely: SIGTERM the roots, wait up to a deadline, SIGKILL what is left; every pid's start
time is checked first, so a recycled pid is never signalled."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .procs import PROC, process_table, read_proc
from .selection import descendants_of


@dataclass
class StopResult:
    """How each process ended."""

    terminated: list[int] = field(default_factory=list)  # gone after SIGTERM
    killed: list[int] = field(default_factory=list)  # needed SIGKILL
    already_gone: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    seconds: float = 0.0


def _same(pid: int, start: int, proc_root: Path) -> bool:
    p = read_proc(pid, proc_root)
    return p is not None and p.start_ticks == start and p.alive


def _wait_gone(targets: Mapping[int, int], deadline: float, proc_root: Path) -> list[int]:
    while True:
        left = [pid for pid, start in targets.items() if _same(pid, start, proc_root)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(roots: Mapping[int, int], others: Mapping[int, int], term_timeout: float, kill_timeout: float,
         proc_root: Path = PROC) -> StopResult:
    """SIGTERM the roots (pid -> start ticks), wait; SIGKILL whatever of roots and others is left."""
    t0 = time.monotonic()
    res = StopResult()
    targets = dict(others) | dict(roots)
    for pid, start in list(targets.items()):
        if not _same(pid, start, proc_root):
            res.already_gone.append(pid)
            targets.pop(pid)
    _signal([pid for pid in roots if pid in targets], signal.SIGTERM)
    left = _wait_gone(targets, time.monotonic() + term_timeout, proc_root)
    res.terminated = sorted(set(targets) - set(left))
    # Children started after the selection (a launcher respawning workers) go down with the rest.
    extra = {p.pid: p.start_ticks for p in descendants_of(process_table(proc_root), left) if p.alive}
    kill = {pid: targets[pid] for pid in left} | extra
    _signal(list(kill), signal.SIGKILL)
    res.survivors = _wait_gone(kill, time.monotonic() + kill_timeout, proc_root)
    res.killed = sorted(set(kill) - set(res.survivors))
    res.seconds = round(time.monotonic() - t0, 2)
    return res
