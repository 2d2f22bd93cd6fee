"""Model manifests, destination plans, free space, published check, staged commits; and the training-job
selection and stop logic the training_stop role runs on the hosts."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_infra import manifest as mf
from dflash_infra import model_checks, training
from helpers import ROOT


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    root = tmp_path / "src" / "M"
    write(root / "config.json", b'{"a": 1}\n')
    write(root / "model-00001-of-00002.safetensors", os.urandom(300_000))
    write(root / "model-00002-of-00002.safetensors", os.urandom(100_001))
    write(root / "sub" / "tokenizer.json", b"{}")
    return root


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


def test_manifest_digest_ignores_mtimes_and_round_trips(model: Path) -> None:
    m, _ = mf.scan(model)
    copy = mf.Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
    moved = mf.Manifest([mf.FileEntry(f.path, f.size, f.sha256, 0) for f in m.files])
    assert copy.digest() == m.digest() == moved.digest()
    with pytest.raises(mf.SyncError, match="expected a manifest object"):
        mf.Manifest.from_dict({"nope": 1})


def test_scan_skips_rsync_partials_and_temporaries(model: Path) -> None:
    write(model / ".rsync-partial" / "x", b"partial")
    write(model / ".config.json.AbC123", b"temp")
    assert ".config.json.AbC123" not in [f.path for f in mf.scan(model)[0].files]
    assert len(mf.scan(model)[0].files) == 4


# --------------------------------------------------------------------------- destination plan

def _sync_local(src: mf.Manifest, model: Path, dest: Path, staging: Path) -> None:
    """Stage a copy the way rsync -t would (same bytes and mtimes), as the transfer leaves it."""
    for f in src.files:
        s = model / f.path
        write(staging / f.path, s.read_bytes(), s.stat().st_mtime_ns)


def test_plan_for_an_empty_destination_transfers_everything(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    plan = mf.plan_destination("M", src, tmp_path / "dst" / "M", tmp_path / "dst" / ".stage" / "M", None)
    assert [f.action for f in plan.files] == ["transfer"] * 4
    assert plan.transfer_bytes == src.total_bytes == plan.needed_bytes
    assert plan.changes and plan.hashed_bytes == 0 and not plan.problems


def test_staged_commit_then_noop_reads_no_bytes(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    dest, staging, state = tmp_path / "dst" / "M", tmp_path / "dst" / ".stage" / "M", tmp_path / "state" / "M.manifest.json"
    _sync_local(src, model, dest, staging)
    report = mf.sync(mf.SyncOptions("M", src, dest, staging, state, tmp_path / "log"))
    assert report["changed"] and sorted(report["moved"]) == [f.path for f in src.files]
    assert not staging.exists(), "staging is removed after the commit"
    assert mf.scan(dest)[0].digest() == src.digest()
    assert all((dest / f.path).stat().st_mode & 0o777 == 0o644 for f in src.files)
    # Re-sync: metadata only, nothing hashed, nothing changed.
    plan = mf.plan_destination("M", src, dest, staging, mf.read_manifest(state))
    assert [f.action for f in plan.files] == ["ok"] * 4 and plan.hashed_bytes == 0 and not plan.changes
    again = mf.sync(mf.SyncOptions("M", src, dest, staging, state, tmp_path / "log"))
    assert not again["changed"] and again["hashed_bytes"] == 0


def test_corrupted_byte_is_found_and_needs_a_transfer(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    dest, staging, state = tmp_path / "dst" / "M", tmp_path / "st" / "M", tmp_path / "state.json"
    _sync_local(src, model, dest, staging)
    mf.sync(mf.SyncOptions("M", src, dest, staging, state, tmp_path / "log"))
    shard = dest / "model-00001-of-00002.safetensors"
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[1234] ^= 0xFF
    write(shard, bytes(data))  # new mtime: seen by the metadata check
    plan = mf.plan_destination("M", src, dest, staging, mf.read_manifest(state))
    assert plan.of("transfer")[0].path == shard.name and "sha256" in plan.of("transfer")[0].reason
    # Bit rot that keeps the mtime is invisible to the metadata check, and found by a full verify.
    write(shard, bytes(data), st.st_mtime_ns)
    mf.write_json_atomic(state, mf.dest_state(src, dest).to_dict())
    assert not mf.plan_destination("M", src, dest, staging, mf.read_manifest(state)).of("transfer")
    full = mf.plan_destination("M", src, dest, staging, mf.read_manifest(state), full_verify=True)
    assert [f.path for f in full.of("transfer")] == [shard.name]
    # Without a source the sync refuses instead of pretending.
    with pytest.raises(mf.SyncError, match="no source was given"):
        mf.sync(mf.SyncOptions("M", src, dest, staging, state, tmp_path / "log", full_verify=True))


def test_a_copy_already_present_is_adopted_after_hashing(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    dest = tmp_path / "dst" / "M"
    for f in src.files:
        write(dest / f.path, (model / f.path).read_bytes())
    write(dest / "stale.bin", b"old")
    plan = mf.plan_destination("M", src, dest, tmp_path / "st", None)
    assert [f.action for f in plan.files] == ["adopt"] * 4 and plan.extras == ["stale.bin"]
    report = mf.sync(mf.SyncOptions("M", src, dest, tmp_path / "st", tmp_path / "s.json", tmp_path / "log"))
    assert report["removed"] == ["stale.bin"] and len(report["adopted"]) == 4


def test_a_bad_staged_file_is_removed_and_never_reaches_the_final_path(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    dest, staging = tmp_path / "dst" / "M", tmp_path / "st" / "M"
    _sync_local(src, model, dest, staging)
    bad = staging / "model-00002-of-00002.safetensors"
    st = bad.stat()
    write(bad, b"\0" * st.st_size, st.st_mtime_ns)
    failures, _ = mf.verify_staged(src, staging, [f.path for f in src.files])
    assert list(failures) == [bad.name] and not bad.exists()
    assert not (dest / bad.name).exists()


def test_stray_rsync_temp_file_becomes_the_resume_partial(tmp_path: Path) -> None:
    staging = tmp_path / "st"
    write(staging / ".model.safetensors.Xy12Ab", b"a" * 10)
    write(staging / ".model.safetensors.Zz99Zz", b"a" * 30)
    assert mf._partial_bytes(staging, "model.safetensors") == 30
    assert mf.adopt_stray_temps(staging, ["model.safetensors"]) == ["model.safetensors"]
    assert (staging / mf.PARTIAL_DIR / "model.safetensors").stat().st_size == 30
    assert not list(staging.glob(".model.safetensors.*"))


# --------------------------------------------------------------------------- hashing while rsync receives

class ReceiverStandIn:
    """Writes a file the way rsync's receiver does (stand-in, no rsync on the controller): into
    ".<name>.XXXXXX" beside the final name, front to back, then the source mtime, then a rename."""

    def __init__(self, staging: Path, entry: mf.FileEntry, data: bytes, suffix: str = "Ab12Cd") -> None:
        self.final, self.data, self.entry = staging / entry.path, data, entry
        self.temp = self.final.with_name(f".{self.final.name}.{suffix}")
        self.temp.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.temp, "wb", buffering=0)
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


def receiving(model: Path, tmp_path: Path, name: str) -> tuple[mf.Manifest, Path, mf.FileEntry, bytes, mf.Verifier]:
    """The source manifest, a staging directory, one file's entry and bytes, and a Verifier waiting for it."""
    src, _ = mf.scan(model)
    staging = tmp_path / "st" / "M"
    entry = src.by_path()[name]
    return src, staging, entry, (model / name).read_bytes(), mf.Verifier(staging, {name: entry})


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
    failures, stats = mf.verify_staged(src, staging, [shard.path], verifier)
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
    failures, _ = mf.verify_staged(src, staging, [shard.path], verifier)
    assert failures == {} and (staging / shard.path).exists()


