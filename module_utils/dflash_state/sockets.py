"""Who listens on a TCP port: /proc/net/tcp{,6} sockets in LISTEN state, matched to the processes that
hold them through /proc/<pid>/fd (what `ss -ltnp` does, without needing iproute2)."""

from __future__ import annotations

import os
from typing import Any

from .systemd import unit_of_pid

LISTEN = "0A"


def _address(hex_addr: str) -> str:
    if len(hex_addr) == 8:  # IPv4, little-endian
        return ".".join(str(int(hex_addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    words = [hex_addr[i:i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    groups = [f"{int.from_bytes(raw[i:i + 2], 'big'):x}" for i in range(0, 16, 2)]
    return "[" + ":".join(groups) + "]"


def listening(port: int, proc_root: str = "/proc") -> dict[str, str]:
    """socket inode -> local address for every LISTEN socket on `port`."""
    found: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/net/{table}", encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cells = row.split()
            if len(cells) < 10 or cells[3] != LISTEN:
                continue
            addr, _, hex_port = cells[1].partition(":")
            if int(hex_port, 16) == port:
                found[cells[9]] = f"{_address(addr)}:{port}"
    return found


def holders(port: int, proc_root: str = "/proc") -> list[dict[str, Any]]:
    """[{pid, process, unit, local}] of the processes listening on `port` (pid None when none is found)."""
    sockets = listening(port, proc_root)
    if not sockets:
        return []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        fd_dir = f"{proc_root}/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else ""
            if inode in sockets:
                try:
                    with open(f"{proc_root}/{name}/comm", encoding="utf-8") as fh:
                        comm = fh.read().strip()
                except OSError:
                    comm = "?"
                out.append({"pid": int(name), "process": comm, "unit": unit_of_pid(int(name), proc_root),
                            "local": sockets[inode]})
                seen.add(inode)
                break
    out += [{"pid": None, "process": None, "unit": "", "local": addr} for inode, addr in sockets.items()
            if inode not in seen]
    return out
