"""The sync of one model: plan under the model's lock, pull what is missing into staging while hashing it,
verify, commit, record the verified state. A sync with nothing to do writes nothing and reads no model byte."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .commit import Ownership, commit, dest_state, ownership_drift, remove_tree, verify_staged
from .errors import SyncError
from .lock import Lock
from .manifest import Manifest, ScanStats, read_manifest, write_json_atomic
from .plan import DestPlan, FilePlan, plan_destination
from .rsync import Remote, run_rsync
from .verifier import Verifier
from .versions import (
    ModelHome,
    label_of,
    link_sources,
    mark_synced,
    migrate,
    prune_plan,
    read_versions,
    remove_versions,
)


@dataclass(frozen=True)
class ModelPaths:
    """Where one model's copy, staging folder, verified state, report, log and lock live at the destination."""

    dest: Path
    staging: Path
    state_file: Path
    report_file: Path
    log: Path
    lock: Path
    control: Path

    @classmethod
    def of(cls, name: str, dest: Path, state_dir: Path, log_dir: Path) -> ModelPaths:
        """The conventions: staging in <dest parent>/.dflash-staging/<name> (same file system as dest), state and
        report in state_dir, progress in log_dir/model-sync-<name>.log."""
        stage_root = dest.parent / ".dflash-staging"
        return cls(dest=dest, staging=stage_root / name, state_file=state_dir / f"{name}.manifest.json",
                   report_file=state_dir / f"{name}.sync.json", log=log_dir / f"model-sync-{name}.log",
                   lock=stage_root / f"{name}.lock", control=stage_root / f"{name}.transfer.json")

    @classmethod
    def of_version(cls, home: ModelHome, label: str, log_dir: Path) -> ModelPaths:
        """One version of a model (versions.py): its folder and verified state; staging, lock and report beside the
        configured path, as for a folder of its own."""
        plain = cls.of(home.name, home.path, home.state_dir, log_dir)
        return cls(dest=home.folder(label), staging=plain.staging, state_file=home.state_file(label),
                   report_file=plain.report_file, log=plain.log, lock=plain.lock, control=plain.control)


@dataclass
class SyncOptions:
    """One model's sync: its source manifest, where it goes, where it comes from, and how it is checked."""

    name: str
    source: Manifest
    paths: ModelPaths
    remote: Remote | None = None
    full_verify: bool = False
    reserve: int = 0
    bwlimit_kbps: int = 0
    delete_extra: bool = True
    own: Ownership = field(default_factory=Ownership)
    retries: int = 1
    # The model root every destination must lie under (dflash_model_root); None: not checked (the library's own tests).
    root: Path | None = None
    # Refuse, rather than leave and name, files at the destination that no manifest of this project listed.
    strict: bool = False
    # The deploy lock, touched as the transfer progresses (the run's heartbeat during a long copy); None: none.
    heartbeat: Path | None = None
    # Versions (versions.py): the model's configured path and states; None: the destination is the folder itself.
    home: ModelHome | None = None
    # How many versions that passed a deploy are kept (1: the others are removed before the copy).
    keep: int = 2


def destination_problem(name: str, dest: Path, root: Path | None) -> str:
    """Why a model's destination is not one this project may write into ('' when it is): an absolute, normalised
    folder strictly under the model root (a path one level too high would make every other file there an extra)."""
    text = str(dest)
    if not dest.is_absolute() or os.path.normpath(text) != text or ".." in dest.parts:
        return (f"{name}: expected an absolute, normalised destination without '..', found {text!r}; set the "
                "model's path in dflash_models")
    if root is None:
        return ""
    real_root, real_dest = os.path.realpath(root), os.path.realpath(dest)
    if real_dest == real_root or not real_dest.startswith(real_root.rstrip("/") + "/"):
        return (f"{name}: the destination {text} is not a folder under the model root {root} (dflash_model_root); "
                "refusing to sync there: a model folder one level too high would make every other file there an "
                "extra. Fix the model's path in dflash_models")
    return ""


def _plan(opt: SyncOptions, state: Manifest | None) -> DestPlan:
    for dest in dict.fromkeys([opt.home.path, opt.paths.dest] if opt.home else [opt.paths.dest]):
        where = destination_problem(opt.name, dest, opt.root)
        if where:
            raise SyncError(where + ". Nothing was copied or removed")
    links = link_sources(opt.home) if opt.home else []
    plan = plan_destination(opt.name, opt.source, opt.paths.dest, opt.paths.staging, state, opt.full_verify,
                            opt.reserve, links, opt.home is not None)
    if not opt.delete_extra:
        plan.extras = []
    if opt.strict and plan.foreign:
        plan.problems.append(f"{opt.name}: {len(plan.foreign)} files at {opt.paths.dest} were not written by this "
                             f"project ({', '.join(plan.foreign[:3])}); model_sync_strict refuses to sync beside them. "
                             "Move them away or turn strict off (they are then left and named)")
    if opt.paths.dest.is_dir():
        plan.permissions = ownership_drift(opt.source, opt.paths.dest, opt.own)
    return plan


def preview(opt: SyncOptions) -> DestPlan:
    """What sync(opt) would do, changing nothing (check mode and the deploy's plan stage)."""
    plan = _plan(opt, read_manifest(opt.paths.state_file))
    if opt.home:
        plan.versions = _version_steps(opt, check=True)
    return plan


