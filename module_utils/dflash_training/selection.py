"""Which processes are the training job (pure over a process listing), and find(): the job on this host as JSON.

Preference: the processes of a systemd unit, else those whose command line matches, else the pid in a pid file
(only when that process started before the file was written, so a recycled pid is never taken). Processes of
the serving engine (command-line patterns, units) are never selected."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import PROC, Proc, boot_time, process_table, read_proc

# Environment variables worth keeping to resume a job; everything else (tokens, keys) is not recorded.
DEFAULT_ENV_KEEP = ("TRAIN_*", "CUDA_*", "NCCL_*", "OMP_*", "PYTHONPATH", "PYTORCH_*", "HF_HOME", "PATH",
                    "TORCH_*", "WORLD_SIZE", "MASTER_*", "LOCAL_*")


@dataclass
class Selection:
    """The training job: the processes to stop (roots first), and what was left alone and why."""

    mode: str  # unit | match | pidfile | none
    roots: list[Proc]
    descendants: list[Proc]
    protected: list[Proc]
    notes: list[str] = field(default_factory=list)

    @property
    def all(self) -> list[Proc]:
        return self.roots + self.descendants


def in_unit(p: Proc, unit: str) -> bool:
    """True when the process lives in the cgroup of systemd unit `unit` (or below it)."""
    return bool(unit) and unit in p.cgroup.split("/")


def descendants_of(table: Iterable[Proc], roots: Iterable[int]) -> list[Proc]:
    """Every live process below the given pids (dataloader workers, torchrun children), parents first."""
    children: dict[int, list[Proc]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p)
    todo = list(roots)
    seen = set(todo)
    out = []
    while todo:
        for child in children.get(todo.pop(0), []):
            if child.pid not in seen:
                seen.add(child.pid)
                out.append(child)
                todo.append(child.pid)
    return out


def _by_pidfile(live: list[Proc], pid: int, mtime: float | None, btime: float, hz: int,
                notes: list[str]) -> list[Proc]:
    """The pid file's process, unless it is gone or started after the file was written (a recycled pid)."""
    p = next((p for p in live if p.pid == pid), None)
    if p is None:
        notes.append(f"pid file names pid {pid}, which is not running")
        return []
    if mtime is not None and btime + p.start_ticks / hz > mtime + 1:
        notes.append(f"pid file names pid {pid}, but that process started after the pid file was "
                     f"written: a recycled pid, left alone")
        return []
    return [p]


def select(table: list[Proc], unit: str = "", match: Iterable[str] = (), pidfile_pid: int | None = None,
           pidfile_mtime: float | None = None, protect_match: Iterable[str] = (), protect_units: Iterable[str] = (),
           self_pids: Iterable[int] = (), btime: float = 0.0, hz: int = 100) -> Selection:
    """Pick the training job from a process listing. Order of preference: unit, command-line match, pid file."""
    skip = set(self_pids)
    live = [p for p in table if p.alive and p.pid not in skip and p.pid != 1]
    guards = [re.compile(r) for r in protect_match]
    units = [u for u in protect_units if u]

    def guarded(p: Proc) -> bool:
        return any(g.search(p.command) for g in guards) or any(in_unit(p, u) for u in units)

    notes: list[str] = []
    mode, roots = "none", []
    if unit:
        roots = [p for p in live if in_unit(p, unit)]
        mode = "unit" if roots else mode
    if not roots and match:
        patterns = [re.compile(r) for r in match]
        roots = [p for p in live if any(r.search(p.command) for r in patterns)]
        mode = "match" if roots else mode
    if not roots and pidfile_pid:
        roots = _by_pidfile(live, pidfile_pid, pidfile_mtime, btime, hz, notes)
        mode = "pidfile" if roots else mode
    # A match on a parent and its child: keep the top-most as the root.
    root_pids = {p.pid for p in roots}
    roots = [p for p in roots if p.ppid not in root_pids]
    kids = descendants_of(live, [p.pid for p in roots])
    protected = [p for p in roots + kids if guarded(p)]
    if protected:
        notes.append("left alone (serving engine): " + ", ".join(f"{p.pid} {p.command[:60]}" for p in protected))
    bad = {p.pid for p in protected}
    roots = [p for p in roots if p.pid not in bad]
    kids = [p for p in kids if p.pid not in bad]
    return Selection(mode=mode if roots else "none", roots=roots, descendants=kids,
                     protected=[p for p in live if guarded(p)], notes=notes)


def keep_env(environ: Mapping[str, str], keep: Iterable[str] = DEFAULT_ENV_KEEP) -> dict[str, str]:
    """The environment variables worth recording to resume the job (glob patterns; secrets are not kept)."""
    pats = list(keep)
    return {k: v for k, v in sorted(environ.items()) if any(fnmatch.fnmatchcase(k, pat) for pat in pats)}


def record_of(p: Proc, env_keep: Iterable[str] = DEFAULT_ENV_KEEP) -> dict[str, Any]:
    """What the stop record keeps of one process (enough to start it again)."""
    log = p.stdout if p.stdout.startswith("/") and not p.stdout.startswith(("/dev/", "/proc/")) else ""
    return {"pid": p.pid, "ppid": p.ppid, "start_ticks": p.start_ticks, "started_at": p.started_at,
            "cmdline": p.cmdline, "cwd": p.cwd, "user": p.user, "log": log, "cgroup": p.cgroup,
            "env": keep_env(p.environ, env_keep), "env_names": sorted(p.environ)}


def read_pidfile(path: str) -> tuple[int | None, float | None]:
    """The pid a pid file names and when the file was written; (None, None) without a readable file."""
    if not path:
        return None, None
    try:
        text = Path(path).read_text().strip()
        return (int(text.split()[0]) if text else None), Path(path).stat().st_mtime
    except (OSError, ValueError):
        return None, None


def ancestors(table: Iterable[Proc], pid: int) -> list[int]:
    """pid and every process above it (the SSH session and shells that run this module): never the job."""
    parent = {p.pid: p.ppid for p in table}
    chain = [pid]
    while parent.get(chain[-1], 0) > 1 and parent[chain[-1]] not in chain:
        chain.append(parent[chain[-1]])
    return chain


def find(unit: str = "", match: Sequence[str] = (), pidfile: str = "", protect_match: Sequence[str] = (),
         protect_units: Sequence[str] = (), env_keep: Sequence[str] = DEFAULT_ENV_KEEP,
         proc_root: str | os.PathLike[str] = PROC) -> dict[str, Any]:
    """The training job on this host, read-only: {mode, notes, roots, descendants, protected}, each process as
    record_of() keeps it (protected ones as pid, cmdline, cgroup). This process and its ancestors are never taken."""
    proc_root = Path(proc_root)
    pid, mtime = read_pidfile(pidfile)
    table = process_table(proc_root)
    sel = select(table, unit, match, pid, mtime, protect_match, protect_units,
                 self_pids=[*ancestors(table, os.getpid()), os.getppid()], btime=boot_time(proc_root),
                 hz=os.sysconf("SC_CLK_TCK"))
    full = {p.pid: read_proc(p.pid, proc_root, with_env=True) or p for p in sel.all}
    return {"mode": sel.mode, "notes": sel.notes,
            "roots": [record_of(full[p.pid], env_keep) for p in sel.roots],
            "descendants": [record_of(full[p.pid], env_keep) for p in sel.descendants],
            "protected": [{"pid": p.pid, "cmdline": p.cmdline, "cgroup": p.cgroup} for p in sel.protected]}
