"""Finding, recording, stopping and resuming the training job: the module_utils code the dflash_training module runs
on the hosts (selection, signals with pid-reuse checks, GPU holders, the record, the resume argv); and the module
itself, run for real on localhost against a real process and a stand-in nvidia-smi."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.dflash_training import gpus, procs, record, resume, selection
from ansible.module_utils.dflash_training import stop as stopping
from ansible.module_utils.dflash_training.errors import TrainingError

from helpers import HOST_PYTHON, run_module

MATCH = [r"(^|/)python3?(\.[0-9]+)?\s+/root/train\.py(\s|$)"]
NOW = datetime(2026, 12, 1, 8, 30, 5, tzinfo=UTC)


def proc(pid: int, cmd: str, ppid: int = 1, cgroup: str = "/system.slice/x.service", start: int = 100,
         state: str = "S") -> procs.Proc:
    return procs.Proc(pid=pid, ppid=ppid, uid=0, state=state, start_ticks=start, cmdline=cmd.split(),
                      user="root", cgroup=cgroup)


# --------------------------------------------------------------------------- selection

def test_selection_by_command_line_takes_the_job_and_its_workers_never_the_engine() -> None:
    table = [proc(36, "python3 /root/train.py"), proc(40, "python3 -c worker", ppid=36),
             proc(41, "python3 /root/train.py --worker", ppid=36),
             proc(50, "/opt/sglang/venv/bin/python -m sglang.launch_server",
                  cgroup="/system.slice/sglang-qwen.service"),
             proc(60, "vim /root/train.py"), proc(70, "python3 /root/train.py", state="Z")]
    sel = selection.select(table, match=MATCH, protect_match=["sglang"], protect_units=["sglang-qwen.service"])
    assert sel.mode == "match" and [p.pid for p in sel.roots] == [36]
    assert sorted(p.pid for p in sel.descendants) == [40, 41]
    assert [p.pid for p in sel.protected] == [50]


def test_selection_by_unit_wins_and_the_engine_is_never_selected() -> None:
    table = [proc(10, "python3 /srv/train.py", cgroup="/system.slice/train.service"),
             proc(11, "python3 /root/train.py"),
             proc(12, "python -m sglang.launch_server", ppid=10, cgroup="/system.slice/train.service")]
    sel = selection.select(table, unit="train.service", match=MATCH, protect_match=["sglang"])
    assert sel.mode == "unit" and [p.pid for p in sel.roots] == [10] and sel.descendants == []
    assert "left alone (serving engine)" in sel.notes[0]


def test_pid_file_is_used_only_for_a_process_older_than_the_file() -> None:
    table = [proc(99, "python3 job.py", start=500)]
    btime, hz = 1000.0, 100  # pid 99 started at 1005.0
    assert selection.select(table, pidfile_pid=99, pidfile_mtime=1010.0, btime=btime, hz=hz).mode == "pidfile"
    recycled = selection.select(table, pidfile_pid=99, pidfile_mtime=1001.0, btime=btime, hz=hz)
    assert recycled.mode == "none" and "recycled pid" in recycled.notes[0]
    assert "not running" in selection.select(table, pidfile_pid=5).notes[0]


def test_nothing_running_selects_nothing_and_the_caller_and_its_ancestors_are_never_taken() -> None:
    sel = selection.select([proc(1, "/sbin/init"), proc(5, "sshd")], match=MATCH, pidfile_pid=None)
    assert sel.mode == "none" and sel.all == []
    # The module runs below an SSH session whose shell line may carry the pattern itself.
    table = [proc(1, "/sbin/init", ppid=0), proc(20, "sshd", ppid=1), proc(21, "sh -c python3 /root/train.py", ppid=20),
             proc(22, "python3 AnsiballZ_dflash_training.py", ppid=21)]
    assert selection.ancestors(table, 22) == [22, 21, 20]
    assert selection.select(table, match=["train"], self_pids=selection.ancestors(table, 22)).mode == "none"


def test_environment_keeps_only_allowlisted_values() -> None:
    env = {"TRAIN_LOG": "/root/x.log", "CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "hf_secret", "WANDB_API_KEY": "k"}
    assert selection.keep_env(env) == {"CUDA_VISIBLE_DEVICES": "0,1", "TRAIN_LOG": "/root/x.log"}


def test_the_unit_of_a_process_comes_from_its_cgroup() -> None:
    assert procs.cgroup_path("0::/system.slice/sglang-qwen.service\n") == "/system.slice/sglang-qwen.service"
    assert procs.unit_of("/system.slice/sglang-qwen.service") == "sglang-qwen.service"
    assert procs.unit_of("/user.slice/user-0.slice/session-3.scope") == "session-3.scope"
    assert procs.unit_of("/") == ""


# --------------------------------------------------------------------------- GPUs

GPUS = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]
APPS = [{"pid": 36, "process_name": "python3", "used_memory_mib": 91000, "gpu_uuid": "GPU-a"},
        {"pid": 36, "process_name": "python3", "used_memory_mib": 91000, "gpu_uuid": "GPU-b"},
        {"pid": 50, "process_name": "sglang", "used_memory_mib": 80000, "gpu_uuid": "GPU-b"}]


def test_nvidia_smi_queries_are_parsed_on_the_host() -> None:
    apps = gpus.parse_apps("36, python3, 91000, GPU-a\n77, my, odd, name, [N/A], GPU-b\n\n")
    assert apps == [{"pid": 36, "process_name": "python3", "used_memory_mib": 91000, "gpu_uuid": "GPU-a"},
                    {"pid": 77, "process_name": "my, odd, name", "used_memory_mib": None, "gpu_uuid": "GPU-b"}]
    assert gpus.parse_gpus("0, NVIDIA RTX PRO 6000 Blackwell, 97887, GPU-a\n")[0] == {
        "index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell", "memory_total_mib": 97887, "uuid": "GPU-a"}
    with pytest.raises(TrainingError, match=r"line 1: expected 4 comma-separated fields, found 'No devices'"):
        gpus.parse_gpus("No devices\n")


def test_gpu_holders_map_uuids_to_the_plan_indexes_and_spare_the_engine() -> None:
    assert gpus.gpus_held(APPS, GPUS) == {36: [0, 1], 50: [1]}
    assert [h["pid"] for h in gpus.gpu_holders(APPS, GPUS, [0])] == [36]
    assert [h["pid"] for h in gpus.gpu_holders(APPS, GPUS, [], allowed_pids=[50])] == [36, 36]
    msg = gpus.holders_message("ct200", gpus.gpu_holders(APPS, GPUS, [0]))
    assert "pid 36 (python3) on GPU 0 with 91000 MiB" in msg


def test_waiting_for_free_gpus_reads_again_until_the_holders_are_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = [gpus.Reading(APPS, GPUS), gpus.Reading(APPS[2:], GPUS)]
    monkeypatch.setattr(gpus, "read", lambda nvidia_smi: readings.pop(0))
    slept: list[float] = []
    _, holders = gpus.wait_free("nvidia-smi", [0, 1], [50], retries=5, delay_s=2, sleep=slept.append)
    assert holders == [] and slept == [2]
    readings[:] = [gpus.Reading(APPS, GPUS)] * 3
    _, holders = gpus.wait_free("nvidia-smi", [0], [], retries=2, delay_s=1, sleep=slept.append)
    assert [h["pid"] for h in holders] == [36]


def test_a_refused_resume_names_each_unit_once_with_its_pids_and_says_what_to_do() -> None:
    held = [{"pid": pid, "process_name": "sglang::scheduler", "gpu": gpu, "used_memory_mib": 80000}
            for pid in (50, 51) for gpu in range(8)] + [{"pid": 77, "process_name": "python3", "gpu": 3,
                                                         "used_memory_mib": 1000}]
    units = {50: "sglang-qwen.service", 51: "sglang-qwen.service"}
    owners = gpus.holders_by_owner(held, lambda pid: units.get(pid, ""))
    assert owners == {"units": {"sglang-qwen.service": {"pids": [50, 51], "gpus": list(range(8))}},
                      "processes": {77: {"process_name": "python3", "gpus": [3]}}}
    msg = gpus.resume_refusal("ct200", list(range(8)), owners)
    assert "held by sglang-qwen.service (pids 50, 51; GPUs 0,1,2,3,4,5,6,7); pid 77 (python3, in no systemd unit" in msg
    assert msg.count("sglang-qwen.service") == 2 and msg.count("pid 50") == 0
    assert "systemctl stop sglang-qwen.service" in msg and "ps -o pid,user,lstart,args -p 77" in msg
    assert "Nothing was started" in msg and "training_stop_resume_force=true" in msg
    # The engine's unit is named with the playbook that stops serving (group_vars: training_stop_stop_hints).
    hinted = gpus.resume_refusal("ct200", list(range(8)), owners,
                                 {"sglang-qwen.service": "ansible-playbook playbooks/stop_serving.yml -l ct200"})
    assert "Stop the holder first (ansible-playbook playbooks/stop_serving.yml -l ct200; find the owner" in hinted
    assert "systemctl stop" not in hinted
    # Behind the gateway every replica's unit holds its GPU pair; the one playbook that stops them all is named once.
    replicas = gpus.holders_by_owner(held[:16], lambda pid: f"sglang-qwen-r{pid - 50}.service")
    stop = "ansible-playbook playbooks/stop_serving.yml -l ct200"
    both = gpus.resume_refusal("ct200", list(range(8)), replicas,
                               {f"sglang-qwen-r{i}.service": stop for i in range(2)})
    assert "held by sglang-qwen-r0.service (pids 50; GPUs 0,1,2,3,4,5,6,7); sglang-qwen-r1.service (pids 51" in both
    assert both.count(stop) == 1 and f"Stop the holder first ({stop}), then run again" in both


# --------------------------------------------------------------------------- the record and the resume argv

FOUND = {"mode": "match", "roots": [{"pid": 36, "start_ticks": 7, "cmdline": ["python3", "/root/train.py"],
                                     "cwd": "/root", "user": "root", "log": "/root/train_slammed5.log",
                                     "env": {"TRAIN_LOG": "/root/train_slammed5.log", "CUDA_VISIBLE_DEVICES": "0,1"}}],
         "descendants": []}


def test_stop_record_keeps_what_a_resume_needs() -> None:
    rec = record.stop_record("ct200", FOUND, {"36": [0, 1]}, {}, "/etc/job.env", [], "2026-01-01T00:00:00Z",
                             ["a.service"])
    assert rec["gpus"] == [0, 1] and rec["processes"][0]["gpus"] == [0, 1] and rec["boot_units"] == ["a.service"]
    assert rec["resume"] == {"command": ["python3", "/root/train.py"], "cwd": "/root", "user": "root",
                             "log": "/root/train_slammed5.log", "env": FOUND["roots"][0]["env"],
                             "env_file": "/etc/job.env"}


def test_the_resume_argv_runs_the_recorded_command_line_as_a_transient_unit() -> None:
    rec = record.stop_record("ct200", FOUND, {}, {}, "/etc/job.env", [], "t")
    name = resume.transient_unit_name(NOW)
    assert name == "dflash-training-resumed-20261201083005"
    assert resume.resume_argv(rec["resume"], name) == [
        "systemd-run", "--unit=dflash-training-resumed-20261201083005", "--collect", "--uid=root",
        "--property=WorkingDirectory=/root", "--property=EnvironmentFile=-/etc/job.env",
        "--setenv=TRAIN_LOG=/root/train_slammed5.log", "--setenv=CUDA_VISIBLE_DEVICES=0,1",
        "--property=StandardOutput=append:/root/train_slammed5.log",
        "--property=StandardError=append:/root/train_slammed5.log", "--", "python3", "/root/train.py"]
    bare = {"command": ["/opt/job", "--resume"], "cwd": "", "user": "", "log": "", "env": {}, "env_file": ""}
    assert resume.resume_argv(bare, "u") == ["systemd-run", "--unit=u", "--collect", "--uid=root",
                                             "--property=WorkingDirectory=/", "--", "/opt/job", "--resume"]


def test_the_record_is_written_0600_with_a_backup_and_kept_as_resumed(tmp_path: Path) -> None:
    path = tmp_path / "state" / "stopped-training.json"
    rec = record.stop_record("ct200", FOUND, {}, {}, "", [], "t1")
    assert record.write_record(path, rec) is None and path.stat().st_mode & 0o777 == 0o600
    assert record.write_record(path, rec) is None
    backup = record.write_record(path, dict(rec, stopped_at="t2"))
    assert backup and json.loads(Path(backup).read_text())["stopped_at"] == "t1" and backup.endswith("~")
    assert record.read_record(path)["stopped_at"] == "t2"
    kept = record.resumed_path(path, NOW)
    assert kept.name == "stopped-training.resumed-20261201T083005Z.json"
    record.keep_resumed(path, kept)
    assert not path.exists() and kept.stat().st_mode & 0o777 == 0o600 and record.read_record(path) is None


def test_a_record_that_cannot_start_the_job_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("{not json")
    with pytest.raises(TrainingError, match="unreadable JSON"):
        record.read_record(path)
    path.write_text(json.dumps({"schema": 1}))
    with pytest.raises(TrainingError, match=r"expected a record with `resume` and `gpus`"):
        record.read_record(path)
    path.write_text(json.dumps({"gpus": [], "unit": None, "resume": {"command": []}}))
    with pytest.raises(TrainingError, match="neither a unit nor a command line"):
        record.read_record(path)


# --------------------------------------------------------------------------- stopping real processes

def _spawn(ignore_term: bool, *tag: str) -> subprocess.Popen[str]:
    code = ("import signal,time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('ready', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, *tag], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _start(pid: int) -> int:
    found = procs.read_proc(pid)
    assert found is not None
    return found.start_ticks


def test_stop_ends_a_job_on_sigterm() -> None:
    p = _spawn(ignore_term=False)
    res = stopping.stop({p.pid: _start(p.pid)}, {}, term_timeout=30, kill_timeout=5)
    p.wait()
    assert res.terminated == [p.pid] and res.killed == [] and res.survivors == []
    assert p.returncode == -signal.SIGTERM


def test_stop_escalates_to_sigkill_for_a_job_that_ignores_sigterm() -> None:
    p = _spawn(ignore_term=True)
    res = stopping.stop({p.pid: _start(p.pid)}, {}, term_timeout=0.5, kill_timeout=5)
    p.wait()
    assert res.killed == [p.pid] and res.terminated == [] and p.returncode == -signal.SIGKILL


def test_stop_never_signals_a_recycled_pid() -> None:
    p = _spawn(ignore_term=False)
    try:
        res = stopping.stop({p.pid: _start(p.pid) + 1}, {}, term_timeout=0.5, kill_timeout=0.5)
        assert res.already_gone == [p.pid] and p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_read_proc_reports_cwd_log_and_environment(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    with open(log, "w") as fh:
        p = subprocess.Popen([sys.executable, "-c", "import sys, time; print('x', flush=True); sys.stdin.read()"],
                             stdout=fh, stdin=subprocess.PIPE, cwd=tmp_path,
                             env={"TRAIN_X": "1", "SECRET_TOKEN": "s"})
    try:
        while not log.read_text():  # the child has started once it has printed
            time.sleep(0.01)
        got = procs.read_proc(p.pid, with_env=True)
        assert got is not None and got.cwd == str(tmp_path) and got.stdout == str(log)
        rec = selection.record_of(got)
        assert rec["log"] == str(log) and rec["env"] == {"TRAIN_X": "1"} and "SECRET_TOKEN" in rec["env_names"]
    finally:
        p.kill()
        p.wait()


# --------------------------------------------------------------------------- the module, run for real

FAKE_SMI = """#!{python}
# Stand-in nvidia-smi: two GPUs; each live pid listed in {holders} holds GPU-a (a zombie holds nothing).
import sys
if sys.argv[1].startswith("--query-gpu="):
    print("0, NVIDIA RTX PRO 6000 Blackwell, 97887, GPU-a")
    print("1, NVIDIA RTX PRO 6000 Blackwell, 97887, GPU-b")
    sys.exit(0)
