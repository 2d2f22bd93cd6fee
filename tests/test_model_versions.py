"""Model versions (module_utils/dflash_sync/versions.py): the old layout migrated by one rename, a new revision
costing only its changed files (the rest hard-linked), the configured path switched only by promote, older
versions pruned, and a recorded version checked before a rollback serves it again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.dflash_sync import manifest as mf
from ansible.module_utils.dflash_sync import versions as vs
from ansible.module_utils.dflash_sync.commit import Ownership
from ansible.module_utils.dflash_sync.errors import SyncError
from ansible.module_utils.dflash_sync.sync import ModelPaths, SyncOptions, preview, sync

from helpers import run_module
from test_model_sync import make_model, write


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    return make_model(tmp_path / "src" / "M")


def home(tmp_path: Path) -> vs.ModelHome:
    return vs.ModelHome("M", tmp_path / "models" / "M", tmp_path / "state")


def stage(src: Path, manifest: mf.Manifest, staging: Path, only: list[str] | None = None) -> None:
    """What rsync -t leaves in staging: the named files (every file by default) with their mtimes."""
    for f in manifest.files:
        if only is None or f.path in only:
            s = src / f.path
            write(staging / f.path, s.read_bytes())
            os.utime(staging / f.path, ns=(s.stat().st_mtime_ns, s.stat().st_mtime_ns))


def versioned(src: Path, tmp_path: Path, keep: int = 2) -> SyncOptions:
    manifest = mf.scan(src)[0]
    h = home(tmp_path)
    paths = ModelPaths.of_version(h, vs.label_of(manifest.digest()), tmp_path / "log")
    return SyncOptions("M", manifest, paths, own=Ownership(file_mode=0o644, dir_mode=0o755), home=h, keep=keep,
                       root=tmp_path / "models")


def revise(source: Path, tmp_path: Path, keep: int = 2, first: bool = False) -> SyncOptions:
    """A new revision at the source (the second shard's bytes), synced: only that shard staged, unless first."""
    write(source / "model-00002-of-00002.safetensors", os.urandom(100_001))
    opt = versioned(source, tmp_path, keep)
    stage(source, opt.source, opt.paths.staging, None if first else ["model-00002-of-00002.safetensors"])
    sync(opt)
    return opt


def legacy_copy(src: Path, tmp_path: Path) -> mf.Manifest:
    """The layout before versions: the files in the configured path, with the verified state beside."""
    manifest = mf.scan(src)[0]
    paths = ModelPaths.of("M", tmp_path / "models" / "M", tmp_path / "state", tmp_path / "log")
    stage(src, manifest, paths.staging)
    sync(SyncOptions("M", manifest, paths, own=Ownership(file_mode=0o644, dir_mode=0o755)))
    return manifest


def inodes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.rglob("*") if p.is_file()}


def test_the_old_layout_becomes_its_version_folder_by_one_rename(source: Path, tmp_path: Path) -> None:
    manifest = legacy_copy(source, tmp_path)
    h, label = home(tmp_path), vs.label_of(manifest.digest())
    before = inodes(h.path)
    # --check says it and moves nothing.
    opt = versioned(source, tmp_path)
    plan = preview(opt)
    assert plan.changes and any(s.startswith(f"moved {h.path} to {h.folder(label)}") for s in plan.versions)
    assert h.path.is_dir() and not h.path.is_symlink() and h.legacy_state.exists()
    done = sync(opt)
    assert done["changed"] and done["moved"] == [] and done["written_bytes"] == 0 and done["transfers"] == []
    assert os.readlink(h.path) == f".dflash-versions/M/{label}" and inodes(h.folder(label)) == before
    assert json.loads(h.versions_file.read_text()) == {"schema": 1, "name": "M", "synced": label, "current": label,
                                                       "order": [label]}
    assert not h.legacy_state.exists() and h.state_file(label).exists()
    again = sync(versioned(source, tmp_path))
    assert not again["changed"] and again["plan"]["hashed_bytes"] == 0


