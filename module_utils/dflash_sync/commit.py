"""The commit: verify staged files (reusing the hashes taken while receiving), set owners and modes, flush,
rename each verified file into the final path (atomic, same file system), and the verified state of the copy."""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .manifest import FileEntry, Manifest, ScanStats, sha256_file
from .verifier import Verifier


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


def _differs(st: os.stat_result, mode: int, uid: int, gid: int) -> bool:
    return (st.st_mode & 0o7777) != mode or (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid)


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


def _tree(source: Manifest, dest: Path) -> tuple[list[Path], set[Path]]:
    """The files of the copy and its folders (the destination and every parent of a file)."""
    files = [dest / f.path for f in source.files]
    return files, {dest, *(p.parent for p in files)}


def _label(path: Path, dest: Path, folder: bool) -> str:
    return str(path.relative_to(dest)) + ("/" if folder else "")


def ownership_drift(source: Manifest, dest: Path, own: Ownership) -> list[str]:
    """Files and folders of the copy that exist with another owner or mode than the commit sets (read-only)."""
    uid, gid = own.ids()
    files, folders = _tree(source, dest)
    out = [_label(p, dest, False) for p in files if p.is_file() and _differs(p.stat(), own.file_mode, uid, gid)]
    out += [_label(d, dest, True) for d in folders if d.is_dir() and _differs(d.stat(), own.dir_mode, uid, gid)]
    return sorted(out)


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
            bad[rel] = (f"received {st.st_size} bytes with sha256 {digest[:12]}..., "
                        f"expected {f.size} / {f.sha256[:12]}...")
            p.unlink()
    return bad, stats


def commit(source: Manifest, dest: Path, staging: Path, paths: Iterable[str], extras: Iterable[str],
           own: Ownership, links: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """Rename verified staged files into dest (atomic per file, same file system), hard-link unchanged files from a
    kept version (rel, the same bytes there), delete extras, set modes."""
    uid, gid = own.ids()
    dest.mkdir(parents=True, exist_ok=True)
    moved: list[str] = []
    removed: list[str] = []
    linked: list[str] = []
    for rel, same in links:
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        os.link(same, dst)
        linked.append(rel)
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
    files, folders = _tree(source, dest)
    perms = [_label(p, dest, False) for p in files if _apply(p, own.file_mode, uid, gid)]
    for d in folders:
        if _apply(d, own.dir_mode, uid, gid):
            perms.append(_label(d, dest, True))
        _fsync_dir(d)
    return {"moved": moved, "removed": removed, "linked": linked, "permissions": sorted(perms)}


def dest_state(source: Manifest, dest: Path) -> Manifest:
    """The verified destination: the source's sizes and hashes with the destination's own mtimes."""
    files = [FileEntry(f.path, f.size, f.sha256, (dest / f.path).stat().st_mtime_ns) for f in source.files]
    return Manifest(files=files, root=str(dest))


def remove_tree(path: Path) -> None:
    """Remove a folder and everything below it (the staging folder after its commit)."""
    if not path.exists():
        return
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            os.rmdir(os.path.join(dirpath, name))
    os.rmdir(path)
