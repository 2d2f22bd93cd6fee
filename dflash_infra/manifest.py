#!/usr/bin/env python3
"""Model manifests and verified, resumable, atomic model copies.

A manifest lists every file of a model directory with its size and sha256. It is computed once at
the source and cached (a file is hashed again only when its size or mtime changes), verified at the
destination, and for production models checked against the published manifest. The copy itself is
rsync pulled by the destination into a staging directory on the same file system; files are
renamed into the final path only after their sha256 matched, so nothing half-written ever sits there.

Standard library only: the model_sync role runs this file on the hosts as `python3 - <command>`
(the containers have python3 but not this package); the controller imports it for the published
check and the free-space arithmetic.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import grp
import hashlib
import json
import os
import pwd
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEMA = 1
CHUNK = 8 << 20
PARTIAL_DIR = ".rsync-partial"
# rsync writes a file being received as ".<name>.<6 random characters>" next to its final name.
_RSYNC_TEMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9]{6}$")
DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4, "float8_e4m3fn": 1}
# Largest safetensors header we accept around the tensor bytes a published entry declares.
SAFETENSORS_HEADER_MAX = 16 << 20


class SyncError(ValueError):
    """A sync cannot go on; the message says what was expected, what was found and what to do."""


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    """One file of a model directory: relative path, size, sha256, and the mtime it was hashed at."""

    path: str
    size: int
    sha256: str
    mtime_ns: int = 0

    def same_content(self, other: FileEntry) -> bool:
        return self.path == other.path and self.size == other.size and self.sha256 == other.sha256


@dataclass
class Manifest:
    """Every file of one model directory, sorted by path."""

    files: list[FileEntry]
    root: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def digest(self) -> str:
        """sha256 of the content listing (path, size, sha256): equal for equal copies, whatever their mtimes."""
        lines = "".join(f"{f.sha256}  {f.size}  {f.path}\n" for f in sorted(self.files, key=lambda f: f.path))
        return hashlib.sha256(lines.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "root": self.root, "total_bytes": self.total_bytes,
                "manifest_sha256": self.digest(), "files": [asdict(f) for f in self.files]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "manifest") -> Manifest:
        if not isinstance(data, Mapping) or not isinstance(data.get("files"), list):
            raise SyncError(f"{source}: expected a manifest object with a `files` list, found {type(data).__name__}")
        try:
            files = [FileEntry(path=str(f["path"]), size=int(f["size"]), sha256=str(f["sha256"]),
                               mtime_ns=int(f.get("mtime_ns", 0))) for f in data["files"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise SyncError(f"{source}: every file needs path, size and sha256 ({exc})") from None
        return cls(files=sorted(files, key=lambda f: f.path), root=str(data.get("root", "")))


@dataclass
class ScanStats:
    """What a scan cost: how many files and bytes it had to read and hash."""

    files: int = 0
    cached_files: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0


def _excluded(name: str) -> bool:
    """Names a sync never treats as model files: rsync partials and temporaries."""
    return name == PARTIAL_DIR or _RSYNC_TEMP.match(name) is not None


def list_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative posix path, stat) of every regular file below root, symlinks followed, sorted."""
    if not root.is_dir():
        raise SyncError(f"{root}: expected a model directory, found {'a file' if root.exists() else 'nothing'}")
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not _excluded(d))
        for name in filenames:
            if _excluded(name):
                continue
            full = Path(dirpath) / name
            st = full.stat()
            if os.path.isfile(full):
                out.append((full.relative_to(root).as_posix(), st))
    return sorted(out)


def sha256_file(path: Path, stats: ScanStats | None = None) -> str:
    """sha256 of a file, read in large chunks (hashlib releases the GIL, so threads overlap)."""
    with open(path, "rb", buffering=0) as fh:
        return sha256_stream(fh, stats)


