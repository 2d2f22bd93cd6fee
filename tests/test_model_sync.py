"""Model manifests, destination plans, free space, hashing while receiving, staged commits, stamps: the
module_utils code the dflash_model_sync module runs on the hosts; and the module itself, run for real on
localhost (validation messages, check mode, diff, changed, idempotence)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.dflash_sync import manifest as mf
from ansible.module_utils.dflash_sync import plan as pl
from ansible.module_utils.dflash_sync import rsync
from ansible.module_utils.dflash_sync.commit import Ownership, dest_state, ownership_drift, verify_staged
from ansible.module_utils.dflash_sync.describe import describe, stamp
from ansible.module_utils.dflash_sync.errors import SyncError
from ansible.module_utils.dflash_sync.messages import human, plan_summary
from ansible.module_utils.dflash_sync.sync import ModelPaths, SyncOptions, diff, preview, sync
from ansible.module_utils.dflash_sync.verifier import Verifier

from helpers import ROOT, run_module


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "src" / "M")


def make_model(root: Path) -> Path:
    """A model folder: a config, two shards of random bytes and a tokenizer in a sub-folder."""
    write(root / "config.json", b'{"a": 1}\n')
    write(root / "model-00001-of-00002.safetensors", os.urandom(300_000))
    write(root / "model-00002-of-00002.safetensors", os.urandom(100_001))
    write(root / "sub" / "tokenizer.json", b"{}")
    return root


def paths(tmp_path: Path, name: str = "M") -> ModelPaths:
    return ModelPaths.of(name, tmp_path / "dst" / name, tmp_path / "state", tmp_path / "log")


def options(src: mf.Manifest, tmp_path: Path, **kw: Any) -> SyncOptions:
    return SyncOptions("M", src, paths(tmp_path), own=Ownership(file_mode=0o644, dir_mode=0o755), **kw)


def stage_like_rsync(src: mf.Manifest, model: Path, staging: Path) -> None:
    """Stage a copy the way rsync -t would (same bytes and mtimes), as the transfer leaves it."""
    for f in src.files:
        s = model / f.path
        write(staging / f.path, s.read_bytes(), s.stat().st_mtime_ns)


# --------------------------------------------------------------------------- manifests and cache

def test_scan_hashes_every_file_and_the_cache_avoids_rereading(model: Path) -> None:
    first, stats = mf.scan(model)
    assert [f.path for f in first.files] == ["config.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors", "sub/tokenizer.json"]
    shard = model / "model-00001-of-00002.safetensors"
    assert first.by_path()[shard.name].sha256 == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert stats.hashed_bytes == first.total_bytes
    again, stats2 = mf.scan(model, first)
    assert stats2.hashed_bytes == 0 and stats2.cached_files == 4 and again.digest() == first.digest()
    # A rewritten file (new mtime) is hashed again; the others stay cached.
    write(model / "config.json", b'{"a": 2}\n')
    third, stats3 = mf.scan(model, again)
    assert stats3.hashed_files == 1 and third.digest() != first.digest()


def test_the_cache_file_is_written_only_when_the_manifest_changed(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "M.json"
    assert mf.scan_cached(model, cache, write_cache=False)[2] and not cache.exists()
    _, stats, written = mf.scan_cached(model, cache)
    assert written and cache.exists() and stats.hashed_files == 4
    before = cache.stat().st_mtime_ns
    _, stats, written = mf.scan_cached(model, cache)
    assert not written and stats.hashed_bytes == 0 and cache.stat().st_mtime_ns == before


def test_manifest_digest_ignores_mtimes_and_round_trips(model: Path) -> None:
    m, _ = mf.scan(model)
    copy = mf.Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
    moved = mf.Manifest([mf.FileEntry(f.path, f.size, f.sha256, 0) for f in m.files])
    assert copy.digest() == m.digest() == moved.digest()
    with pytest.raises(SyncError, match="expected a manifest object"):
        mf.Manifest.from_dict({"nope": 1})
    with pytest.raises(SyncError, match="every file needs path, size and sha256"):
        mf.Manifest.from_dict({"files": [{"path": "a"}]})


def test_scan_skips_rsync_partials_and_temporaries(model: Path) -> None:
    write(model / ".rsync-partial" / "x", b"partial")
    write(model / ".config.json.AbC123", b"temp")
    assert ".config.json.AbC123" not in [f.path for f in mf.scan(model)[0].files]
    assert len(mf.scan(model)[0].files) == 4


# --------------------------------------------------------------------------- destination plan and sync

def test_plan_for_an_empty_destination_transfers_everything(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    plan = pl.plan_destination("M", src, tmp_path / "dst" / "M", tmp_path / "dst" / ".stage" / "M", None)
    assert [f.action for f in plan.files] == ["transfer"] * 4
    assert plan.transfer_bytes == src.total_bytes == plan.needed_bytes
    assert plan.changes and plan.hashed_bytes == 0 and not plan.problems


def test_staged_commit_then_noop_reads_no_bytes_and_writes_nothing(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path)
    stage_like_rsync(src, model, opt.paths.staging)
    report = sync(opt)
    assert report["changed"] and sorted(report["moved"]) == [f.path for f in src.files]
    assert not opt.paths.staging.exists(), "staging is removed after the commit"
    assert mf.scan(opt.paths.dest)[0].digest() == src.digest()
    assert all((opt.paths.dest / f.path).stat().st_mode & 0o777 == 0o644 for f in src.files)
    assert json.loads(opt.paths.report_file.read_text())["moved"] == report["moved"]
    # Re-sync: metadata only, nothing hashed, nothing changed, the state and the last report left as they are.
    plan = preview(opt)
    assert [f.action for f in plan.files] == ["ok"] * 4 and plan.hashed_bytes == 0 and not plan.changes
    written = {p: p.stat().st_mtime_ns for p in (opt.paths.state_file, opt.paths.report_file)}
    again = sync(opt)
    assert not again["changed"] and again["hashed_bytes"] == 0
    assert {p: p.stat().st_mtime_ns for p in written} == written


def test_corrupted_byte_is_found_and_needs_a_transfer(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path)
    stage_like_rsync(src, model, opt.paths.staging)
    sync(opt)
    dest, staging, state = opt.paths.dest, opt.paths.staging, opt.paths.state_file
    shard = dest / "model-00001-of-00002.safetensors"
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[1234] ^= 0xFF
    write(shard, bytes(data))  # new mtime: seen by the metadata check
    plan = pl.plan_destination("M", src, dest, staging, mf.read_manifest(state))
    assert plan.of("transfer")[0].path == shard.name and "sha256" in plan.of("transfer")[0].reason
    # Bit rot that keeps the mtime is invisible to the metadata check, and found by a full verify.
    write(shard, bytes(data), st.st_mtime_ns)
    mf.write_json_atomic(state, dest_state(src, dest).to_dict())
    assert not pl.plan_destination("M", src, dest, staging, mf.read_manifest(state)).of("transfer")
    full = pl.plan_destination("M", src, dest, staging, mf.read_manifest(state), full_verify=True)
    assert [f.path for f in full.of("transfer")] == [shard.name]
    # Without a source the sync refuses instead of pretending.
    with pytest.raises(SyncError, match="no source was given"):
        sync(options(src, tmp_path, full_verify=True))


def test_a_copy_already_present_is_adopted_after_hashing(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path)
    for f in src.files:
        write(opt.paths.dest / f.path, (model / f.path).read_bytes())
    write(opt.paths.dest / "stale.bin", b"old")
    plan = preview(opt)
    # stale.bin was not written by this project (no verified state lists it): left in place and named, never removed.
    assert [f.action for f in plan.files] == ["adopt"] * 4 and plan.extras == [] and plan.foreign == ["stale.bin"]
    report = sync(opt)
    assert report["removed"] == [] and len(report["adopted"]) == 4 and (opt.paths.dest / "stale.bin").exists()
    # A file the source no longer has that the last verified sync wrote is removed.
    fewer = mf.Manifest(files=[f for f in src.files if f.path != "sub/tokenizer.json"], root=src.root)
    assert preview(options(fewer, tmp_path)).extras == ["sub/tokenizer.json"]
    assert preview(options(fewer, tmp_path, delete_extra=False)).extras == []  # kept on request
    assert sync(options(fewer, tmp_path))["removed"] == ["sub/tokenizer.json"]
    assert (opt.paths.dest / "stale.bin").exists()
    assert not sync(options(fewer, tmp_path))["changed"]


def test_owner_and_mode_drift_is_planned_and_set(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path)
    stage_like_rsync(src, model, opt.paths.staging)
    sync(opt)
    os.chmod(opt.paths.dest / "config.json", 0o600)
    assert ownership_drift(src, opt.paths.dest, opt.own) == ["config.json"]
    plan = preview(opt)
    assert plan.changes and plan.permissions == ["config.json"] and "1 owners or modes to set" in plan_summary(
        plan.to_dict())
    assert sync(opt)["permissions"] == ["config.json"]
    assert (opt.paths.dest / "config.json").stat().st_mode & 0o777 == 0o644


def test_a_bad_staged_file_is_removed_and_never_reaches_the_final_path(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    dest, staging = tmp_path / "dst" / "M", tmp_path / "st" / "M"
    stage_like_rsync(src, model, staging)
    bad = staging / "model-00002-of-00002.safetensors"
    st = bad.stat()
    write(bad, b"\0" * st.st_size, st.st_mtime_ns)
    failures, _ = verify_staged(src, staging, [f.path for f in src.files])
    assert list(failures) == [bad.name] and not bad.exists()
    assert not (dest / bad.name).exists()


def test_stray_rsync_temp_file_becomes_the_resume_partial(tmp_path: Path) -> None:
    staging = tmp_path / "st"
    write(staging / ".model.safetensors.Xy12Ab", b"a" * 10)
    write(staging / ".model.safetensors.Zz99Zz", b"a" * 30)
    assert pl.partial_bytes(staging, "model.safetensors") == 30
    assert rsync.adopt_stray_temps(staging, ["model.safetensors"]) == ["model.safetensors"]
    assert (staging / mf.PARTIAL_DIR / "model.safetensors").stat().st_size == 30
    assert not list(staging.glob(".model.safetensors.*"))


def test_diff_lists_the_files_before_and_after(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path)
    write(opt.paths.dest / "config.json", b'{"a": 9}\n')
    write(opt.paths.dest / "stale.bin", b"old")
    d = diff(preview(opt).to_dict())
    assert d["before"].splitlines() == ["config.json  [sha256 " + hashlib.sha256(b'{"a": 9}\n').hexdigest()[:12]
                                        + "... differs from the source's " + src.by_path()["config.json"].sha256[:12]
                                        + "...]"]  # stale.bin is not this project's: not listed as a change
    assert d["after"].splitlines() == [f.path for f in src.files]


# --------------------------------------------------------------------------- hashing while rsync receives

class ReceiverStandIn:
    """Writes a file the way rsync's receiver does (stand-in, no rsync on the controller): into
    ".<name>.XXXXXX" beside the final name, front to back, then the source mtime, then a rename."""

    def __init__(self, staging: Path, entry: mf.FileEntry, data: bytes, suffix: str = "Ab12Cd") -> None:
        self.final, self.data, self.entry = staging / entry.path, data, entry
        self.temp = self.final.with_name(f".{self.final.name}.{suffix}")
        self.temp.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.temp, "wb", buffering=0)  # noqa: SIM115 (kept open while "receiving")
        self.written = 0

    def write(self, n: int) -> None:
        self.written += self.fh.write(self.data[self.written:self.written + n])

    def finish(self) -> None:
        self.write(len(self.data))
        self.fh.close()
        os.utime(self.temp, ns=(self.entry.mtime_ns, self.entry.mtime_ns))
        os.replace(self.temp, self.final)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def receiving(model: Path, tmp_path: Path, name: str) -> tuple[mf.Manifest, Path, mf.FileEntry, bytes, Verifier]:
    """The source manifest, a staging directory, one file's entry and bytes, and a Verifier waiting for it."""
    src, _ = mf.scan(model)
    staging = tmp_path / "st" / "M"
    entry = src.by_path()[name]
    return src, staging, entry, (model / name).read_bytes(), Verifier(staging, {name: entry})


