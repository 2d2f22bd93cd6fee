"""Processes read from /proc: liveness, argv, pid namespaces, the nspawn processes and their PID 1s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path


def proc_state(pid: int) -> str | None:
    """Kernel state letter of a process, or None when it no longer exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_alive(pid: int) -> bool:
    """True for a live process; a zombie counts as gone."""
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """Argument vector of a process (empty when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def parent_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def ns_pids(pid: int) -> list[int]:
    """The NSpid line: the process id in each nested pid namespace, outermost first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (FileNotFoundError, ProcessLookupError):
        return []
    return []


def nspawn_pids_for(root: Path) -> list[int]:
    """Live systemd-nspawn processes booting this directory (found by argv, not by name)."""
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if not argv or not argv[0].endswith("systemd-nspawn") or not is_alive(pid):
            continue
        if "-D" in argv and argv.index("-D") + 1 < len(argv) and Path(argv[argv.index("-D") + 1]) == root:
            found.append(pid)
    return sorted(found)


def container_leader(nspawn_pid: int) -> int | None:
    """The container's PID 1 (systemd): the descendant of nspawn that is pid 1 in its namespace."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        ppid = parent_of(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    queue = list(children.get(nspawn_pid, []))
    while queue:
        pid = queue.pop(0)
        nsp = ns_pids(pid)
        if len(nsp) >= 2 and nsp[-1] == 1 and is_alive(pid):
            return pid
        queue.extend(children.get(pid, []))
    return None


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (part.decode(errors="replace").partition("=") for part in raw.split(b"\0") if part)
    return {key: value for key, _, value in pairs}


def machine_uuid(root: Path) -> str | None:
    """The container's machine id as nspawn passes it in `container_uuid`."""
    try:
        return str(uuid.UUID((root / "etc" / "machine-id").read_text().strip()))
    except (FileNotFoundError, ValueError):
        return None


def orphan_leaders(root: Path) -> list[int]:
    """Container PID 1s of this rootfs whose systemd-nspawn is gone (it was killed with SIGKILL).

    They are recognised by `container_uuid` in their environment, which nspawn sets from
    the container's own machine id.
    """
    wanted = machine_uuid(root)
    if wanted is None:
        return []
    found = []
    for pid in all_pids():
        nsp = ns_pids(pid)
        if len(nsp) < 2 or nsp[-1] != 1 or not is_alive(pid):
            continue
        env = environ(pid)
        if env.get("container") == "systemd-nspawn" and env.get("container_uuid") == wanted:
            parent = parent_of(pid)
            if parent is None or "systemd-nspawn" not in " ".join(cmdline(parent)[:1]):
                found.append(pid)
    return sorted(found)


def wait_gone_all(pids: Sequence[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(is_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return not any(is_alive(p) for p in pids)