def test_a_migration_killed_after_the_rename_is_finished_by_the_next_run(source: Path, tmp_path: Path) -> None:
    manifest = legacy_copy(source, tmp_path)
    h, label = home(tmp_path), vs.label_of(manifest.digest())
    h.folder(label).parent.mkdir(parents=True)
    os.rename(h.path, h.folder(label))  # the run died here: no link, no versions file, the old state still there
    assert vs.migrate(h) == [f"linked {h.path} to .dflash-versions/M/{label}"]
    assert h.path.resolve() == h.folder(label) and vs.read_versions(h)["current"] == label
    assert not sync(versioned(source, tmp_path))["changed"]


def test_a_new_revision_costs_its_changed_file_and_leaves_the_version_in_use_alone(source: Path,
                                                                                   tmp_path: Path) -> None:
    first = legacy_copy(source, tmp_path)
    sync(versioned(source, tmp_path))
    h, v1 = home(tmp_path), vs.label_of(first.digest())
    old_bytes = (h.folder(v1) / "model-00002-of-00002.safetensors").read_bytes()
    write(source / "model-00002-of-00002.safetensors", os.urandom(100_001))
    opt = versioned(source, tmp_path)
    v2 = opt.paths.dest.name
    plan = preview(opt)
    assert plan.transfer_bytes == 100_001 and plan.needed_bytes == 100_001
    assert sorted(plan.to_dict()["link_files"]) == ["config.json", "model-00001-of-00002.safetensors",
                                                    "sub/tokenizer.json"]
    assert f"the plan serves version {v2} (was {v1})" in plan.versions
    stage(source, opt.source, opt.paths.staging, ["model-00002-of-00002.safetensors"])
    done = sync(opt)
    assert done["written_bytes"] == 100_001 and done["linked_bytes"] == opt.source.total_bytes - 100_001
    assert "1 files moved into place (97.66 KiB written), 3 unchanged hard-linked" in \
        __import__("ansible.module_utils.dflash_sync.messages", fromlist=["sync_summary"]).sync_summary(done)
    shared = (h.folder(v2) / "model-00001-of-00002.safetensors").stat()
    assert shared.st_ino == (h.folder(v1) / "model-00001-of-00002.safetensors").stat().st_ino
    # The version in use is untouched: its bytes, its link, current; the next plan serves v2.
    assert (h.folder(v1) / "model-00002-of-00002.safetensors").read_bytes() == old_bytes
    assert h.path.resolve() == h.folder(v1)
    assert vs.read_versions(h) == {"schema": 1, "name": "M", "synced": v2, "current": v1, "order": [v1]}
    assert vs.serving(h)["folder"] == str(h.folder(v2))
    assert vs.version_problem(h, str(h.folder(v1)), first.digest()) == ""


def test_promote_switches_the_link_and_keeps_the_newest_versions(source: Path, tmp_path: Path) -> None:
    h = home(tmp_path)
    labels = []
    for _ in range(3):
        labels.append(revise(source, tmp_path, first=not labels).paths.dest.name)
        assert vs.promote(h, None, 2, check=True)["changed"]
        # Only the first copy on a host shows at the model's path at once (no version was in use to protect).
        assert (h.path.resolve() == h.folder(labels[-1])) == (len(labels) == 1)
        done = vs.promote(h, None, 2)
        assert done["switched"]["to"] == labels[-1] and h.path.resolve() == h.folder(labels[-1])
    assert done["pruned"] == [labels[0]] and not h.folder(labels[0]).exists()
    assert not h.state_file(labels[0]).exists()
    assert vs.made_versions(h) == sorted(labels[1:])
    assert not vs.promote(h, None, 2)["changed"]
    # A rollback: back to the previous version, nothing pruned; the configured path follows.
    back = vs.promote(h, labels[1], 2, prune=False)
    assert back["switched"] == {"from": labels[2], "to": labels[1]} and h.path.resolve() == h.folder(labels[1])
    assert vs.made_versions(h) == sorted(labels[1:])
    with pytest.raises(SyncError, match="expected the version folder"):
        vs.promote(h, labels[0], 2)


