"""The destination plan: what a sync must do for each source file (nothing, adopt, transfer, verify what was
received), the extra files it removes, and whether the copy fits on the disk."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .manifest import PARTIAL_DIR, RSYNC_TEMP, FileEntry, Manifest, ScanStats, list_files, sha256_file
from .messages import human


@dataclass
class FilePlan:
    """What the destination needs for one source file."""

    path: str
    size: int
    action: str  # ok | adopt | transfer | staged | link
    reason: str = ""
    resume_bytes: int = 0  # bytes of an interrupted transfer already on disk
    link_from: str = ""  # link: the same bytes in a kept version, hard-linked instead of copied


@dataclass
class DestPlan:
    """Everything a sync would do at the destination, and whether it fits on the disk."""

    name: str
    files: list[FilePlan]
    extras: list[str]  # files this project wrote there (its last verified state lists them), gone from the source
    total_bytes: int
    free_bytes: int
    reserve_bytes: int
    hashed_bytes: int = 0
    hashed_files: int = 0
    problems: list[str] = field(default_factory=list)
    permissions: list[str] = field(default_factory=list)  # paths whose owner or mode the commit would set
    foreign: list[str] = field(default_factory=list)  # files no manifest of this project listed: never deleted
    versions: list[str] = field(default_factory=list)  # version steps: migration, removals (keep 1), synced version

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
        return any(f.action != "ok" for f in self.files) or bool(self.extras) or bool(self.permissions) \
            or bool(self.versions)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(transfer_files=[f.path for f in self.of("transfer")], transfer_bytes=self.transfer_bytes,
                   link_files=[f.path for f in self.of("link")], link_bytes=sum(f.size for f in self.of("link")),
                   staged_files=[f.path for f in self.of("staged")], adopt_files=[f.path for f in self.of("adopt")],
                   needed_bytes=self.needed_bytes, changes=self.changes)
        return out


def space_needed(files: Iterable[FilePlan]) -> int:
    """Bytes a sync still has to write. A resumed file is rebuilt next to its partial, so it counts in full;
    a replaced file frees its old copy only after the rename, so it counts in full too."""
    return sum(f.size for f in files if f.action == "transfer")


def free_space_problem(name: str, needed: int, free: int, reserve: int, where: str,
                       versions: bool = False) -> str | None:
    """A sentence when `needed` bytes plus the reserve do not fit in `free`, else None."""
    if needed + reserve <= free:
        return None
    keep = ("; or set dflash_model_versions_keep: 1 (the versions but the one in use are removed before the copy, "
            "and a rollback then cannot restore the models of an earlier deployment)") if versions else ""
    linked = " (the files that changed; unchanged ones are hard-linked)" if versions else ""
    return (f"{name}: the copy needs {human(needed)}{linked} plus a "
            f"reserve of {human(reserve)} on {where}, which has {human(free)} free; free "
            f"{human(needed + reserve - free)} or lower model_sync_reserve_bytes{keep}")


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding path (or its nearest parent)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def partial_bytes(staging: Path, rel: str) -> int:
    """Bytes already received for rel in an interrupted transfer (rsync partial or stray temp file)."""
    parent = (staging / rel).parent
    base = Path(rel).name
    sizes = [0]
    partial = parent / PARTIAL_DIR / base
    if partial.is_file():
        sizes.append(partial.stat().st_size)
    if parent.is_dir():
        for item in parent.iterdir():
            m = RSYNC_TEMP.match(item.name)
            if m and m["name"] == base and item.is_file():
                sizes.append(item.stat().st_size)
    return max(sizes)


def linkable(links: Iterable[tuple[Path, Manifest]]) -> dict[tuple[str, int], str]:
    """(sha256, size) -> a file of a kept verified copy that still has its verified size and mtime (hard-linkable)."""
    out: dict[tuple[str, int], str] = {}
    for folder, state in links:
        for rec in state.files:
            p = folder / rec.path
            try:
                st = p.lstat()
            except OSError:
                continue
            if (rec.sha256, rec.size) not in out and p.is_file() and not p.is_symlink() \
                    and (st.st_size, st.st_mtime_ns) == (rec.size, rec.mtime_ns):
                out[(rec.sha256, rec.size)] = str(p)
    return out


def _plan_file(f: FileEntry, st: os.stat_result | None, rec: FileEntry | None, dest: Path, staging: Path,
               full_verify: bool, stats: ScanStats, links: dict[tuple[str, int], str] | None = None) -> FilePlan:
    """The plan of one source file from its stat at the destination and its entry in the verified state."""
    if st is not None and st.st_size == f.size:
        if not full_verify and rec and rec.mtime_ns == st.st_mtime_ns and rec.size == f.size \
                and rec.sha256 == f.sha256:
            return FilePlan(f.path, f.size, "ok")
        digest = sha256_file(dest / f.path, stats)
        if digest == f.sha256:
            unrecorded = not rec or rec.mtime_ns != st.st_mtime_ns or rec.sha256 != digest
            return FilePlan(f.path, f.size, "adopt" if unrecorded else "ok",
                            "present with the right sha256" if unrecorded else "")
        reason = f"sha256 {digest[:12]}... differs from the source's {f.sha256[:12]}..."
    elif st is not None:
        reason = f"{st.st_size} bytes, the source has {f.size}"
    else:
        reason = "missing"
        same = (links or {}).get((f.sha256, f.size))
        if same:
            return FilePlan(f.path, f.size, "link", f"unchanged: hard-linked from {same}", link_from=same)
    staged = staging / f.path
    if staged.is_file() and staged.stat().st_size == f.size and staged.stat().st_mtime_ns == f.mtime_ns:
        return FilePlan(f.path, f.size, "staged", reason + "; received, to be verified")
    return FilePlan(f.path, f.size, "transfer", reason, partial_bytes(staging, f.path))


def plan_destination(name: str, source: Manifest, dest: Path, staging: Path, state: Manifest | None,
                     full_verify: bool = False, reserve: int = 0,
                     links: Iterable[tuple[Path, Manifest]] = (), versions: bool = False) -> DestPlan:
    """Compare a destination with the source manifest. Files the last verified sync recorded with the same
    size and mtime are trusted without reading them (unless full_verify); other same-size files are hashed.
    A missing file whose bytes a kept verified copy holds (`links`: folder and its verified state) is linked."""
    stats = ScanStats()
    known = state.by_path() if state else {}
    present = dict(list_files(dest)) if dest.is_dir() else {}
    same = linkable(links)
    plans = [_plan_file(f, present.get(f.path), known.get(f.path), dest, staging, full_verify, stats, same)
             for f in source.files]
    left = sorted(set(present) - {f.path for f in source.files})
    plan = DestPlan(name=name, files=plans, extras=[p for p in left if p in known], total_bytes=source.total_bytes,
                    free_bytes=free_bytes(dest), reserve_bytes=reserve,
                    hashed_bytes=stats.hashed_bytes, hashed_files=stats.hashed_files,
                    foreign=[p for p in left if p not in known])
    problem = free_space_problem(name, plan.needed_bytes, plan.free_bytes, reserve, str(dest.parent),
                                 versions)
    if problem:
        plan.problems.append(problem)
    return plan