def sha256_stream(fh: Any, stats: ScanStats | None = None) -> str:
    """sha256 of an open (unbuffered) file from its current position to its end."""
    h = hashlib.sha256()
    while True:
        block = fh.read(CHUNK)
        if not block:
            break
        h.update(block)
        if stats is not None:
            stats.hashed_bytes += len(block)
    if stats is not None:
        stats.hashed_files += 1
    return h.hexdigest()


def scan(root: Path, cache: Manifest | None = None) -> tuple[Manifest, ScanStats]:
    """Manifest of a directory; files whose size and mtime match the cache (of the same root) are not read again."""
    known = cache.by_path() if cache and cache.root in ("", str(root)) else {}
    stats = ScanStats()
    files = []
    for rel, st in list_files(root):
        stats.files += 1
        hit = known.get(rel)
        if hit and hit.size == st.st_size and hit.mtime_ns == st.st_mtime_ns and hit.sha256:
            stats.cached_files += 1
            files.append(hit)
            continue
        files.append(FileEntry(rel, st.st_size, sha256_file(root / rel, stats), st.st_mtime_ns))
    return Manifest(files=files, root=str(root)), stats


def read_manifest(path: Path) -> Manifest | None:
    """A cached manifest, or None when it is missing or unreadable (it is then rebuilt)."""
    try:
        return Manifest.from_dict(json.loads(path.read_text()), str(path))
    except (OSError, ValueError, SyncError):
        return None


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    """Write JSON next to its final name, fsync, then rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Published manifests (production models)
# ---------------------------------------------------------------------------------------------


def published_problems(name: str, manifest: Manifest, entry: Mapping[str, Any] | None) -> list[str]:
    """Why a manifest is not the published model `name` (empty when every published fact matches)."""
    if not entry:
        return [f"{name}: no published manifest is known (dflash_infra/data/models/published-files.json); "
                "add it or switch the published check off for this inventory"]
    files = manifest.by_path()
    problems = []
    for shard in entry.get("shards") or []:
        got = files.get(shard["file"])
        if got is None:
            problems.append(f"{name}: published shard {shard['file']} is missing")
            continue
        if int(shard["bytes"]) != got.size:
            problems.append(f"{name}: {shard['file']} is {got.size} bytes, the published file has {shard['bytes']}")
        elif shard.get("sha256") and shard["sha256"] != got.sha256:
            problems.append(f"{name}: {shard['file']} sha256 {got.sha256[:12]}... differs from the published "
                            f"{shard['sha256'][:12]}...")
    for item in entry.get("files") or []:
        got = files.get(item["file"])
        if got is None:
            problems.append(f"{name}: published file {item['file']} is missing")
            continue
        prefix = item.get("sha256_prefix") or item.get("sha256")
        if prefix and not got.sha256.startswith(str(prefix)):
            problems.append(f"{name}: {item['file']} sha256 {got.sha256[:12]}... does not start with the published "
                            f"{prefix}")
        if item.get("parameters"):
            data = int(item["parameters"]) * DTYPE_BYTES.get(str(item.get("dtype", "bfloat16")).lower(), 2)
            if not data <= got.size <= data + SAFETENSORS_HEADER_MAX:
                problems.append(f"{name}: {item['file']} is {got.size} bytes; {item['parameters']} "
                                f"{item.get('dtype', 'bfloat16')} parameters need {data} bytes plus a header")
    index_sha = entry.get("index_sha256")
    index = files.get("model.safetensors.index.json")
    if index_sha and (index is None or index.sha256 != index_sha):
        found = "missing" if index is None else f"sha256 {index.sha256[:12]}..."
        problems.append(f"{name}: model.safetensors.index.json is {found}, published {index_sha[:12]}...")
    return problems


# ---------------------------------------------------------------------------------------------
# Destination plan and free-space arithmetic
# ---------------------------------------------------------------------------------------------


@dataclass
class FilePlan:
    """What the destination needs for one source file."""

    path: str
    size: int
    action: str  # ok | adopt | transfer | staged
    reason: str = ""
    resume_bytes: int = 0  # bytes of an interrupted transfer already on disk


@dataclass
class DestPlan:
    """Everything a sync would do at the destination, and whether it fits on the disk."""

    name: str
    files: list[FilePlan]
    extras: list[str]
    total_bytes: int
    free_bytes: int
    reserve_bytes: int
    hashed_bytes: int = 0
    hashed_files: int = 0
    problems: list[str] = field(default_factory=list)

    def of(self, action: str) -> list[FilePlan]:
        return [f for f in self.files if f.action == action]

    @property
    def transfer_bytes(self) -> int:
        return sum(f.size for f in self.of("transfer"))

    @property
    def needed_bytes(self) -> int:
        return space_needed(self.files)

    @property
    def changes(self) -> bool:
        return any(f.action != "ok" for f in self.files) or bool(self.extras)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(transfer_files=[f.path for f in self.of("transfer")], transfer_bytes=self.transfer_bytes,
                   staged_files=[f.path for f in self.of("staged")], adopt_files=[f.path for f in self.of("adopt")],
                   needed_bytes=self.needed_bytes, changes=self.changes)
        return out


def space_needed(files: Iterable[FilePlan]) -> int:
    """Bytes a sync still has to write. A resumed file is rebuilt next to its partial, so it counts in full;
    a replaced file frees its old copy only after the rename, so it counts in full too."""
    return sum(f.size for f in files if f.action == "transfer")


def free_space_problem(name: str, needed: int, free: int, reserve: int, where: str) -> str | None:
    """A sentence when `needed` bytes plus the reserve do not fit in `free`, else None."""
    if needed + reserve <= free:
        return None
    return (f"{name}: the copy needs {human(needed)} plus a reserve of {human(reserve)} on {where}, "
            f"which has {human(free)} free; free {human(needed + reserve - free)} or lower model_sync_reserve_bytes")


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding path (or its nearest parent)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def _partial_bytes(staging: Path, rel: str) -> int:
    """Bytes already received for rel in an interrupted transfer (rsync partial or stray temp file)."""
    parent = (staging / rel).parent
    base = Path(rel).name
    sizes = [0]
    partial = parent / PARTIAL_DIR / base
    if partial.is_file():
        sizes.append(partial.stat().st_size)
    if parent.is_dir():
        for item in parent.iterdir():
            m = _RSYNC_TEMP.match(item.name)
            if m and m["name"] == base and item.is_file():
                sizes.append(item.stat().st_size)
    return max(sizes)


def plan_destination(name: str, source: Manifest, dest: Path, staging: Path, state: Manifest | None,
                     full_verify: bool = False, reserve: int = 0) -> DestPlan:
    """Compare a destination with the source manifest. Files the last verified sync recorded with the same
    size and mtime are trusted without reading them (unless full_verify); other same-size files are hashed."""
    stats = ScanStats()
    known = state.by_path() if state else {}
    present = dict(list_files(dest)) if dest.is_dir() else {}
    plans = []
    for f in source.files:
        st = present.get(f.path)
        if st is not None and st.st_size == f.size:
            rec = known.get(f.path)
            if not full_verify and rec and rec.mtime_ns == st.st_mtime_ns and rec.size == f.size \
                    and rec.sha256 == f.sha256:
                plans.append(FilePlan(f.path, f.size, "ok"))
                continue
            digest = sha256_file(dest / f.path, stats)
            if digest == f.sha256:
                unrecorded = not rec or rec.mtime_ns != st.st_mtime_ns or rec.sha256 != digest
                plans.append(FilePlan(f.path, f.size, "adopt" if unrecorded else "ok",
                                      "present with the right sha256" if unrecorded else ""))
                continue
            reason = f"sha256 {digest[:12]}... differs from the source's {f.sha256[:12]}..."
        elif st is not None:
            reason = f"{st.st_size} bytes, the source has {f.size}"
        else:
            reason = "missing"
        staged = staging / f.path
        if staged.is_file() and staged.stat().st_size == f.size and staged.stat().st_mtime_ns == f.mtime_ns:
            plans.append(FilePlan(f.path, f.size, "staged", reason + "; received, to be verified"))
        else:
            plans.append(FilePlan(f.path, f.size, "transfer", reason, _partial_bytes(staging, f.path)))
    extras = sorted(set(present) - {f.path for f in source.files})
    plan = DestPlan(name=name, files=plans, extras=extras, total_bytes=source.total_bytes,
                    free_bytes=free_bytes(dest), reserve_bytes=reserve,
                    hashed_bytes=stats.hashed_bytes, hashed_files=stats.hashed_files)
    problem = free_space_problem(name, plan.needed_bytes, plan.free_bytes, reserve, str(dest.parent))
    if problem:
        plan.problems.append(problem)
    return plan


# ---------------------------------------------------------------------------------------------
# Transfer: rsync pulled by the destination into the staging directory
# ---------------------------------------------------------------------------------------------


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
    return argv + [remote.spec(), str(staging).rstrip("/") + "/"]


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
        temps = sorted((p for p in parent.iterdir() if (m := _RSYNC_TEMP.match(p.name)) and m["name"] == base
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
    """In the rsync child: get SIGTERM when this tool dies, so rsync keeps its partial and stops."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


