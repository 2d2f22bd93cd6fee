"""Manifests: every file of a model folder with its size, sha256 and the mtime it was hashed at; the scan that
builds one (reading only files whose size or mtime changed since the cached manifest), and its cache file."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .errors import SyncError

SCHEMA = 1
CHUNK = 8 << 20
PARTIAL_DIR = ".rsync-partial"
# rsync writes a file being received as ".<name>.<6 random characters>" next to its final name.
RSYNC_TEMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9]{6}$")


@dataclass(frozen=True)
class FileEntry:
    """One file of a model folder: relative path, size, sha256, and the mtime it was hashed at."""

    path: str
    size: int
    sha256: str
    mtime_ns: int = 0

    def same_content(self, other: FileEntry) -> bool:
        """Same path, size and sha256, whatever the mtimes."""
        return self.path == other.path and self.size == other.size and self.sha256 == other.sha256


@dataclass
class Manifest:
    """Every file of one model folder, sorted by path."""

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
    def from_dict(cls, data: Any, source: str = "manifest") -> Manifest:
        """A manifest from its JSON form; a SyncError names what is missing."""
        if not isinstance(data, Mapping) or not isinstance(data.get("files"), list):
            raise SyncError(f"{source}: expected a manifest object with a `files` list, found {type(data).__name__}")
        try:
            files = [FileEntry(path=str(f["path"]), size=int(f["size"]), sha256=str(f["sha256"]),
                               mtime_ns=int(f.get("mtime_ns", 0))) for f in data["files"]]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SyncError(f"{source}: every file needs path, size and sha256 ({exc})") from None
        for entry in files:
            problem = path_problem(entry.path)
            if problem:
                raise SyncError(f"{source}: file {entry.path!r}: {problem}; a manifest names files inside its model "
                                "folder only")
        return cls(files=sorted(files, key=lambda f: f.path), root=str(data.get("root", "")))


@dataclass
class ScanStats:
    """What a scan cost: how many files and bytes it had to read and hash."""

    files: int = 0
    cached_files: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0


def path_problem(rel: str) -> str:
    """Why a manifest's file path could land outside its model folder ('' when it cannot): it must be relative,
    normalised and free of '..'."""
    if not rel or rel.startswith("/"):
        return "expected a relative path"
    if "\x00" in rel or os.path.normpath(rel) != rel or any(part in ("..", ".") for part in rel.split("/")):
        return "expected a normalised path without '.' or '..'"
    return ""


def excluded(name: str) -> bool:
    """Names a sync never treats as model files: rsync partials and temporaries."""
    return name == PARTIAL_DIR or RSYNC_TEMP.match(name) is not None


def list_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative posix path, stat) of every regular file below root, symlinks followed, sorted."""
    if not root.is_dir():
        raise SyncError(f"{root}: expected a model directory, found {'a file' if root.exists() else 'nothing'}")
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not excluded(d))
        for name in filenames:
            if excluded(name):
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


def sha256_stream(fh: BinaryIO, stats: ScanStats | None = None) -> str:
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
    """Manifest of a folder; files whose size and mtime match the cache (of the same root) are not read again."""
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
    except (OSError, ValueError):
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


def scan_cached(root: Path, cache_path: Path | None, write_cache: bool = True) -> tuple[Manifest, ScanStats, bool]:
    """Scan with the cache file; the cache is rewritten only when the manifest differs from it (and write_cache).
    Returns the manifest, what the scan read, and whether the cache file was (or, without write_cache, would be)
    written."""
    cache = read_manifest(cache_path) if cache_path else None
    manifest, stats = scan(root, cache)
    stale = cache_path is not None and (cache is None or cache.to_dict() != manifest.to_dict())
    if stale and write_cache and cache_path is not None:
        write_json_atomic(cache_path, manifest.to_dict())
    return manifest, stats, stale