def test_a_recorded_version_is_checked_before_it_is_served_again(source: Path, tmp_path: Path) -> None:
    opt = versioned(source, tmp_path)
    stage(source, opt.source, opt.paths.staging)
    sync(opt)
    h, label, digest = home(tmp_path), opt.paths.dest.name, opt.source.digest()
    folder = str(h.folder(label))
    assert vs.version_problem(h, folder, digest) == ""
    assert "holds manifest" in vs.version_problem(h, folder, "0" * 64)
    (h.folder(label) / "config.json").write_text("{}")
    assert "differs from its verified state (config.json)" in vs.version_problem(h, folder, digest)
    vs.remove_versions(h, [label])
    problem = vs.version_problem(h, folder, digest)
    assert problem.startswith(f"M: the version folder {folder} that the record names is gone")
    # A folder that is not one of this model's versions (from before versions, the source's own copy, another
    # model's) has no verified state of this model's to hold it against, but must still be there.
    assert vs.version_problem(h, str(source), digest) == ""
    assert vs.version_problem(h, "", digest) == ""
    elsewhere = str(tmp_path / ".dflash-versions" / "Other" / label)
    assert vs.version_problem(h, elsewhere, digest) == f"M: the folder {elsewhere} that the record names is gone"


def test_keep_one_removes_the_other_versions_before_the_copy_and_says_so(source: Path, tmp_path: Path) -> None:
    h = home(tmp_path)
    labels = []
    for _ in range(2):
        labels.append(revise(source, tmp_path, first=not labels).paths.dest.name)
        vs.promote(h, None, 2)
    write(source / "model-00002-of-00002.safetensors", os.urandom(100_001))
    opt = versioned(source, tmp_path, keep=1)
    stage(source, opt.source, opt.paths.staging, ["model-00002-of-00002.safetensors"])
    done = sync(opt)
    assert any(s.startswith(f"removed the versions {labels[0]} (dflash_model_versions_keep is 1") for s in
               done["versions"])
    assert vs.made_versions(h) == sorted([labels[1], opt.paths.dest.name])


def test_the_module_syncs_versions_promotes_and_checks_them(source: Path, tmp_path: Path) -> None:
    manifest = run_module("dflash_model_sync", {"action": "scan", "root": str(source)})["manifest"]
    h = home(tmp_path)
    label = vs.label_of(manifest["manifest_sha256"])
    stage(source, mf.Manifest.from_dict(manifest), h.path.parent / ".dflash-staging" / "M")
    common: dict[str, Any] = {"state_dir": str(tmp_path / "state")}
    done = run_module("dflash_model_sync", {"action": "sync", "name": "M", "manifest": manifest, "dest": str(h.path),
                                            "log_dir": str(tmp_path / "log"), "versions": True,
                                            "model_root": str(tmp_path / "models"), **common})
    assert done["changed"] and done["dest"] == str(h.folder(label)), done
    models = [{"name": "M", "path": str(h.path)}]
    assert run_module("dflash_model_sync", {"action": "promote", "models": models, **common}, check=True)["changed"]
    assert h.path.resolve() == h.folder(label) and vs.read_versions(h)["current"] is None  # the first copy
    promoted = run_module("dflash_model_sync", {"action": "promote", "models": models, **common})
    assert promoted["changed"] and promoted["models"][0]["switched"] == {"from": None, "to": label}
    assert not run_module("dflash_model_sync", {"action": "promote", "models": models, **common})["changed"]
    record = [{"name": "M", "path": str(h.path), "folder": str(h.folder(label)),
               "manifest_sha256": manifest["manifest_sha256"]}]
    assert run_module("dflash_model_sync", {"action": "check_versions", "models": record, **common},
                      check=True)["problems"] == []
    (h.folder(label) / "config.json").unlink()
    checked = run_module("dflash_model_sync", {"action": "check_versions", "models": record, **common}, check=True)
    assert not checked["changed"] and "differs from its verified state (config.json)" in checked["problems"][0]
    bad = run_module("dflash_model_sync", {"action": "promote", "models": [{"name": "M"}], **common})
    assert bad["failed"] and "expected every entry of models to have a name and a path" in bad["msg"]