@dataclass
class _Follow:
    """A file rsync is writing, hashed as it grows: rsync writes its temporary file front to back."""

    fd: int
    ino: int
    offset: int = 0
    digest: Any = field(default_factory=hashlib.sha256)


class Verifier(threading.Thread):
    """Hashes files in staging while rsync receives them, then flushes each to disk, so a file's sha256 is known
    moments after rsync renames it into staging and the transfer never waits for it. A file is followed through
    rsync's temporary file (".<name>.XXXXXX"); the hash counts only when the finished file is that same inode
    with the manifest's size and mtime. Files it could not follow are hashed once finished."""

    def __init__(self, staging: Path, wanted: dict[str, FileEntry], interval_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.staging, self.wanted, self.interval_s = staging, dict(wanted), interval_s
        self.done: dict[str, tuple[int, int, int, str]] = {}  # path -> (size, mtime_ns, inode, sha256)
        self.stats = ScanStats()
        self.streamed_bytes = 0  # hashed while rsync was still writing the file
        self.stop = threading.Event()
        self._following: dict[str, _Follow] = {}
        self._buf = memoryview(bytearray(CHUNK))

    def _temps(self) -> dict[str, Path]:
        """rsync's temporary file of each wanted file not yet hashed (only when there is exactly one)."""
        by_dir: dict[Path, dict[str, list[Path]]] = {}
        out = {}
        for rel in self.wanted:
            if rel in self.done:
                continue
            parent = (self.staging / rel).parent
            if parent not in by_dir:
                names: dict[str, list[Path]] = {}
                try:
                    for entry in os.scandir(parent):
                        if (m := _RSYNC_TEMP.match(entry.name)) is not None:
                            names.setdefault(m["name"], []).append(Path(entry.path))
                except FileNotFoundError:
                    pass
                by_dir[parent] = names
            temps = by_dir[parent].get(Path(rel).name, [])
            if len(temps) == 1:
                out[rel] = temps[0]
        return out

    def _read(self, f: _Follow, end: int) -> None:
        while f.offset < end:
            n = os.preadv(f.fd, [self._buf[:min(CHUNK, end - f.offset)]], f.offset)
            if n <= 0:
                break
            f.digest.update(self._buf[:n])
            f.offset += n
            self.stats.hashed_bytes += n

    def _close(self, rel: str) -> None:
        os.close(self._following.pop(rel).fd)

    def _complete(self, rel: str, st: os.stat_result) -> bool:
        """The manifest's size and mtime at the staging name: complete (rsync sets the mtime on its temporary
        file before renaming it)."""
        return (st.st_size, st.st_mtime_ns) == (self.wanted[rel].size, self.wanted[rel].mtime_ns)

    def _finished(self, rel: str) -> os.stat_result | None:
        """The file at its staging name when it is complete."""
        try:
            st = (self.staging / rel).stat()
        except FileNotFoundError:
            return None
        return st if self._complete(rel, st) else None

    def _flush(self, rel: str, fd: int, st: os.stat_result, sha256: str) -> None:
        """Record the hash and flush the file to disk now, so the commit's fsync overlaps the transfer."""
        os.fsync(fd)
        self.done[rel] = (st.st_size, st.st_mtime_ns, st.st_ino, sha256)

    def poll(self) -> None:
        temps = self._temps()
        for rel, path in temps.items():
            if rel not in self._following:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    continue  # renamed meanwhile: hashed below once finished
                self._following[rel] = _Follow(fd, os.fstat(fd).st_ino)
        for rel, f in list(self._following.items()):
            st = self._finished(rel)
            if st is not None and st.st_ino == f.ino:
                before = f.offset
                self._read(f, st.st_size)
                self.streamed_bytes += before
                if f.offset == st.st_size:
                    self.stats.hashed_files += 1
                    self._flush(rel, f.fd, st, f.digest.hexdigest())
                self._close(rel)
            elif rel in temps and _inode(temps[rel]) == f.ino:
                self._read(f, os.fstat(f.fd).st_size)
            else:
                self._close(rel)  # rsync kept it as a partial (killed) or wrote it again under another name
        for rel in self.wanted:
            if rel in self.done or rel in self._following:
                continue
            try:
                fh = open(self.staging / rel, "rb", buffering=0)
            except FileNotFoundError:
                continue
            with fh:
                st = os.fstat(fh.fileno())
                if self._complete(rel, st):
                    self._flush(rel, fh.fileno(), st, sha256_stream(fh, self.stats))

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(self.interval_s)
        self.poll()  # files rsync finished after the last poll
        for rel in list(self._following):
            self._close(rel)


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

    def __init__(self, log, name: str, total: int, every_s: float = 2.0) -> None:
        self.log, self.name, self.total, self.every_s = log, name, total, every_s
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


def run_rsync(name: str, remote: Remote, staging: Path, files: list[FilePlan], log_path: Path,
              control: Path, bwlimit_kbps: int = 0, verifier: Verifier | None = None) -> Transfer:
    """Pull `files` into staging with rsync; progress to log_path. The process group id is written to
    `control` so an operator (or a test) can tell which processes belong to this transfer."""
    staging.mkdir(parents=True, exist_ok=True)
    adopted = adopt_stray_temps(staging, [f.path for f in files])
    resumed = sum(_partial_bytes(staging, f.path) for f in files)
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

        def forward(signum: int, _frame: Any) -> None:
            os.killpg(proc.pid, signal.SIGTERM)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"".join(f.path.encode() + b"\0" for f in files))
        proc.stdin.close()
        progress = Progress(log, name, total)
        tail: list[str] = []
        buf = b""
        if verifier is not None:
            verifier.start()
        while True:
            chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(4096)
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
        raise SyncError(f"{name}: rsync from {remote.spec()} exited {rc}: {' | '.join(errors) or 'see ' + str(log_path)}; "
                        "partial files are kept in staging, run the sync again to resume")
    return Transfer(files=len(files), bytes=total, seconds=round(time.monotonic() - started, 3), rc=rc,
                    stats=stats, adopted_partials=adopted, resumed_bytes=resumed)