def test_a_file_finished_between_two_looks_is_hashed_whole(model: Path, tmp_path: Path) -> None:
    _, staging, cfg, data, verifier = receiving(model, tmp_path, "config.json")
    ReceiverStandIn(staging, cfg, data).finish()
    verifier.poll()
    assert verifier.done[cfg.path][3] == cfg.sha256 and verifier.streamed_bytes == 0


# --------------------------------------------------------------------------- free space

def test_free_space_arithmetic_names_the_shortfall() -> None:
    files = [mf.FilePlan("a", 10 << 30, "transfer"), mf.FilePlan("b", 5 << 30, "ok"), mf.FilePlan("c", 1 << 30, "staged")]
    assert mf.space_needed(files) == 10 << 30
    assert mf.free_space_problem("M", 10 << 30, 13 << 30, 2 << 30, "/root/models") is None
    msg = mf.free_space_problem("M", 10 << 30, 11 << 30, 2 << 30, "/root/models")
    assert msg and "needs 10.00 GiB" in msg and "has 11.00 GiB free" in msg and "free 1.00 GiB" in msg


def test_plan_reports_a_destination_without_space(model: Path, tmp_path: Path) -> None:
    src, _ = mf.scan(model)
    plan = mf.plan_destination("M", src, tmp_path / "d" / "M", tmp_path / "s", None, reserve=1 << 60)
    assert plan.problems and "reserve" in plan.problems[0]


