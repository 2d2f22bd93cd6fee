"""Model versions: each verified copy of a model lives in a folder named by its manifest, the model's configured
path is a link to the version in use, and a rollback can go back to the bytes an earlier deployment ran on.

Layout, for a model whose configured path is /root/models/Qwen3.6-27B:
  /root/models/.dflash-versions/Qwen3.6-27B/<manifest sha256, 16 hex>/   the bytes of one version (the unit names it)
  /root/models/Qwen3.6-27B -> .dflash-versions/Qwen3.6-27B/<sha16>        the version in use (switched after gates)
  <state_dir>/<name>.<sha16>.manifest.json                               each version's verified state
  <state_dir>/<name>.versions.json                                       synced (last made), current, order
A new version is filled with unchanged files hard-linked from the kept versions (same sha256), so it costs only
its changed files. The folder that held the files before versions (the old layout) becomes its version folder by
one rename: no byte is copied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .commit import remove_tree
from .errors import SyncError
from .manifest import Manifest, read_manifest, write_json_atomic

VERSIONS_DIR = ".dflash-versions"
LABEL_LENGTH = 16
SCHEMA = 1


def label_of(digest: str) -> str:
    """A version's folder name: the first 16 hex digits of its manifest's sha256."""
    return str(digest)[:LABEL_LENGTH]


@dataclass(frozen=True)
class ModelHome:
    """One model's configured path (the link to the version in use), its version folders and their states."""

    name: str
    path: Path
    state_dir: Path

    @property
    def versions_dir(self) -> Path:
        return self.path.parent / VERSIONS_DIR / self.path.name

    @property
    def versions_file(self) -> Path:
        return self.state_dir / f"{self.name}.versions.json"

    @property
    def legacy_state(self) -> Path:
        """The verified state of the layout before versions (the files directly in the configured path)."""
        return self.state_dir / f"{self.name}.manifest.json"

    def folder(self, label: str) -> Path:
        return self.versions_dir / label

    def state_file(self, label: str) -> Path:
        return self.state_dir / f"{self.name}.{label}.manifest.json"

    def version_of(self, folder: str | os.PathLike[str]) -> str | None:
        """The version a folder is, or None for a folder that is not one of this model's version folders (a record
        from before versions, or the source host's own copy)."""
        return Path(folder).name if Path(folder).parent == self.versions_dir else None

    def link_target(self, label: str) -> str:
        """The configured path's link text for a version (relative: the tree can move as a whole)."""
        return f"{VERSIONS_DIR}/{self.path.name}/{label}"


def read_versions(home: ModelHome) -> dict[str, Any]:
    """The versions file ({} when there is none: a fresh host or the old layout)."""
    path = home.versions_file
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SyncError(f"{home.name}: {path} is not JSON ({exc}); move it away and run again") from None
    if not isinstance(data, dict):
        raise SyncError(f"{home.name}: expected an object in {path}, found {type(data).__name__}")
    return data


def _write_versions(home: ModelHome, doc: dict[str, Any]) -> None:
    write_json_atomic(home.versions_file, {"schema": SCHEMA, "name": home.name, "synced": doc.get("synced"),
                                           "current": doc.get("current"), "order": list(doc.get("order") or [])})


def legacy(home: ModelHome) -> Manifest | None:
    """The old layout's verified state when the configured path is still a real folder holding the files."""
    if home.versions_file.exists() or home.path.is_symlink() or not home.path.is_dir():
        return None
    return read_manifest(home.legacy_state)


def serving(home: ModelHome) -> dict[str, Any]:
    """The folder a plan serves and its state file: the last synced version, else the old layout's folder.
    {folder, state_file, version (label or None), current, versions (the file's content)}."""
    doc = read_versions(home)
    label = doc.get("synced")
    if label:
        return {"folder": str(home.folder(label)), "state_file": str(home.state_file(label)), "version": label,
                "current": doc.get("current"), "versions": doc}
    return {"folder": str(home.path), "state_file": str(home.legacy_state), "version": None, "current": None,
            "versions": doc}


def migrate(home: ModelHome, check: bool = False) -> list[str]:
    """The old layout into versions, without copying a byte: the folder is renamed into its version folder (named by
    its verified state) and the configured path becomes a link to it. Each step is checked first, so a run killed
    halfway is finished by the next. Returns what it did (under check, what it would do)."""
    doc = read_versions(home)
    if doc:
        return []
    state = read_manifest(home.legacy_state)
    if state is None:
        return []
    label = label_of(state.digest())
    folder = home.folder(label)
    done: list[str] = []
    if home.path.is_dir() and not home.path.is_symlink():
        if folder.exists():
            raise SyncError(f"{home.name}: cannot move {home.path} into its version folder {folder}: that folder "
                            "exists already. Move one of them away and run again")
        done.append(f"moved {home.path} to {folder} (one rename, no byte copied)")
        if not check:
            folder.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(home.state_file(label), {**state.to_dict(), "root": str(folder)})
            os.rename(home.path, folder)
    if not folder.is_dir() and not check:
        return done  # the old layout's folder is gone and no version holds it: the sync starts afresh
    if not home.path.exists() and not home.path.is_symlink():
        done.append(f"linked {home.path} to {home.link_target(label)}")
        if not check:
            switch_link(home, label)
    if not check:
        if not home.state_file(label).exists():
            write_json_atomic(home.state_file(label), {**state.to_dict(), "root": str(folder)})
        _write_versions(home, {"synced": label, "current": label, "order": [label]})
        home.legacy_state.unlink()
    return done