def _version_steps(opt: SyncOptions, check: bool) -> list[str]:
    """The old layout migrated, the versions beyond the one in use removed when only one is kept (before the copy,
    for its space), and whether the synced version changes: what was done (under check, what would be)."""
    assert opt.home is not None
    home, label = opt.home, label_of(opt.source.digest())
    steps = migrate(home, check)
    doc = read_versions(home)
    if opt.keep == 1:
        drop, _ = prune_plan(home, 1, {**doc, "synced": label, "order": [doc.get("current") or label]})
        if drop:
            steps.append(f"removed the versions {', '.join(drop)} (dflash_model_versions_keep is 1: a rollback cannot "
                         "restore the models of an earlier deployment)")
            if not check:
                remove_versions(home, drop)
    if doc.get("synced") != label:
        steps.append(f"the plan serves version {label} (was {doc.get('synced') or 'none'})")
    return steps


def diff(plan: Mapping[str, Any]) -> dict[str, str]:
    """Before/after file lists of a sync from its plan (DestPlan.to_dict()): the files at the destination, with
    why each one changes, and the source's files."""
    before = [f"{f['path']}  [{f['reason'] or 'owner or mode to set'}]"
              if f["action"] != "ok" or f["path"] in plan["permissions"] else f["path"]
              for f in plan["files"] if not f["reason"].startswith("missing")]
    before += [f"{rel}  [not in the source]" for rel in plan["extras"]]
    after = [f["path"] for f in plan["files"]]
    return {"before": "".join(f"{line}\n" for line in sorted(before)),
            "after": "".join(f"{line}\n" for line in sorted(after)),
            "before_header": f"{plan['name']} at the destination", "after_header": f"{plan['name']} from the source"}


def _transfer(opt: SyncOptions, plan: DestPlan) -> tuple[list[str], list[dict[str, Any]], ScanStats, int]:
    """Pull and verify until every needed file is staged and verified (retried once for failed files).
    Returns the staged paths to commit, the transfers, what was hashed, and how much of it while receiving."""
    transfers: list[dict[str, Any]] = []
    hashed = ScanStats(hashed_bytes=plan.hashed_bytes, hashed_files=plan.hashed_files)
    streamed = 0
    wanted = opt.source.by_path()
    pending = plan.of("transfer")
    to_commit = [f.path for f in plan.of("staged")]
    failures: dict[str, str] = {}
    for _attempt in range(opt.retries + 1):
        verifier = None
        if pending:
            if opt.remote is None:
                raise SyncError(f"{opt.name}: {len(pending)} files are missing or differ at {opt.paths.dest} "
                                f"({', '.join(f.path for f in pending[:3])}...) and no source was given; "
                                "sync from a source host or path")
            verifier = Verifier(opt.paths.staging, {f.path: wanted[f.path] for f in pending})
            t = run_rsync(opt.name, opt.remote, opt.paths.staging, pending, opt.paths.log, opt.paths.control,
                          opt.bwlimit_kbps, verifier, opt.heartbeat)
            transfers.append(asdict(t))
        check = to_commit + [f.path for f in pending]
        failures, stats = verify_staged(opt.source, opt.paths.staging, check, verifier)
        streamed += verifier.streamed_bytes if verifier else 0
        hashed.hashed_bytes += stats.hashed_bytes
        hashed.hashed_files += stats.hashed_files
        to_commit = [p for p in check if p not in failures]
        pending = [FilePlan(p, wanted[p].size, "transfer", "failed verification") for p in failures]
        if not failures or opt.remote is None:
            break
    if failures:
        raise SyncError(f"{opt.name}: {len(failures)} files failed verification after the transfer: "
                        + "; ".join(f"{p}: {why}" for p, why in list(failures.items())[:3])
                        + ". The bad copies were removed; check the source and run again")
    return to_commit, transfers, hashed, streamed


def sync(opt: SyncOptions) -> dict[str, Any]:
    """Make the destination an exact, verified copy of the source manifest; returns the report (saved when the
    sync changed something, with the plan it followed under `plan`)."""
    started = time.monotonic()
    with Lock(opt.paths.lock):
        steps = _version_steps(opt, check=False) if opt.home else []
        state = read_manifest(opt.paths.state_file)
        plan = _plan(opt, state)
        if plan.problems:
            raise SyncError("; ".join(plan.problems) + ". Nothing was copied")
        to_commit, transfers, hashed, streamed = _transfer(opt, plan)
        done = commit(opt.source, opt.paths.dest, opt.paths.staging, to_commit, plan.extras, opt.own,
                      [(f.path, f.link_from) for f in plan.of("link")])
        verified = dest_state(opt.source, opt.paths.dest)
        if state is None or state.to_dict() != verified.to_dict():
            write_json_atomic(opt.paths.state_file, verified.to_dict())
        remove_tree(opt.paths.staging)
        if opt.home:
            steps += mark_synced(opt.home, opt.paths.dest.name)
        plan.versions = steps
        changed = bool(done["moved"] or done["removed"] or done["linked"] or done["permissions"]
                       or plan.of("adopt") or steps)
        report = {"name": opt.name, "dest": str(opt.paths.dest), "changed": changed,
                  "manifest_sha256": opt.source.digest(), "total_bytes": opt.source.total_bytes,
                  "files": len(opt.source.files), "adopted": [f.path for f in plan.of("adopt")],
                  "written_bytes": sum(f.size for f in plan.of("transfer") + plan.of("staged")),
                  "linked_bytes": sum(f.size for f in plan.of("link")), "versions": steps,
                  "repaired": [f.path for f in plan.files if f.action in ("transfer", "staged")
                               and not f.reason.startswith("missing")],
                  "transfers": transfers, "hashed_bytes": hashed.hashed_bytes, "hashed_files": hashed.hashed_files,
                  "hashed_while_receiving": streamed,
                  "seconds": round(time.monotonic() - started, 3), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  **done}
        if changed:
            write_json_atomic(opt.paths.report_file, report)
        return {**report, "plan": plan.to_dict()}