try:
    pids = open("{holders}").read().split()
except OSError:
    pids = []
for pid in pids:
    try:
        state = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if state not in ("Z", "X"):
        print("%s, python3, 91000, GPU-a" % pid)
"""


@pytest.fixture()
def smi(tmp_path: Path) -> Path:
    """A stand-in nvidia-smi whose holders are the pids written to smi.holders (next to it)."""
    path = tmp_path / "nvidia-smi"
    path.write_text(FAKE_SMI.format(python=HOST_PYTHON, holders=tmp_path / "nvidia-smi.holders"))
    path.chmod(0o755)
    return path


@pytest.fixture()
def job(smi: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A running job on GPU-a with a unique command line, and the pattern that finds it (and no other line: the
    pattern's own text, e.g. in the ansible command line, does not match it)."""
    token = uuid.uuid4().hex
    p = _spawn(False, f"dflash-test-job-{token}")
    smi.with_suffix(".holders").write_text(str(p.pid))
    yield p, f"dflash-test-j[o]b-{token}$"
    if p.poll() is None:
        p.kill()
    p.wait()


def stop_args(smi: Path, pattern: str, **kw: Any) -> dict[str, Any]:
    return {"state": "stopped", "host": "ct200", "match": [pattern], "pidfile": "", "nvidia_smi": str(smi),
            "record_path": str(smi.parent / "state" / "stopped-training.json"), "gpu_free_retries": 20,
            "gpu_free_delay_s": 0.1, "term_timeout_s": 30, **kw}


