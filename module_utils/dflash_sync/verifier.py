"""Hashing while rsync receives: each file is followed through rsync's temporary file and hashed as it grows,
so its sha256 is known moments after rsync renames it into staging and nothing is left to hash afterwards."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .manifest import CHUNK, RSYNC_TEMP, FileEntry, ScanStats, sha256_stream


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
                        if (m := RSYNC_TEMP.match(entry.name)) is not None:
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
        """One look at staging: follow new temporary files, hash what grew, record what finished."""
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
                fh = open(self.staging / rel, "rb", buffering=0)  # noqa: SIM115 (closed by the with below)
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