# ---------------------------------------------------------------------------------------------
# Commit: verify staged files, rename them into the final path, record the verified state
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ownership:
    """Who owns the synced files and with what modes (readable by the service user)."""

    owner: str = ""
    group: str = ""
    file_mode: int = 0o644
    dir_mode: int = 0o755

    def ids(self) -> tuple[int, int]:
        uid = pwd.getpwnam(self.owner).pw_uid if self.owner else -1
        gid = grp.getgrnam(self.group).gr_gid if self.group else -1
        return uid, gid


def _apply(path: Path, mode: int, uid: int, gid: int) -> bool:
    """chmod/chown path when it differs; True when something changed."""
    st = path.stat()
    changed = False
    if (st.st_mode & 0o7777) != mode:
        os.chmod(path, mode)
        changed = True
    if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
        os.chown(path, uid, gid)
        changed = True
    return changed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_staged(source: Manifest, staging: Path, paths: Iterable[str],
                  verifier: Verifier | None = None) -> tuple[dict[str, str], ScanStats]:
    """sha256 of each staged file (reusing hashes taken during the transfer) -> {path: problem} for bad ones."""
    stats = verifier.stats if verifier else ScanStats()
    wanted = source.by_path()
    bad = {}
    for rel in paths:
        f, p = wanted[rel], staging / rel
        if not p.is_file():
            bad[rel] = "was not received"
            continue
        st = p.stat()
        pre = verifier.done.get(rel) if verifier else None
        digest = pre[3] if pre and pre[:3] == (st.st_size, st.st_mtime_ns, st.st_ino) else ""
        if digest != f.sha256:  # not hashed during the transfer, or hashed there differently: read it once more
            digest = sha256_file(p, stats)
        if st.st_size != f.size or digest != f.sha256:
            bad[rel] = f"received {st.st_size} bytes with sha256 {digest[:12]}..., expected {f.size} / {f.sha256[:12]}..."
            p.unlink()
    return bad, stats