def test_a_file_is_hashed_while_it_is_received_and_not_read_again(model: Path, tmp_path: Path) -> None:
    src, staging, shard, data, verifier = receiving(model, tmp_path, "model-00001-of-00002.safetensors")
    fds = open_fds()
    rx = ReceiverStandIn(staging, shard, data)
    for _ in range(3):
        rx.write(100_000)
        verifier.poll()
    assert verifier.stats.hashed_bytes == 300_000 and shard.path not in verifier.done
    rx.finish()
    verifier.poll()
    assert verifier.done[shard.path][3] == shard.sha256 and verifier.streamed_bytes == 300_000
    assert open_fds() == fds
    # The commit's check takes the hash taken during the transfer: no byte is read a second time.
    failures, stats = verify_staged(src, staging, [shard.path], verifier)
    assert failures == {} and stats.hashed_bytes == shard.size


def test_a_receive_that_stops_or_starts_again_leaves_no_hash_behind(model: Path, tmp_path: Path) -> None:
    _, staging, shard, data, verifier = receiving(model, tmp_path, "model-00001-of-00002.safetensors")
    fds = open_fds()
    # Killed: rsync moves its temporary file into the partial directory.
    first = ReceiverStandIn(staging, shard, data)
    first.write(120_000)
    verifier.poll()
    first.fh.close()
    (staging / mf.PARTIAL_DIR).mkdir()
    os.replace(first.temp, staging / mf.PARTIAL_DIR / shard.path)
    verifier.poll()
    assert open_fds() == fds and shard.path not in verifier.done
    # Received again under another temporary name (a resumed run): followed from its start.
    second = ReceiverStandIn(staging, shard, data, suffix="Zz99Yy")
    second.write(50_000)
    verifier.poll()
    second.finish()
    verifier.poll()
    assert verifier.done[shard.path][3] == shard.sha256 and open_fds() == fds


