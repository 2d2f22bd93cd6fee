#!/usr/bin/env python3
"""Find, record and stop the training job that holds the GPUs, safely.

Selection is a pure function over a process listing (read from /proc): processes of a systemd
unit, or processes whose command line matches a pattern, or the pid in a pid file (only when that
process started before the pid file was written, so a recycled pid is never taken). Processes of
the serving engine are never selected. Stopping sends SIGTERM, waits up to a deadline, then SIGKILL,
and checks each pid's start time first so a recycled pid is never signalled.

Standard library only: the training_stop role runs this file on the hosts as `python3 - <command>`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import pwd
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

# Environment variables worth keeping to resume a job; everything else (tokens, keys) is not recorded.
DEFAULT_ENV_KEEP = ("TRAIN_*", "CUDA_*", "NCCL_*", "OMP_*", "PYTHONPATH", "PYTORCH_*", "HF_HOME", "PATH",
                    "TORCH_*", "WORLD_SIZE", "MASTER_*", "LOCAL_*")


@dataclass
class Proc:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    uid: int
    state: str
    start_ticks: int
    cmdline: list[str]
    user: str = ""
    cwd: str = ""
    stdout: str = ""
    cgroup: str = ""
    started_at: str = ""
    environ: dict[str, str] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return " ".join(self.cmdline)

    @property
    def alive(self) -> bool:
        """A zombie has exited and released its memory and devices; only its exit status waits."""
        return self.state not in ("Z", "X")


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


# ---------------------------------------------------------------------------------------------
# Reading /proc
# ---------------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def parse_stat(text: str) -> tuple[str, int, int]:
    """(state, ppid, start ticks) from /proc/<pid>/stat; the command name may contain spaces and ')'."""
    rest = text.rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), int(rest[19])


def boot_time(proc_root: Path = Path("/proc")) -> float:
    for line in _read(proc_root / "stat").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def read_proc(pid: int, proc_root: Path = Path("/proc"), with_env: bool = False) -> Proc | None:
    """The process `pid`, or None when it is gone."""
    base = proc_root / str(pid)
    stat = _read(base / "stat")
    if not stat:
        return None
    state, ppid, start = parse_stat(stat)
    uid = -1
    for line in _read(base / "status").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
    try:
        user = pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        user = str(uid)
    p = Proc(pid=pid, ppid=ppid, uid=uid, state=state, start_ticks=start,
             cmdline=[a for a in _read(base / "cmdline").split("\0") if a], user=user)
    for attr, link in (("cwd", "cwd"), ("stdout", "fd/1")):
        try:
            setattr(p, attr, os.readlink(base / link))
        except OSError:
            pass
    lines = [line.split(":", 2)[-1] for line in _read(base / "cgroup").splitlines()]
    p.cgroup = next((line for line in lines if line), "")
    hz = os.sysconf("SC_CLK_TCK")
    p.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(boot_time(proc_root) + start / hz))
    if with_env:
        raw = (base / "environ").read_bytes() if (base / "environ").exists() else b""
        p.environ = dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return p


def process_table(proc_root: Path = Path("/proc")) -> list[Proc]:
    table = []
    for entry in proc_root.iterdir():
        if entry.name.isdigit():
            p = read_proc(int(entry.name), proc_root)
            if p is not None:
                table.append(p)
    return sorted(table, key=lambda p: p.pid)


# ---------------------------------------------------------------------------------------------
# Selection (pure)
# ---------------------------------------------------------------------------------------------


def in_unit(p: Proc, unit: str) -> bool:
    """True when the process lives in the cgroup of systemd unit `unit` (or below it)."""
    return bool(unit) and unit in p.cgroup.split("/")


def descendants_of(table: Iterable[Proc], roots: Iterable[int]) -> list[Proc]:
    """Every live process below the given pids (dataloader workers, torchrun children), parents first."""
    children: dict[int, list[Proc]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p)
    out, todo, seen = [], list(roots), set(roots)
    while todo:
        for child in children.get(todo.pop(0), []):
            if child.pid not in seen:
                seen.add(child.pid)
                out.append(child)
                todo.append(child.pid)
    return out


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
        if roots:
            mode = "unit"
    if not roots and match:
        patterns = [re.compile(r) for r in match]
        roots = [p for p in live if any(r.search(p.command) for r in patterns)]
        mode = "match" if roots else mode
    if not roots and pidfile_pid:
        p = next((p for p in live if p.pid == pidfile_pid), None)
        started = btime + (p.start_ticks / hz) if p else None
        if p is None:
            notes.append(f"pid file names pid {pidfile_pid}, which is not running")
        elif pidfile_mtime is not None and started is not None and started > pidfile_mtime + 1:
            notes.append(f"pid file names pid {pidfile_pid}, but that process started after the pid file was "
                         f"written: a recycled pid, left alone")
        else:
            roots, mode = [p], "pidfile"
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
    all_protected = [p for p in live if guarded(p)]
    return Selection(mode=mode if roots else "none", roots=roots, descendants=kids, protected=all_protected,
                     notes=notes)


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


# ---------------------------------------------------------------------------------------------
# Stopping
# ---------------------------------------------------------------------------------------------


@dataclass
class StopResult:
    terminated: list[int] = field(default_factory=list)  # gone after SIGTERM
    killed: list[int] = field(default_factory=list)  # needed SIGKILL
    already_gone: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    seconds: float = 0.0


def _same(pid: int, start: int, proc_root: Path) -> bool:
    p = read_proc(pid, proc_root)
    return p is not None and p.start_ticks == start and p.alive


def _wait_gone(targets: dict[int, int], deadline: float, proc_root: Path) -> list[int]:
    while True:
        left = [pid for pid, start in targets.items() if _same(pid, start, proc_root)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def stop(roots: Mapping[int, int], others: Mapping[int, int], term_timeout: float, kill_timeout: float,
         proc_root: Path = Path("/proc")) -> StopResult:
    """SIGTERM the roots (pid -> start ticks), wait; SIGKILL whatever of roots and others is left."""
    t0 = time.monotonic()
    res = StopResult()
    targets = {**others, **roots}
    for pid, start in list(targets.items()):
        if not _same(pid, start, proc_root):
            res.already_gone.append(pid)
            targets.pop(pid)
    for pid in roots:
        if pid in targets:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    left = _wait_gone(targets, time.monotonic() + term_timeout, proc_root)
    res.terminated = sorted(set(targets) - set(left))
    # Children started after the selection (a launcher respawning workers) go down with the rest.
    extra = {p.pid: p.start_ticks for p in descendants_of(process_table(proc_root), left) if p.alive}
    kill = {pid: targets[pid] for pid in left} | extra
    for pid in kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    res.survivors = _wait_gone(kill, time.monotonic() + kill_timeout, proc_root)
    res.killed = sorted(set(kill) - set(res.survivors))
    res.seconds = round(time.monotonic() - t0, 2)
    return res


# ---------------------------------------------------------------------------------------------
# GPUs (controller side: nvidia-smi output parsed by dflash_infra.parsers)
# ---------------------------------------------------------------------------------------------


def gpu_index_by_uuid(gpus: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return {str(g["uuid"]): int(g["index"]) for g in gpus if g.get("uuid") is not None and g.get("index") is not None}


def gpus_held(apps: Iterable[Mapping[str, Any]], gpus: Iterable[Mapping[str, Any]]) -> dict[int, list[int]]:
    """pid -> sorted GPU indexes it holds, from --query-compute-apps rows and --query-gpu index,uuid rows."""
    index = gpu_index_by_uuid(gpus)
    held: dict[int, set[int]] = {}
    for app in apps:
        if app.get("pid") is None:
            continue
        gpu = index.get(str(app.get("gpu_uuid")), -1)
        held.setdefault(int(app["pid"]), set()).add(gpu)
    return {pid: sorted(v) for pid, v in held.items()}


def gpu_holders(apps: Iterable[Mapping[str, Any]], gpus: Iterable[Mapping[str, Any]], needed: Iterable[int] = (),
                allowed_pids: Iterable[int] = ()) -> list[dict[str, Any]]:
    """Processes still holding a needed GPU (all GPUs when `needed` is empty), except the allowed pids."""
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


def holders_message(host: str, holders: list[Mapping[str, Any]]) -> str:
    """The sentence a play fails with when GPUs are still held after the stop."""
    items = "; ".join(f"pid {h['pid']} ({h['process_name']}) on GPU {h['gpu']} with {h['used_memory_mib']} MiB"
                      for h in holders)
    return (f"{host}: expected the GPUs the plan needs to be free after stopping the training job, found {items}. "
            "Nothing else was changed. Find the owner with `ps -o pid,user,lstart,args -p <pid>`, stop it, "
            "and run the play again")


def pid_start(p: Mapping[str, Any]) -> str:
    """PID:START_TICKS of a recorded process: what `training.py stop` takes, so a recycled pid is not signalled."""
    return f"{int(p['pid'])}:{int(p['start_ticks'])}"


def describe_line(p: Mapping[str, Any]) -> str:
    """One line per recorded process for the play output (no environment values)."""
    gpus = ",".join(str(g) for g in p.get("gpus", [])) or "none"
    return (f"pid {p['pid']} user {p.get('user')} since {p.get('started_at')}: {' '.join(p.get('cmdline', []))} "
            f"(cwd {p.get('cwd') or '?'}, log {p.get('log') or 'none'}, GPUs {gpus})")


def stop_record(host: str, found: Mapping[str, Any], held: Mapping[Any, list[int]], unit: Mapping[str, Any],
                env_file: str, resume_command: list[str], now: str,
                boot_units: Iterable[str] = ()) -> dict[str, Any]:
    """The stopped-training.json record: what ran, where, as whom, with which GPUs, and how to start it again."""
    held = {int(k): v for k, v in held.items()}
    procs = [dict(p, gpus=held.get(int(p["pid"]), [])) for p in found.get("roots", [])]
    kids = [dict(p, gpus=held.get(int(p["pid"]), [])) for p in found.get("descendants", [])]
    gpus = sorted({g for p in procs + kids for g in p["gpus"] if g >= 0})
    first = procs[0] if procs else {}
    return {"schema": 1, "host": host, "stopped_at": now, "mode": found.get("mode"),
            "unit": dict(unit) if unit else None, "env_file": env_file, "boot_units": list(boot_units),
            "gpus": gpus, "processes": procs, "descendants": kids,
            "resume": {"command": list(resume_command) or list(first.get("cmdline", [])),
                       "cwd": first.get("cwd", "/"), "user": first.get("user", "root"),
                       "log": first.get("log", ""), "env": first.get("env", {}), "env_file": env_file}}


# ---------------------------------------------------------------------------------------------
# Command line (what the role runs on the hosts)
# ---------------------------------------------------------------------------------------------


def _pidfile(path: str) -> tuple[int | None, float | None]:
    if not path:
        return None, None
    try:
        text = Path(path).read_text().strip()
        return (int(text.split()[0]) if text else None), Path(path).stat().st_mtime
    except (OSError, ValueError):
        return None, None


def cmd_find(args: argparse.Namespace) -> dict[str, Any]:
    proc_root = Path(args.proc)
    table = process_table(proc_root)
    pid, mtime = _pidfile(args.pidfile)
    sel = select(table, args.unit, args.match, pid, mtime, args.protect_match, args.protect_unit,
                 self_pids=[os.getpid(), os.getppid()], btime=boot_time(proc_root), hz=os.sysconf("SC_CLK_TCK"))
    full = {p.pid: read_proc(p.pid, proc_root, with_env=True) or p for p in sel.all}
    return {"mode": sel.mode, "notes": sel.notes,
            "roots": [record_of(full[p.pid], args.env_keep) for p in sel.roots],
            "descendants": [record_of(full[p.pid], args.env_keep) for p in sel.descendants],
            "protected": [{"pid": p.pid, "cmdline": p.cmdline, "cgroup": p.cgroup} for p in sel.protected]}


def _pid_start(items: list[str]) -> dict[int, int]:
    out = {}
    for item in items:
        pid, _, start = item.partition(":")
        out[int(pid)] = int(start)
    return out


def cmd_stop(args: argparse.Namespace) -> dict[str, Any]:
    res = stop(_pid_start(args.root), _pid_start(args.other), args.term_timeout, args.kill_timeout, Path(args.proc))
    return asdict(res)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="training.py", description=__doc__.splitlines()[0])
    parser.add_argument("--proc", default="/proc")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("find", help="the training job's processes, as JSON")
    p.add_argument("--unit", default="")
    p.add_argument("--match", action="append", default=[], help="regex on the command line (repeatable)")
    p.add_argument("--pidfile", default="")
    p.add_argument("--protect-match", action="append", default=[])
    p.add_argument("--protect-unit", action="append", default=[])
    p.add_argument("--env-keep", action="append", default=None)
    p = sub.add_parser("stop", help="SIGTERM, wait, SIGKILL; pids given as PID:START_TICKS")
    p.add_argument("--root", action="append", default=[])
    p.add_argument("--other", action="append", default=[])
    p.add_argument("--term-timeout", type=float, default=60.0)
    p.add_argument("--kill-timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    if getattr(args, "env_keep", None) is None:
        args.env_keep = list(DEFAULT_ENV_KEEP)
    try:
        result = cmd_find(args) if args.command == "find" else cmd_stop(args)
    except (OSError, ValueError, re.error) as exc:
        print(f"training.py {args.command}: {exc}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