# --------------------------------------------------------------------------- published manifest

def _published_like(name: str) -> mf.Manifest:
    entry = json.loads((ROOT / "dflash_infra/data/models/published-files.json").read_text())[name]
    files = [mf.FileEntry(s["file"], s["bytes"], s["sha256"]) for s in entry.get("shards", [])]
    if entry.get("index_sha256"):
        files.append(mf.FileEntry("model.safetensors.index.json", 100, entry["index_sha256"]))
    return mf.Manifest(files)


def test_published_check_passes_the_published_files_and_names_a_bad_shard() -> None:
    good = _published_like("Qwen3.6-27B")
    assert model_checks.published_problems("Qwen3.6-27B", good.to_dict()) == []
    files = [mf.FileEntry(f.path, f.size, "0" * 64) if f.path.startswith("model-00003") else f for f in good.files]
    problems = model_checks.published_problems("Qwen3.6-27B", mf.Manifest(files).to_dict())
    assert len(problems) == 1 and "model-00003-of-00015.safetensors sha256" in problems[0]
    short = mf.Manifest([f for f in good.files if not f.path.startswith("model-00015")])
    assert "model-00015-of-00015.safetensors is missing" in model_checks.published_problems("Qwen3.6-27B", short.to_dict())[0]


def test_published_check_of_the_drafter_uses_parameters_and_the_hash_prefix() -> None:
    data = 1730213120 * 2
    ok = mf.Manifest([mf.FileEntry("model.safetensors", data + 9000, "e0c050b3" + "0" * 56)])
    assert model_checks.published_problems("Qwen3.6-27B-DFlash", ok.to_dict()) == []
    lab = mf.Manifest([mf.FileEntry("model.safetensors", 1054296, "ab" * 32)])
    problems = model_checks.published_problems("Qwen3.6-27B-DFlash", lab.to_dict())
    assert any("does not start with the published e0c050b3" in p for p in problems)
    assert any("parameters need 3460426240 bytes" in p for p in problems)
    assert "no published manifest" in model_checks.published_problems("Unknown", ok.to_dict())[0]


# --------------------------------------------------------------------------- rsync output and argv

def test_rsync_progress_and_stats_are_parsed() -> None:
    assert mf.parse_progress("    1,234,567  45%  123.45MB/s    0:00:12 (xfr#3, to-chk=5/20)") == (1234567, "123.45MB/s")
    assert mf.parse_progress("Number of files: 18") is None
    stats = mf.parse_stats("Literal data: 2,048 bytes\nMatched data: 1,000 bytes\nTotal bytes received: 3,100")
    assert stats == {"literal_data": 2048, "matched_data": 1000, "total_bytes_received": 3100}