def test_a_hash_taken_while_receiving_that_disagrees_is_checked_on_the_finished_file(model: Path,
                                                                                     tmp_path: Path) -> None:
    """A writer that goes back into the file (not rsync's way) makes the running hash wrong; the finished file
    is read once more and judged on its own bytes, never on the running hash."""
    src, staging, shard, data, verifier = receiving(model, tmp_path, "model-00002-of-00002.safetensors")
    rx = ReceiverStandIn(staging, shard, b"\xff" * 1000 + data[1000:])
    rx.write(5000)
    verifier.poll()
    os.pwrite(rx.fh.fileno(), data[:1000], 0)
    rx.finish()
    verifier.poll()
    assert verifier.done[shard.path][3] != shard.sha256
    failures, _ = verify_staged(src, staging, [shard.path], verifier)
    assert failures == {} and (staging / shard.path).exists()


def test_a_file_finished_between_two_looks_is_hashed_whole(model: Path, tmp_path: Path) -> None:
    _, staging, cfg, data, verifier = receiving(model, tmp_path, "config.json")
    ReceiverStandIn(staging, cfg, data).finish()
    verifier.poll()
    assert verifier.done[cfg.path][3] == cfg.sha256 and verifier.streamed_bytes == 0


# --------------------------------------------------------------------------- free space, rsync output and argv

