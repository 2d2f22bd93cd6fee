"""The transfer: rsync pulled by the destination from the source over SSH into the staging folder, resumable
from its partial folder, with its progress written to a log the operator can follow."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from .errors import SyncError
from .manifest import PARTIAL_DIR, RSYNC_TEMP, write_json_atomic
from .messages import human
from .plan import FilePlan, partial_bytes
from .verifier import Verifier


@dataclass(frozen=True)
class Remote:
    """Where the destination pulls from, and how it authenticates (the key file never leaves the host)."""

    user: str
    address: str
    path: str  # as the remote rsync sees it (relative to the rrsync root when one is forced)
    ssh_key: str = ""
    known_hosts: str = ""
    ciphers: str = ""
    port: int = 22

    def ssh_command(self) -> str:
        parts = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
                 "-p", str(self.port)]
        if self.ssh_key:
            parts += ["-i", self.ssh_key]
        if self.known_hosts:
            parts += ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null"]
        if self.ciphers:
            parts += ["-c", self.ciphers]
        return shlex.join(parts)

    def spec(self) -> str:
        return f"{self.user}@{self.address}:{self.path.rstrip('/')}/"


def rsync_argv(remote: Remote, staging: Path, bwlimit_kbps: int = 0, extra: Iterable[str] = ()) -> list[str]:
    """rsync pulling the files named on stdin into staging, resumable from its partial directory. Symlinks are
    not followed (rrsync on the source refuses -L): the source must hold the files themselves."""
    argv = ["rsync", "--recursive", "--times", "--from0", "--files-from=-",
            f"--partial-dir={PARTIAL_DIR}", "--chmod=Du=rwx,Dgo=rx,Fu=rw,Fgo=r",
            "--info=progress2,stats2", "--no-inc-recursive", "--outbuf=L", "-e", remote.ssh_command()]
    if bwlimit_kbps:
        argv.append(f"--bwlimit={bwlimit_kbps}")
    argv += list(extra)
    return [*argv, remote.spec(), str(staging).rstrip("/") + "/"]


_PROGRESS = re.compile(r"^\s*(?P<bytes>[\d,]+)\s+(?P<pct>\d+)%\s+(?P<rate>\S+/s)\s+(?P<eta>[\d:]+)")
_STAT = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]+?): (?P<value>[\d,]+)")


def parse_progress(line: str) -> tuple[int, str] | None:
    """(bytes done, rate) from one rsync --info=progress2 line."""
    m = _PROGRESS.match(line)
    return (int(m["bytes"].replace(",", "")), m["rate"]) if m else None


def parse_stats(text: str) -> dict[str, int]:
    """rsync --stats numbers: literal_data, matched_data, total_bytes_received, total_transferred_file_size..."""
    out = {}
    for line in text.splitlines():
        m = _STAT.match(line.strip())
        if m:
            out[m["key"].strip().lower().replace(" ", "_")] = int(m["value"].replace(",", ""))
    return out


def adopt_stray_temps(staging: Path, paths: Iterable[str]) -> list[str]:
    """Move rsync temp files left by a killed receiver into the partial directory, so the next run
    resumes from them. The temp file holds a prefix of the file (written in order), a valid basis."""
    adopted = []
    for rel in paths:
        parent, base = (staging / rel).parent, Path(rel).name
        if not parent.is_dir():
            continue
        temps = sorted((p for p in parent.iterdir() if (m := RSYNC_TEMP.match(p.name)) and m["name"] == base
                        and p.is_file()), key=lambda p: p.stat().st_size)
        if not temps:
            continue
        partial = parent / PARTIAL_DIR / base
        partial.parent.mkdir(exist_ok=True)
        best = temps[-1]
        if not partial.exists() or partial.stat().st_size < best.stat().st_size:
            os.replace(best, partial)
            adopted.append(rel)
        for p in temps:
            if p.exists():
                p.unlink()
    return adopted


def _die_with_parent() -> None:
    """In the rsync child: get SIGTERM when this process dies, so rsync keeps its partial and stops."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Transfer:
    """What one rsync run moved."""

    files: int
    bytes: int
    seconds: float
    rc: int
    stats: dict[str, int]
    adopted_partials: list[str]
    resumed_bytes: int