def test_rsync_argv_pulls_into_staging_with_a_partial_dir_and_keeps_the_key_out_of_the_log() -> None:
    remote = mf.Remote("root", "127.0.129.1", "Qwen3.6-27B", "/root/.ssh/k", "/root/.ssh/kh", "aes128-gcm@openssh.com")
    argv = mf.rsync_argv(remote, Path("/root/models/.dflash-staging/Qwen3.6-27B"), 500)
    assert argv[-2:] == ["root@127.0.129.1:Qwen3.6-27B/", "/root/models/.dflash-staging/Qwen3.6-27B/"]
    assert "--partial-dir=.rsync-partial" in argv and "--files-from=-" in argv and "--bwlimit=500" in argv
    assert "StrictHostKeyChecking=yes" in argv[argv.index("-e") + 1]


# --------------------------------------------------------------------------- synced-model checks

def test_synced_models_run_the_planner_checks_and_take_weights_from_the_index() -> None:
    data = ROOT / "dflash_infra/data/models"
    target = json.loads((data / "Qwen3.6-27B/config.json").read_text())
    draft = json.loads((data / "Qwen3.6-27B-DFlash/config.json").read_text())
    models = {"target": {"name": "Qwen3.6-27B", "path": "/m/T"}, "draft": {"name": "Qwen3.6-27B-DFlash", "path": "/m/D"}}
    described = [{"path": "/m/T", "present": True, "config": target, "index_total_size": 55562855904},
                 {"path": "/m/D", "present": True, "config": draft, "weights_file_bytes": 3460500000}]
    out = model_checks.synced_models(described, models, {"Qwen3.6-27B": {"manifest_sha256": "ab"}}, {"algorithm": "dflash"})
    assert out["problems"] == []
    assert out["models"]["target"]["weights_bytes"] == 55562855904 and out["models"]["target"]["manifest_sha256"] == "ab"
    assert out["models"]["draft"]["weights_bytes"] == 3460500000
    bad = dict(draft, dflash_config=dict(draft["dflash_config"], target_layer_ids=[1, 99]))
    described[1] = dict(described[1], config=bad)
    assert any("target_layer_ids [99]" in p for p in model_checks.synced_models(described, models, {}, {})["problems"])


def test_plan_models_take_the_synced_config_and_index_bytes_and_compare_by_content() -> None:
    data = ROOT / "dflash_infra/data/models"
    models = {"target": {"name": "Qwen3.6-27B", "path": "/m/T"}, "draft": {"name": "Qwen3.6-27B-DFlash", "path": "/m/D"}}
    before_sync = model_checks.plan_models(models, None)
    assert before_sync["target"]["config"] == json.loads((data / "Qwen3.6-27B/config.json").read_text())
    assert before_sync["target"]["weights_bytes"] == 55562855904
    # A sync that found the catalogued files gives the same inputs, so a plan made before the sync stands.
    same = {k: {"name": v["name"], "config": v["config"], "weights_bytes": v["weights_bytes"]} for k, v in before_sync.items()}
    assert model_checks.plan_models(models, same) == before_sync
    # A different drafter checkpoint at the destination changes the inputs: its bytes come from the synced files.
    other = dict(same, draft=dict(same["draft"], weights_bytes=3_000_000_000))
    after = model_checks.plan_models(models, other)
    assert after["draft"]["weights_bytes"] == 3_000_000_000 and after != before_sync
    # A synced entry of another model (a renamed catalogue) is not taken for this one.
    assert model_checks.plan_models(models, {"target": dict(same["target"], name="Qwen3.5-27B")}) == before_sync