def test_free_space_arithmetic_names_the_shortfall() -> None:
    files = [pl.FilePlan("a", 10 << 30, "transfer"), pl.FilePlan("b", 5 << 30, "ok"),
             pl.FilePlan("c", 1 << 30, "staged")]
    assert pl.space_needed(files) == 10 << 30
    assert pl.free_space_problem("M", 10 << 30, 13 << 30, 2 << 30, "/root/models") is None
    msg = pl.free_space_problem("M", 10 << 30, 11 << 30, 2 << 30, "/root/models")
    assert msg and "needs 10.00 GiB" in msg and "has 11.00 GiB free" in msg and "free 1.00 GiB" in msg
    assert human(512) == "512 B" and human(3 << 40) == "3.00 TiB"


def test_plan_reports_a_destination_without_space(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    plan = pl.plan_destination("M", src, tmp_path / "d" / "M", tmp_path / "s", None, reserve=1 << 60)
    assert plan.problems and "reserve" in plan.problems[0]


def test_rsync_progress_and_stats_are_parsed() -> None:
    assert rsync.parse_progress("    1,234,567  45%  123.45MB/s    0:00:12 (xfr#3, to-chk=5/20)") == (1234567,
                                                                                                  "123.45MB/s")
    assert rsync.parse_progress("Number of files: 18") is None
    stats = rsync.parse_stats("Literal data: 2,048 bytes\nMatched data: 1,000 bytes\nTotal bytes received: 3,100")
    assert stats == {"literal_data": 2048, "matched_data": 1000, "total_bytes_received": 3100}


def test_rsync_argv_pulls_into_staging_with_a_partial_dir_and_keeps_the_key_out_of_the_log() -> None:
    remote = rsync.Remote("root", "127.0.129.1", "Qwen3.6-27B", "/root/.ssh/k", "/root/.ssh/kh",
                          "aes128-gcm@openssh.com")
    argv = rsync.rsync_argv(remote, Path("/root/models/.dflash-staging/Qwen3.6-27B"), 500)
    assert argv[-2:] == ["root@127.0.129.1:Qwen3.6-27B/", "/root/models/.dflash-staging/Qwen3.6-27B/"]
    assert "--partial-dir=.rsync-partial" in argv and "--files-from=-" in argv and "--bwlimit=500" in argv
    assert "StrictHostKeyChecking=yes" in argv[argv.index("-e") + 1]


# --------------------------------------------------------------------------- describe and stamp (host state)

def test_describe_reads_the_config_and_the_index_only(model: Path) -> None:
    write(model / "model.safetensors.index.json", json.dumps({"metadata": {"total_size": 400_001}}).encode())
    d = describe(model)
    assert d["present"] and d["config"] == {"a": 1} and d["index_total_size"] == 400_001
    assert d["weights_file_bytes"] == 400_001
    assert describe(model.parent / "none") == {"path": str(model.parent / "none"), "present": False}


def test_stamp_compares_sizes_and_mtimes_with_the_verified_state(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path)
    assert stamp(opt.paths.dest, opt.paths.state_file) == {"state_present": False, "state_digest": None,
                                                           "files": 0, "bytes": 0, "matches": False, "differing": []}
    stage_like_rsync(src, model, opt.paths.staging)
    sync(opt)
    s = stamp(opt.paths.dest, opt.paths.state_file)
    assert s == {"state_present": True, "state_digest": src.digest(), "files": 4, "bytes": src.total_bytes,
                 "matches": True, "differing": []}
    json.dumps(s)
    os.utime(opt.paths.dest / "config.json", ns=(1, 1))
    write(opt.paths.dest / "extra.bin", b"x")
    (opt.paths.dest / "sub" / "tokenizer.json").unlink()
    s = stamp(opt.paths.dest, opt.paths.state_file)
    assert not s["matches"] and s["differing"] == ["config.json", "extra.bin", "sub/tokenizer.json"]


# --------------------------------------------------------------------------- the module, run for real

def test_the_module_names_what_is_missing_or_wrong() -> None:
    res = run_module("dflash_model_sync", {"root": "/x"})
    assert res["failed"] and "missing required arguments: action" in res["msg"]
    res = run_module("dflash_model_sync", {"action": "sync", "name": "M"})
    assert res["failed"] and "action is sync but all of the following are missing: manifest, dest" in res["msg"]
    res = run_module("dflash_model_sync", {"action": "sync", "name": "M", "dest": "/nonexistent/M",
                                           "manifest": {"nope": 1}})
    assert res["failed"] and "expected a manifest object with a `files` list" in res["msg"]
    assert "pass the result of action=scan at the source" in res["msg"]
    res = run_module("dflash_model_sync", {"action": "sync", "name": "M", "dest": "/nonexistent/M",
                                           "manifest": {"files": []}, "file_mode": "rw-r--r--"})
    assert res["failed"] and "file_mode: expected an octal mode such as '0644', found 'rw-r--r--'" in res["msg"]
    res = run_module("dflash_model_sync", {"action": "sync", "name": "M", "dest": "/nonexistent/M",
                                           "manifest": {"files": []}, "source": {"path": "M"}})
    assert res["failed"] and "missing required arguments: address found in source" in res["msg"]


def test_the_module_scans_with_its_cache_and_check_mode_writes_no_cache(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "M.json"
    args = {"action": "scan", "root": str(model), "cache": str(cache)}
    checked = run_module("dflash_model_sync", args, check=True)
    assert not checked["changed"] and checked["cache_written"] and not cache.exists()
    first = run_module("dflash_model_sync", args)
    assert first["scan"]["hashed_bytes"] == first["total_bytes"] and cache.exists()
    second = run_module("dflash_model_sync", args)
    assert second["scan"]["hashed_bytes"] == 0 and not second["cache_written"]
    assert second["manifest"] == first["manifest"] and second["manifest_sha256"] == mf.scan(model)[0].digest()
    # The cached re-scan reads the interpreter's modules and the cache, not the model's bytes (/proc/self/io).
    assert first["io_read_bytes"] - second["io_read_bytes"] >= 0.9 * first["total_bytes"]
    missing = run_module("dflash_model_sync", {"action": "scan", "root": str(tmp_path / "none")})
    assert missing["failed"] and "expected a model directory, found nothing" in missing["msg"]


def sync_args(manifest: dict[str, Any], tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"action": "sync", "name": "M", "manifest": manifest, "dest": str(tmp_path / "dst" / "M"),
            "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"), **kw}


def test_the_module_syncs_a_present_copy_says_what_it_would_do_first_and_is_idempotent(model: Path,
                                                                                       tmp_path: Path) -> None:
    manifest = run_module("dflash_model_sync", {"action": "scan", "root": str(model)})["manifest"]
    dest = tmp_path / "dst" / "M"
    for f in manifest["files"]:
        write(dest / f["path"], (model / f["path"]).read_bytes())
    os.chmod(dest / "config.json", 0o600)
    write(dest / "stale.bin", b"old")
    args = sync_args(manifest, tmp_path)
    # --check: the plan, changed, a diff; nothing written, nothing removed, no mode set.
    checked = run_module("dflash_model_sync", args, check=True, diff=True)
    assert checked["changed"] and sorted(checked["plan"]["adopt_files"]) == [f["path"] for f in manifest["files"]]
    assert checked["plan"]["extras"] == [] and checked["plan"]["foreign"] == ["stale.bin"]
    assert checked["plan"]["permissions"] == ["config.json"]
    assert "4 present and adopted after hashing" in checked["summary"]
    assert "1 files this project did not write left in place (stale.bin)" in checked["summary"]
    assert not (tmp_path / "state").exists() and (dest / "stale.bin").exists()
    assert (dest / "config.json").stat().st_mode & 0o777 == 0o600
    # The sync: adopted after hashing, mode set, verified state recorded; the foreign file left where it is.
    done = run_module("dflash_model_sync", args, diff=True)
    assert done["changed"] and done["removed"] == [] and len(done["adopted"]) == 4 and (dest / "stale.bin").exists()
    assert "config.json" in done["permissions"] and done["manifest_sha256"] == manifest["manifest_sha256"]
    assert done["summary"].startswith("M: 0 files moved into place (0 B written), 0 removed, 0 repaired;")
    assert json.loads((tmp_path / "state" / "M.manifest.json").read_text())["manifest_sha256"] == \
        manifest["manifest_sha256"]
    # Again: nothing to do, no byte read to decide, under --check and for real.
    for check in (True, False):
        again = run_module("dflash_model_sync", args, check=check)
        assert not again["changed"] and again["plan"]["hashed_bytes"] == 0 and not again["plan"]["changes"]


def test_the_module_refuses_what_it_cannot_do(model: Path, tmp_path: Path) -> None:
    manifest = mf.scan(model)[0].to_dict()
    no_space = run_module("dflash_model_sync", sync_args(manifest, tmp_path, reserve_bytes=1 << 60), check=True)
    assert no_space["failed"] and "plus a reserve of" in no_space["msg"] and "Nothing was copied" in no_space["msg"]
    assert no_space["plan"]["transfer_files"] == [f["path"] for f in manifest["files"]]
    no_source = run_module("dflash_model_sync", sync_args(manifest, tmp_path))
    assert no_source["failed"] and "no source was given" in no_source["msg"]
    assert not (tmp_path / "dst" / "M").exists()


def test_the_module_describes_model_folders(model: Path, tmp_path: Path) -> None:
    res = run_module("dflash_model_sync", {"action": "describe", "paths": [str(model), str(tmp_path / "none")]},
                     check=True)
    assert not res["changed"] and [m["present"] for m in res["models"]] == [True, False]
    assert res["models"][0]["config"] == {"a": 1}


# --------------------------------------------------------------------------- the role on localhost (present mode)

ROLE_PLAY = """
- name: Check, then sync, the models already at the destination
  hosts: localhost
  gather_facts: false
  vars:
    model_sync_models: {models}
    model_sync_source_mode: present
    model_sync_published_check: false
    model_sync_speculative: {{algorithm: dflash, block_size: 16, draft_window: 16, max_draft_tokens: 16}}
    model_sync_state_dir: {state}
    model_sync_log_dir: {log}
  tasks:
    - name: Check as the deploy's plan stage does
      ansible.builtin.include_role:
        name: model_sync
        tasks_from: check
    - name: Sync as the sync stage does
      ansible.builtin.include_role:
        name: model_sync
"""


def run_play(play: Path, check: bool = False) -> dict[str, Any]:
    from helpers import HOST_PYTHON, ansible_environment, run, tool

    env = dict(ansible_environment(), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    argv = [tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
            f"ansible_python_interpreter={HOST_PYTHON}", str(play)] + (["--check"] if check else [])
    proc = run(argv, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def task_names(out: dict[str, Any]) -> list[str]:
    return [t["task"]["name"] for play in out["plays"] for t in play["tasks"]
            if not t["hosts"]["localhost"].get("skipped")]


def test_the_role_checks_once_syncs_from_the_check_and_is_idempotent(tmp_path: Path) -> None:
    models = {}
    for key, name in (("target", "Qwen3.6-27B"), ("draft", "Qwen3.6-27B-DFlash")):
        folder = tmp_path / "models" / name
        write(folder / "config.json", (ROOT / "dflash_infra/data/models" / name / "config.json").read_bytes())
        write(folder / "model.safetensors", os.urandom(4096))
        models[key] = {"name": name, "path": str(folder)}
    play = tmp_path / "play.yml"
    play.write_text(ROLE_PLAY.format(models=json.dumps(models), state=tmp_path / "state", log=tmp_path / "log"))
    checked = run_play(play, check=True)
    assert checked["stats"]["localhost"]["changed"] == 1  # the check's plan: both models would be adopted
    assert not (tmp_path / "state").exists()
    done = run_play(play)
    names = task_names(done)
    assert sum(n.endswith("Compute the manifests at the source in one call (cached by size and mtime)")
               for n in names) == 1
    assert any(n.endswith("Copy, verify and move the models into place") for n in names)
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "Qwen3.6-27B-DFlash.manifest.json", "Qwen3.6-27B-DFlash.sync.json", "Qwen3.6-27B.manifest.json",
        "Qwen3.6-27B.sync.json"]
    again = run_play(play)
    assert again["stats"]["localhost"]["changed"] == 0
    assert not any(n.endswith("Copy, verify and move the models into place") for n in task_names(again))


# --------------------------------------------------------------------------- what the sync owns

@pytest.mark.parametrize("path", ["../../escaped/x", "/etc/passwd", "a/../../b", "./a", "a//b", ""])
def test_a_manifest_entry_that_could_land_outside_its_folder_is_refused(path: str) -> None:
    with pytest.raises(SyncError, match=re.escape("a manifest names files inside its model folder only")):
        mf.Manifest.from_dict({"files": [{"path": path, "size": 1, "sha256": "0" * 64}]}, "manifest")


def test_a_destination_one_level_too_high_is_refused_and_nothing_is_deleted(model: Path, tmp_path: Path) -> None:
    """The model's path set to the model root itself (a typo in dflash_models): another model's weights and a key
    there stay untouched; the sync refuses before it plans, naming the path and the rule."""
    src, _ = mf.scan(model)
    root = tmp_path / "models"
    other = write(root / "Other-Model" / "model.safetensors", b"weights")
    key = write(root / ".ssh" / "id_ed25519", b"secret")
    opt = SyncOptions("M", src, ModelPaths.of("M", root, tmp_path / "state", tmp_path / "log"),
                      own=Ownership(file_mode=0o644, dir_mode=0o755), root=root)
    for attempt in (preview, sync):
        with pytest.raises(SyncError, match=r"M: the destination .*models is not a folder under the model root"):
            attempt(opt)
    assert other.read_bytes() == b"weights" and key.read_bytes() == b"secret"
    outside = SyncOptions("M", src, ModelPaths.of("M", tmp_path / "elsewhere" / "M", tmp_path / "state",
                                                  tmp_path / "log"), root=root)
    with pytest.raises(SyncError, match="is not a folder under the model root"):
        preview(outside)
    dotted = SyncOptions("M", src, ModelPaths.of("M", root / ".." / "M", tmp_path / "state", tmp_path / "log"),
                         root=root)
    with pytest.raises(SyncError, match=re.escape("expected an absolute, normalised destination without '..'")):
        preview(dotted)


def test_strict_refuses_to_sync_beside_foreign_files(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    opt = options(src, tmp_path, strict=True)
    write(opt.paths.dest / "notes.txt", b"mine")
    plan = preview(opt)
    assert plan.foreign == ["notes.txt"] and "model_sync_strict refuses to sync beside them" in plan.problems[0]
    with pytest.raises(SyncError, match=re.escape("notes.txt")):
        sync(opt)
    assert (opt.paths.dest / "notes.txt").read_bytes() == b"mine"


def test_the_module_refuses_a_destination_outside_the_model_root(model: Path, tmp_path: Path) -> None:
    manifest = mf.scan(model)[0].to_dict()
    args = {**sync_args(manifest, tmp_path), "model_root": str(tmp_path / "dst"), "dest": str(tmp_path / "dst")}
    refused = run_module("dflash_model_sync", args, check=True)
    assert refused["failed"] and "is not a folder under the model root" in refused["msg"]