class Progress:
    """Writes rsync's progress to the log the play names: bytes done/total, percent, rate."""

    def __init__(self, log: TextIO, name: str, total: int, every_s: float = 2.0,
                 heartbeat: Path | None = None) -> None:
        self.log, self.name, self.total, self.every_s = log, name, total, every_s
        self.heartbeat = heartbeat  # the deploy lock: touched with each line, a long transfer keeps the run alive
        self.last = 0.0
        self.started = time.monotonic()

    def update(self, done: int, rate: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        pct = 100.0 * done / self.total if self.total else 100.0
        avg = done / max(now - self.started, 1e-6)
        self.log.write(f"{time.strftime('%H:%M:%S')} {self.name}: {human(done)} / {human(self.total)} "
                       f"({pct:.1f}%) at {rate} (average {human(avg)}/s)\n")
        self.log.flush()
        if self.heartbeat is not None and self.heartbeat.exists():
            os.utime(self.heartbeat)


def _read_output(stdout: io.BufferedReader, progress: Progress) -> list[str]:
    """Follow rsync's output: progress lines go to the log, the rest (stats, errors) is returned."""
    tail: list[str] = []
    buf = b""
    while True:
        chunk = stdout.read1(65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            got = parse_progress(line)
            if got:
                progress.update(*got)
            elif line.strip():
                tail.append(line)
    return tail


def run_rsync(name: str, remote: Remote, staging: Path, files: list[FilePlan], log_path: Path,
              control: Path, bwlimit_kbps: int = 0, verifier: Verifier | None = None,
              heartbeat: Path | None = None) -> Transfer:
    """Pull `files` into staging with rsync; progress to log_path. The process group id is written to
    `control` so an operator (or a test) can tell which processes belong to this transfer."""
    staging.mkdir(parents=True, exist_ok=True)
    adopted = adopt_stray_temps(staging, [f.path for f in files])
    resumed = sum(partial_bytes(staging, f.path) for f in files)
    total = sum(f.size for f in files)
    argv = rsync_argv(remote, staging, bwlimit_kbps)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {name}: pulling {len(files)} files, {human(total)} "
                  f"from {remote.spec()} into {staging}" + (f" (resuming from {human(resumed)} already received)"
                                                             if resumed else "") + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
        write_json_atomic(control, {"pid": os.getpid(), "rsync_pgid": proc.pid, "model": name,
                                    "started": time.time(), "log": str(log_path)})

        def forward(signum: int, _frame: FrameType | None) -> None:
            os.killpg(proc.pid, signal.SIGTERM)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        assert proc.stdin is not None
        proc.stdin.write(b"".join(f.path.encode() + b"\0" for f in files))
        proc.stdin.close()
        progress = Progress(log, name, total, heartbeat=heartbeat)
        if verifier is not None:
            verifier.start()
        assert isinstance(proc.stdout, io.BufferedReader)
        tail = _read_output(proc.stdout, progress)
        rc = proc.wait()
        for s, h in previous.items():
            signal.signal(s, h)
        stats = parse_stats("\n".join(tail))
        done = stats.get("total_transferred_file_size", total if rc == 0 else 0)
        progress.update(done, f"{human(done / max(time.monotonic() - started, 1e-6))}/s", force=True)
        for line in tail:
            log.write(f"  {line}\n")
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {name}: rsync exited {rc}\n")
    if verifier is not None:
        verifier.stop.set()
        verifier.join()
    control.unlink(missing_ok=True)
    if rc != 0:
        errors = [line for line in tail if "error" in line.lower() or "rsync:" in line][-3:]
        why = " | ".join(errors) or f"see {log_path}"
        raise SyncError(f"{name}: rsync from {remote.spec()} exited {rc}: {why}; "
                        "partial files are kept in staging, run the sync again to resume")
    return Transfer(files=len(files), bytes=total, seconds=round(time.monotonic() - started, 3), rc=rc,
                    stats=stats, adopted_partials=adopted, resumed_bytes=resumed)
