"""The node stand-in's host daemons (the pct daemon, the Proxmox API stand-in): start, find, stop."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .config import PVE_DIR, REPO, LabError, Paths, node
from .host import Clock, tail
from .procs import all_pids, cmdline, is_alive, wait_gone_all


@dataclass(frozen=True)
class Daemon:
    """A host process that serves the node stand-in: the pct daemon, the Proxmox API stand-in.

    Started in its own session with `--state-dir <state>` (and `--listen <node address> --port`
    for a TCP service); found again by its argument vector, never by name.
    """

    name: str
    script: Path
    port: int | None = None  # TCP port on the node's address; None: the pct daemon's unix socket
    also_reads: tuple[Path, ...] = ()  # other sources whose change means a restart

    def argv(self, paths: Paths) -> list[str]:
        argv = [sys.executable, str(self.script), "--state-dir", str(paths.state)]
        if self.port is not None:
            argv += ["--listen", node().address, "--port", str(self.port)]
        return argv

    def wanted(self) -> bool:
        return self.script.is_file()

    def log(self, paths: Paths) -> Path:
        return paths.logs / f"{self.name}.log"

    def pidfile(self, paths: Paths) -> Path:
        return paths.run / f"{self.name}.pid"

    def ready(self, paths: Paths) -> bool:
        """The service accepts connections (unix socket or TCP port)."""
        if self.port is None:
            return connectable(socket.AF_UNIX, str(paths.pctd_socket))
        return connectable(socket.AF_INET, (node().address, self.port))


def connectable(family: socket.AddressFamily, address: str | tuple[str, int]) -> bool:
    """Something accepts a stream connection at this address."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(address)
        except OSError:
            return False
    return True


# The pct daemon imports lab/labctl.py, and so this package: a change to any of them means a restart.
BUILDER_SOURCES = (REPO / "lab" / "labctl.py", *sorted(Path(__file__).resolve().parent.glob("*.py")))
DAEMONS: tuple[Daemon, ...] = (
    Daemon(name="pctd", script=PVE_DIR / "pctd.py", also_reads=BUILDER_SOURCES),
    Daemon(name="pve-api", script=PVE_DIR / "api.py", port=8006),
)
DAEMON_START_TIMEOUT = 20.0


def daemon_pids(paths: Paths, d: Daemon) -> list[int]:
    """Live processes running this daemon's script for this state folder."""
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if (str(d.script) in argv[1:3] and "--state-dir" in argv
                and argv[argv.index("--state-dir") + 1:][:1] == [str(paths.state)] and is_alive(pid)):
            found.append(pid)
    return sorted(found)


def process_started_at(pid: int) -> float | None:
    """Start time of a process as a Unix timestamp (from /proc/<pid>/stat and the boot time)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
    except (FileNotFoundError, ProcessLookupError, StopIteration, IndexError):
        return None
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def daemon_is_stale(d: Daemon, pid: int) -> bool:
    """The daemon runs older code than the checkout (its script or a module it reads changed since it started)."""
    started = process_started_at(pid)
    newest = max(p.stat().st_mtime for p in (d.script, *d.also_reads) if p.exists())
    return started is not None and newest > started + 1


def stop_daemon(paths: Paths, d: Daemon, clock: Clock) -> bool:
    """SIGTERM, then SIGKILL after a bounded wait. False when it was not running."""
    pids = daemon_pids(paths, d)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    if pids and not wait_gone_all(pids, 10):
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        wait_gone_all(pids, 5)
    d.pidfile(paths).unlink(missing_ok=True)
    if pids:
        clock.say(f"{d.name}: stopped (pid {', '.join(map(str, pids))})")
    return bool(pids)


def start_daemon(paths: Paths, d: Daemon, clock: Clock) -> bool:
    """Start the daemon unless it runs (restart it when its code changed). True when it was (re)started."""
    pids = daemon_pids(paths, d)
    if os.getpid() in pids:
        return False  # called from inside the daemon itself (the API stand-in starting a container)
    if pids and not any(daemon_is_stale(d, pid) for pid in pids) and d.ready(paths):
        return False
    if pids:
        clock.say(f"{d.name}: restarting (code changed since it started, or it does not answer)")
        stop_daemon(paths, d, clock)
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    argv = d.argv(paths)
    log = d.log(paths)
    with log.open("a") as out:
        out.write(f"\n=== {dt.datetime.now().isoformat(timespec='seconds')} {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=REPO)
    d.pidfile(paths).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    while not d.ready(paths):
        if proc.poll() is not None:
            raise LabError(f"{d.name} ({' '.join(argv)}) exited with {proc.returncode} while starting. "
                           f"Last lines of {log}:\n{tail(log)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise LabError(f"{d.name} (pid {proc.pid}) did not accept connections within "
                           f"{DAEMON_START_TIMEOUT:.0f} s. Last lines of {log}:\n{tail(log)}")
        time.sleep(0.1)
    clock.say(f"{d.name}: started (pid {proc.pid}, log {log})")
    return True