def commit(source: Manifest, dest: Path, staging: Path, paths: Iterable[str], extras: Iterable[str],
           own: Ownership) -> dict[str, Any]:
    """Rename verified staged files into dest (atomic per file, same file system), delete extras, set modes."""
    uid, gid = own.ids()
    dest.mkdir(parents=True, exist_ok=True)
    moved, removed, perms = [], [], []
    for rel in paths:
        src, dst = staging / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        _apply(src, own.file_mode, uid, gid)
        with open(src, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(src, dst)
        moved.append(rel)
    for rel in extras:
        (dest / rel).unlink()
        removed.append(rel)
    for f in source.files:
        if _apply(dest / f.path, own.file_mode, uid, gid):
            perms.append(f.path)
    for d in {dest, *((dest / f.path).parent for f in source.files)}:
        if _apply(d, own.dir_mode, uid, gid):
            perms.append(str(d.relative_to(dest)) + "/")
        _fsync_dir(d)
    return {"moved": moved, "removed": removed, "permissions": sorted(perms)}


def dest_state(source: Manifest, dest: Path) -> Manifest:
    """The verified destination: the source's sizes and hashes with the destination's own mtimes."""
    files = [FileEntry(f.path, f.size, f.sha256, (dest / f.path).stat().st_mtime_ns) for f in source.files]
    return Manifest(files=files, root=str(dest))


class Lock:
    """An exclusive lock per model, so two syncs never write the same staging directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise SyncError(f"{self.path}: another sync of this model is running (pid {holder}); "
                            "wait for it or stop it, then run again") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)


@dataclass
class SyncOptions:
    name: str
    source: Manifest
    dest: Path
    staging: Path
    state_file: Path
    log: Path
    remote: Remote | None = None
    full_verify: bool = False
    reserve: int = 0
    bwlimit_kbps: int = 0
    delete_extra: bool = True
    own: Ownership = field(default_factory=Ownership)
    retries: int = 1


def sync(opt: SyncOptions) -> dict[str, Any]:
    """Make opt.dest an exact, verified copy of the source manifest; returns the report (also saved)."""
    started = time.monotonic()
    with Lock(opt.staging.parent / f"{opt.name}.lock"):
        state = read_manifest(opt.state_file)
        plan = plan_destination(opt.name, opt.source, opt.dest, opt.staging, state, opt.full_verify, opt.reserve)
        if plan.problems:
            raise SyncError("; ".join(plan.problems))
        transfers: list[dict[str, Any]] = []
        hashed = ScanStats(hashed_bytes=plan.hashed_bytes, hashed_files=plan.hashed_files)
        streamed = 0
        pending = plan.of("transfer")
        to_commit = [f.path for f in plan.of("staged")]
        failures: dict[str, str] = {}
        for attempt in range(opt.retries + 1):
            verifier = None
            if pending:
                if opt.remote is None:
                    raise SyncError(f"{opt.name}: {len(pending)} files are missing or differ at {opt.dest} "
                                    f"({', '.join(f.path for f in pending[:3])}...) and no source was given; "
                                    "sync from a source host or path")
                verifier = Verifier(opt.staging, {f.path: opt.source.by_path()[f.path] for f in pending})
                t = run_rsync(opt.name, opt.remote, opt.staging, pending, opt.log,
                              opt.staging.parent / f"{opt.name}.transfer.json", opt.bwlimit_kbps, verifier)
                transfers.append(asdict(t))
            check = to_commit + [f.path for f in pending]
            failures, stats = verify_staged(opt.source, opt.staging, check, verifier)
            streamed += verifier.streamed_bytes if verifier else 0
            hashed.hashed_bytes += stats.hashed_bytes
            hashed.hashed_files += stats.hashed_files
            to_commit = [p for p in check if p not in failures]
            wanted = opt.source.by_path()
            pending = [FilePlan(p, wanted[p].size, "transfer", "failed verification") for p in failures]
            if not failures or opt.remote is None:
                break
        if failures:
            raise SyncError(f"{opt.name}: {len(failures)} files failed verification after the transfer: "
                            + "; ".join(f"{p}: {why}" for p, why in list(failures.items())[:3])
                            + ". The bad copies were removed; check the source and run again")
        extras = plan.extras if opt.delete_extra else []
        done = commit(opt.source, opt.dest, opt.staging, to_commit, extras, opt.own)
        verified = dest_state(opt.source, opt.dest)
        write_json_atomic(opt.state_file, verified.to_dict())
        _remove_tree(opt.staging)
        changed = bool(done["moved"] or done["removed"] or done["permissions"] or plan.of("adopt"))
        report = {"name": opt.name, "dest": str(opt.dest), "changed": changed,
                  "manifest_sha256": opt.source.digest(), "total_bytes": opt.source.total_bytes,
                  "files": len(opt.source.files), "adopted": [f.path for f in plan.of("adopt")],
                  "repaired": [f.path for f in plan.files if f.action in ("transfer", "staged")
                               and f.reason != "missing" and not f.reason.startswith("missing")],
                  "transfers": transfers, "hashed_bytes": hashed.hashed_bytes, "hashed_files": hashed.hashed_files,
                  "hashed_while_receiving": streamed,
                  "seconds": round(time.monotonic() - started, 3), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  **done}
        write_json_atomic(opt.state_file.with_name(f"{opt.name}.sync.json"), report)
        return report


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            os.rmdir(os.path.join(dirpath, name))
    os.rmdir(path)


# ---------------------------------------------------------------------------------------------
# Reading what was synced (for the planner's checks)
# ---------------------------------------------------------------------------------------------


def describe(root: Path) -> dict[str, Any]:
    """config.json and the index's metadata.total_size of a model directory (small files only)."""
    out: dict[str, Any] = {"path": str(root), "present": (root / "config.json").is_file()}
    if out["present"]:
        out["config"] = json.loads((root / "config.json").read_text())
    index = root / "model.safetensors.index.json"
    if index.is_file():
        out["index_total_size"] = int((json.loads(index.read_text()).get("metadata") or {}).get("total_size") or 0)
    if root.is_dir():
        out["weights_file_bytes"] = sum(st.st_size for rel, st in list_files(root) if rel.endswith(".safetensors"))
    return out


# ---------------------------------------------------------------------------------------------
# Command line (what the role runs on the hosts)
# ---------------------------------------------------------------------------------------------


def _io_read_bytes() -> int:
    """Bytes this process read through read() so far (/proc/self/io rchar): proof of what a run read."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def _manifest_arg(args: argparse.Namespace) -> Manifest:
    if args.manifest_json:
        return Manifest.from_dict(json.loads(args.manifest_json), "--manifest-json")
    return Manifest.from_dict(json.loads(Path(args.manifest).read_text()), args.manifest)


def _cmd_scan(args: argparse.Namespace) -> dict[str, Any]:
    cache_path = Path(args.cache).expanduser() if args.cache else None
    cache = read_manifest(cache_path) if cache_path else None
    manifest, stats = scan(Path(args.root), cache)
    if cache_path and not args.no_write_cache:
        write_json_atomic(cache_path, manifest.to_dict())
    return {**manifest.to_dict(), "scan": asdict(stats)}


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    plan = plan_destination(args.name, _manifest_arg(args), Path(args.dest), Path(args.staging),
                            read_manifest(Path(args.state)), args.verify == "full", args.reserve_bytes)
    return plan.to_dict()


def _cmd_sync(args: argparse.Namespace) -> dict[str, Any]:
    remote = None
    if args.source:
        user, _, rest = args.source.rpartition("@")
        address, _, path = rest.partition(":")
        remote = Remote(user or "root", address, path, args.ssh_key, args.known_hosts, args.ciphers, args.port)
    own = Ownership(args.owner, args.group, int(args.file_mode, 8), int(args.dir_mode, 8))
    return sync(SyncOptions(args.name, _manifest_arg(args), Path(args.dest), Path(args.staging), Path(args.state),
                            Path(args.log), remote, args.verify == "full", args.reserve_bytes, args.bwlimit_kbps,
                            not args.keep_extra, own))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="manifest.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("scan", help="manifest of a directory (cached by size and mtime)")
    p.add_argument("--root", required=True)
    p.add_argument("--cache", default="")
    p.add_argument("--no-write-cache", action="store_true", help="read the cache but leave it unchanged (check mode)")
    for name in ("plan", "sync"):
        p = sub.add_parser(name)
        p.add_argument("--name", required=True)
        p.add_argument("--manifest", default="")
        p.add_argument("--manifest-json", default="")
        p.add_argument("--dest", required=True)
        p.add_argument("--staging", required=True)
        p.add_argument("--state", required=True, help="verified-state file of this model at the destination")
        p.add_argument("--verify", choices=("changed", "full"), default="changed")
        p.add_argument("--reserve-bytes", type=int, default=0)
    p.add_argument("--source", default="", help="user@address:path to pull from; empty when staged or present")
    p.add_argument("--ssh-key", default="")
    p.add_argument("--known-hosts", default="")
    p.add_argument("--ciphers", default="")
    p.add_argument("--port", type=int, default=22)
    p.add_argument("--log", required=True)
    p.add_argument("--bwlimit-kbps", type=int, default=0)
    p.add_argument("--owner", default="")
    p.add_argument("--group", default="")
    p.add_argument("--file-mode", default="0644")
    p.add_argument("--dir-mode", default="0755")
    p.add_argument("--keep-extra", action="store_true")
    p = sub.add_parser("describe", help="config.json and index total_size of model directories")
    p.add_argument("roots", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "describe":
            result: Any = {"models": [describe(Path(r)) for r in args.roots]}
        else:
            result = {"scan": _cmd_scan, "plan": _cmd_plan, "sync": _cmd_sync}[args.command](args)
    except (SyncError, OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}), file=sys.stdout)
        print(f"manifest.py {args.command}: {exc}", file=sys.stderr)
        return 2
    result["io_read_bytes"] = _io_read_bytes()
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
