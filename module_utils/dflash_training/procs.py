"""Processes as /proc shows them: command line, parent, state, start time, user, cwd, stdout, cgroup, environment."""

from __future__ import annotations

import contextlib
import os
import pwd
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


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


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def parse_stat(text: str) -> tuple[str, int, int]:
    """(state, ppid, start ticks) from /proc/<pid>/stat; the command name may contain spaces and ')'."""
    rest = text.rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), int(rest[19])


def boot_time(proc_root: Path = PROC) -> float:
    """When the host booted (the `btime` of /proc/stat), to turn start ticks into times."""
    for line in _read(proc_root / "stat").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def cgroup_path(text: str) -> str:
    """The process's cgroup path from /proc/<pid>/cgroup (v2, v1 or hybrid: the first non-empty one)."""
    lines = [line.split(":", 2)[-1] for line in text.splitlines()]
    return next((line for line in lines if line), "")


def unit_of(cgroup: str) -> str:
    """The systemd unit (service or scope) whose cgroup holds a process, '' outside any."""
    return next((part for part in reversed(cgroup.split("/")) if part.endswith((".service", ".scope"))), "")


def read_proc(pid: int, proc_root: Path = PROC, with_env: bool = False) -> Proc | None:
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
        with contextlib.suppress(OSError):
            setattr(p, attr, os.readlink(base / link))
    p.cgroup = cgroup_path(_read(base / "cgroup"))
    hz = os.sysconf("SC_CLK_TCK")
    p.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(boot_time(proc_root) + start / hz))
    if with_env:
        try:
            raw = (base / "environ").read_bytes()
        except OSError:
            raw = b""
        p.environ = dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return p


def process_table(proc_root: Path = PROC) -> list[Proc]:
    """Every process, by pid."""
    table = []
    for entry in proc_root.iterdir():
        if entry.name.isdigit():
            p = read_proc(int(entry.name), proc_root)
            if p is not None:
                table.append(p)
    return sorted(table, key=lambda p: p.pid)