def test_the_training_module_names_wrong_arguments(smi: Path) -> None:
    res = run_module("dflash_training", {"match": ["x"]})
    assert res["failed"] and "missing required arguments: state" in res["msg"]
    res = run_module("dflash_training", stop_args(smi, "^(unclosed", gpu_free_retries=-1))
    assert res["failed"] and "match: expected Python regular expressions, found '^(unclosed'" in res["msg"]
    assert "gpu_free_retries: expected a number of at least 0, found -1" in res["msg"]
    assert "Nothing was changed" in res["msg"]


def test_the_training_module_stops_the_job_after_saying_what_it_would_stop(
        smi: Path, job: tuple[subprocess.Popen[str], str]) -> None:
    p, pattern = job
    args = stop_args(smi, pattern)
    record_path = Path(args["record_path"])
    checked = run_module("dflash_training", args, check=True, diff=True)
    assert checked["changed"] and checked["msg"][0] == "Would stop the training job (match), GPUs 0:"
    assert f"running: pid {p.pid} user" in checked["diff"]["before"]
    assert p.poll() is None and not record_path.exists()
    done = run_module("dflash_training", args)
    assert done["changed"] and done["stop"]["terminated"] == [p.pid] and done["holders"] == []
    assert p.wait() == -signal.SIGTERM
    assert record_path.stat().st_mode & 0o777 == 0o600
    rec = json.loads(record_path.read_text())
    assert rec["host"] == "ct200" and rec["gpus"] == [0] and rec["resume"]["command"][-1].startswith("dflash-test-job-")
    assert done["msg"][-1] == "ct200: all GPUs are free."
    again = run_module("dflash_training", args)
    assert not again["changed"] and again["msg"][0] == "Nothing to stop: no training job found on ct200."