def switch_link(home: ModelHome, label: str) -> None:
    """Point the configured path at a version, atomically (a new link renamed over the old one)."""
    tmp = home.path.parent / f".{home.path.name}.dflash-link"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(home.link_target(label), tmp)
    os.replace(tmp, home.path)


def link_sources(home: ModelHome) -> list[tuple[Path, Manifest]]:
    """The verified copies a new version may hard-link unchanged files from: the version in use, the last synced
    one, and (before migrating) the old layout's folder."""
    out: list[tuple[Path, Manifest]] = []
    doc = read_versions(home)
    for label in dict.fromkeys(x for x in (doc.get("current"), doc.get("synced")) if x):
        state = read_manifest(home.state_file(label))
        if state is not None and home.folder(label).is_dir():
            out.append((home.folder(label), state))
    old = legacy(home)
    if old is not None:
        out.append((home.path, old))
    return out


def mark_synced(home: ModelHome, label: str) -> list[str]:
    """Record that a verified copy of `label` was made (the version the next plan serves; the sync's plan said so
    already). A host with no version in use yet shows its first verified copy at the model's path at once (nothing
    to protect); the version in use (current) is still set only by promote, after the gates. Returns that step."""
    doc = read_versions(home)
    done = []
    if doc.get("synced") != label:
        _write_versions(home, {**doc, "synced": label})
    if not home.path.exists() and not home.path.is_symlink():
        switch_link(home, label)
        done.append(f"linked {home.path} to the first version {label}")
    return done


def made_versions(home: ModelHome) -> list[str]:
    """The version folders this project made (each has its verified state file), by name."""
    if not home.versions_dir.is_dir():
        return []
    return sorted(p.name for p in home.versions_dir.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and home.state_file(p.name).exists())


def prune_plan(home: ModelHome, keep: int, doc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(versions to remove, foreign folders left): all but the newest `keep` versions that became current, never
    the synced one or the one in use."""
    order = list(doc.get("order") or [])
    kept = set(order[-keep:]) | {x for x in (doc.get("current"), doc.get("synced")) if x}
    made = made_versions(home)
    drop = [v for v in made if v not in kept]
    foreign = sorted(p.name for p in home.versions_dir.iterdir()
                     if not p.name.startswith(".") and p.name not in made) if home.versions_dir.is_dir() else []
    return drop, foreign


def remove_versions(home: ModelHome, labels: list[str]) -> None:
    for label in labels:
        remove_tree(home.folder(label))
        home.state_file(label).unlink(missing_ok=True)


def promote(home: ModelHome, label: str | None, keep: int, prune: bool = True, check: bool = False
            ) -> dict[str, Any]:
    """Make a version the one in use (the link switched, the versions file's current and order), then keep the newest
    `keep` versions. label None: the last synced one. Under check, what it would do."""
    if keep < 1:
        raise SyncError(f"{home.name}: expected dflash_model_versions_keep of 1 or more, found {keep}")
    doc = read_versions(home)
    label = label or doc.get("synced")
    out: dict[str, Any] = {"name": home.name, "version": label, "changed": False, "switched": None, "pruned": [],
                           "foreign": []}
    if not label:
        return out
    if not home.folder(label).is_dir():
        raise SyncError(f"{home.name}: expected the version folder {home.folder(label)}, found none; nothing was "
                        "switched. Sync the model again (the deploy does)")
    link_ok = home.path.is_symlink() and os.readlink(home.path) == home.link_target(label)
    order = list(doc.get("order") or [])
    if order[-1:] != [label]:
        order.append(label)
    new = {**doc, "current": label, "synced": label, "order": order}
    if not link_ok or doc.get("current") != label or doc.get("synced") != label or doc.get("order") != order:
        out["changed"] = True
        out["switched"] = {"from": doc.get("current"), "to": label}
        if not check:
            if home.path.exists() and not home.path.is_symlink():
                raise SyncError(f"{home.name}: expected {home.path} to be the link to the version in use, found a "
                                "real folder; it was left as it is. Move it away (or let the deploy migrate it)")
            switch_link(home, label)
            _write_versions(home, new)
    if prune:
        drop, out["foreign"] = prune_plan(home, keep, new)
        out["pruned"] = drop
        if drop:
            out["changed"] = True
            if not check:
                remove_versions(home, drop)
    return out


def version_problem(home: ModelHome, folder: str, digest: str | None) -> str:
    """Why a recorded model version cannot be served again ('' when it can): its folder and verified state must be
    there, the state must be the recorded manifest, and every file must match it by size and mtime."""
    from .describe import stamp

    label = home.version_of(folder)
    if label is None:
        # Recorded before versions, the source host's own copy, or another model's folder: no verified state of
        # this model's to hold it against, but it must still be there.
        return "" if not folder or Path(folder).is_dir() else (
            f"{home.name}: the folder {folder} that the record names is gone")
    if not Path(folder).is_dir():
        return (f"{home.name}: the version folder {folder} that the record names is gone (kept versions: "
                f"{', '.join(made_versions(home)) or 'none'}; dflash_model_versions_keep)")
    seen = stamp(folder, home.state_file(label))
    if not seen["state_present"]:
        return f"{home.name}: {home.state_file(label)} (the verified state of {folder}) is gone"
    if digest and seen["state_digest"] != digest:
        return (f"{home.name}: {folder} holds manifest {str(seen['state_digest'])[:16]}, the record names "
                f"{str(digest)[:16]}")
    if not seen["matches"]:
        return (f"{home.name}: {folder} differs from its verified state ({', '.join(seen['differing'])}); sync it "
                "again or deploy")
    return ""