def test_the_tool_runs_from_stdin_with_python_only(model: Path, tmp_path: Path) -> None:
    code = (ROOT / "dflash_infra/manifest.py").read_text()
    cache = tmp_path / "cache.json"
    argv = [sys.executable, "-I", "-", "scan", "--root", str(model), "--cache", str(cache)]
    first = json.loads(subprocess.run(argv, input=code, capture_output=True, text=True, check=True).stdout)
    second = json.loads(subprocess.run(argv, input=code, capture_output=True, text=True, check=True).stdout)
    assert first["scan"]["hashed_bytes"] == first["total_bytes"] and second["scan"]["hashed_bytes"] == 0
    # The cached re-scan reads the interpreter's modules and the cache, not the model's bytes (/proc/self/io).
    assert first["io_read_bytes"] - second["io_read_bytes"] >= 0.9 * first["total_bytes"]
    bad = subprocess.run([sys.executable, "-I", "-", "scan", "--root", str(tmp_path / "none")], input=code,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "expected a model directory" in bad.stderr


# --------------------------------------------------------------------------- training-job selection

def proc(pid: int, cmd: str, ppid: int = 1, cgroup: str = "/system.slice/x.service", start: int = 100,
         state: str = "S") -> training.Proc:
    return training.Proc(pid=pid, ppid=ppid, uid=0, state=state, start_ticks=start, cmdline=cmd.split(),
                         user="root", cgroup=cgroup)


MATCH = [r"(^|/)python3?(\.[0-9]+)?\s+/root/train\.py(\s|$)"]


def test_selection_by_command_line_takes_the_job_and_its_workers_never_the_engine() -> None:
    table = [proc(36, "python3 /root/train.py"), proc(40, "python3 -c worker", ppid=36),
             proc(41, "python3 /root/train.py --worker", ppid=36),
             proc(50, "/opt/sglang/venv/bin/python -m sglang.launch_server", cgroup="/system.slice/sglang-qwen.service"),
             proc(60, "vim /root/train.py"), proc(70, "python3 /root/train.py", state="Z")]
    sel = training.select(table, match=MATCH, protect_match=["sglang"], protect_units=["sglang-qwen.service"])
    assert sel.mode == "match" and [p.pid for p in sel.roots] == [36]
    assert sorted(p.pid for p in sel.descendants) == [40, 41]
    assert [p.pid for p in sel.protected] == [50]


def test_selection_by_unit_wins_and_the_engine_is_never_selected() -> None:
    table = [proc(10, "python3 /srv/train.py", cgroup="/system.slice/train.service"),
             proc(11, "python3 /root/train.py"),
             proc(12, "python -m sglang.launch_server", ppid=10, cgroup="/system.slice/train.service")]
    sel = training.select(table, unit="train.service", match=MATCH, protect_match=["sglang"])
    assert sel.mode == "unit" and [p.pid for p in sel.roots] == [10] and sel.descendants == []
    assert "left alone (serving engine)" in sel.notes[0]


def test_pid_file_is_used_only_for_a_process_older_than_the_file() -> None:
    table = [proc(99, "python3 job.py", start=500)]
    btime, hz = 1000.0, 100  # pid 99 started at 1005.0
    assert training.select(table, pidfile_pid=99, pidfile_mtime=1010.0, btime=btime, hz=hz).mode == "pidfile"
    recycled = training.select(table, pidfile_pid=99, pidfile_mtime=1001.0, btime=btime, hz=hz)
    assert recycled.mode == "none" and "recycled pid" in recycled.notes[0]
    assert "not running" in training.select(table, pidfile_pid=5).notes[0]


def test_nothing_running_selects_nothing() -> None:
    sel = training.select([proc(1, "/sbin/init"), proc(5, "sshd")], match=MATCH, pidfile_pid=None)
    assert sel.mode == "none" and sel.all == []


def test_environment_keeps_only_allowlisted_values() -> None:
    env = {"TRAIN_LOG": "/root/x.log", "CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "hf_secret", "WANDB_API_KEY": "k"}
    assert training.keep_env(env) == {"CUDA_VISIBLE_DEVICES": "0,1", "TRAIN_LOG": "/root/x.log"}


def test_gpu_holders_map_uuids_to_the_plan_indexes_and_spare_the_engine() -> None:
    gpus = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]
    apps = [{"pid": 36, "process_name": "python3", "used_memory_mib": 91000, "gpu_uuid": "GPU-a"},
            {"pid": 36, "process_name": "python3", "used_memory_mib": 91000, "gpu_uuid": "GPU-b"},
            {"pid": 50, "process_name": "sglang", "used_memory_mib": 80000, "gpu_uuid": "GPU-b"}]
    assert training.gpus_held(apps, gpus) == {36: [0, 1], 50: [1]}
    assert [h["pid"] for h in training.gpu_holders(apps, gpus, [0])] == [36]
    assert [h["pid"] for h in training.gpu_holders(apps, gpus, [], allowed_pids=[50])] == [36, 36]
    msg = training.holders_message("ct200", training.gpu_holders(apps, gpus, [0]))
    assert "pid 36 (python3) on GPU 0 with 91000 MiB" in msg


def test_stop_record_keeps_what_a_resume_needs() -> None:
    found = {"mode": "match", "roots": [{"pid": 36, "start_ticks": 7, "cmdline": ["python3", "/root/train.py"],
                                         "cwd": "/root", "user": "root", "log": "/root/train_slammed5.log",
                                         "env": {"TRAIN_LOG": "/root/train_slammed5.log"}}], "descendants": []}
    rec = training.stop_record("ct200", found, {"36": [0, 1]}, {}, "/etc/job.env", [], "2026-01-01T00:00:00Z", ["a.service"])
    assert rec["gpus"] == [0, 1] and rec["processes"][0]["gpus"] == [0, 1] and rec["boot_units"] == ["a.service"]
    assert rec["resume"] == {"command": ["python3", "/root/train.py"], "cwd": "/root", "user": "root",
                             "log": "/root/train_slammed5.log", "env": {"TRAIN_LOG": "/root/train_slammed5.log"},
                             "env_file": "/etc/job.env"}
    assert training.pid_start(found["roots"][0]) == "36:7"


# --------------------------------------------------------------------------- stopping real processes

def _spawn(ignore_term: bool) -> subprocess.Popen:
    code = ("import signal,time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('ready', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _start(pid: int) -> int:
    found = training.read_proc(pid)
    assert found is not None
    return found.start_ticks


def test_stop_ends_a_job_on_sigterm() -> None:
    p = _spawn(ignore_term=False)
    res = training.stop({p.pid: _start(p.pid)}, {}, term_timeout=30, kill_timeout=5)
    p.wait()
    assert res.terminated == [p.pid] and res.killed == [] and res.survivors == []
    assert p.returncode == -signal.SIGTERM


def test_stop_escalates_to_sigkill_for_a_job_that_ignores_sigterm() -> None:
    p = _spawn(ignore_term=True)
    res = training.stop({p.pid: _start(p.pid)}, {}, term_timeout=0.5, kill_timeout=5)
    p.wait()
    assert res.killed == [p.pid] and res.terminated == [] and p.returncode == -signal.SIGKILL


def test_stop_never_signals_a_recycled_pid() -> None:
    p = _spawn(ignore_term=False)
    try:
        res = training.stop({p.pid: _start(p.pid) + 1}, {}, term_timeout=0.5, kill_timeout=0.5)
        assert res.already_gone == [p.pid] and p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_read_proc_reports_cwd_log_and_environment(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    with open(log, "w") as fh:
        p = subprocess.Popen([sys.executable, "-c", "import time; print('x', flush=True); time.sleep(60)"],
                             stdout=fh, cwd=tmp_path, env={"TRAIN_X": "1", "SECRET_TOKEN": "s"})
    try:
        for _ in range(50):
            if log.read_text():
                break
            time.sleep(0.1)
        got = training.read_proc(p.pid, with_env=True)
        assert got is not None and got.cwd == str(tmp_path) and got.stdout == str(log)
        rec = training.record_of(got)
        assert rec["log"] == str(log) and rec["env"] == {"TRAIN_X": "1"} and "SECRET_TOKEN" in rec["env_names"]
    finally:
        p.kill()
        p.wait()