def test_the_training_module_fails_while_another_process_holds_the_gpus(smi: Path) -> None:
    smi.with_suffix(".holders").write_text(str(os.getpid()))
    args = stop_args(smi, "^n[o]thing-matches-this$", gpu_free_retries=1, gpu_free_delay_s=0)
    res = run_module("dflash_training", args)
    assert res["failed"] and f"found pid {os.getpid()} (python3) on GPU 0 with 91000 MiB" in res["msg"]
    checked = run_module("dflash_training", args, check=True)
    assert not checked["changed"] and checked["msg"][-1].startswith("Would fail after the stop: ct200: expected")


def test_the_training_module_resumes_only_from_a_record_and_refuses_while_the_gpus_are_held(smi: Path) -> None:
    record_path = smi.parent / "state" / "stopped-training.json"
    args = {"state": "resumed", "host": "ct200", "record_path": str(record_path), "nvidia_smi": str(smi)}
    nothing = run_module("dflash_training", args)
    assert not nothing["changed"] and "nothing was stopped, nothing to resume" in nothing["msg"][0]
    record.write_record(record_path, record.stop_record("ct200", FOUND, {36: [0]}, {}, "", [], "t", ["a.service"]))
    smi.with_suffix(".holders").write_text(str(os.getpid()))
    refused = run_module("dflash_training", args, check=True)
    assert refused["failed"] and f"pid {os.getpid()} (python3, in no systemd unit; GPUs 0)" in refused["msg"]
    assert "Nothing was started" in refused["msg"]
    forced = run_module("dflash_training", dict(args, force=True), check=True, diff=True)
    assert forced["changed"] and forced["commands"][0][:2] == ["systemd-run", f"--unit={forced['unit']}"]
    assert forced["commands"][0][-3:] == ["--", "python3", "/root/train.py"]
    assert forced["kept_record"].endswith("Z.json") and "would start the training job" in forced["msg"][0]
    assert forced["diff"]["after"].startswith(f"running in {forced['unit']}")
    assert record_path.exists() and not Path(forced["kept_record"]).exists()
