"""One deploy at a time: the host lock's module and action plugin (for real, through `ansible localhost`), and how a
dead run is told from a live one (dflash_infra.host_lock). The two-deploys-at-once run: tests/lab/test_deploy.py."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import socket
import subprocess
from pathlib import Path

from dflash_infra import host_lock
from helpers import HOST_PYTHON, ROOT, ansible_environment, run, run_module, tool


def me() -> dict:
    """A holder that is alive: this test process."""
    return host_lock.holder("tester", socket.gethostname(), os.getpid(), "deploy_dflash.yml")


def test_a_holder_names_its_process_by_pid_and_start_time_and_a_recycled_pid_is_dead() -> None:
    alive = me()
    assert alive["started_at"] == host_lock.process_started_at(os.getpid()) != "unknown"
    now = dt.datetime.now(dt.UTC)
    assert host_lock.staleness(alive, socket.gethostname(), now, 7200) == ""
    recycled = {**alive, "start_ticks": alive["start_ticks"] + 1, "started_at": "2020-01-01T00:00:00Z"}  # another
    assert "is gone" in host_lock.staleness(recycled, socket.gethostname(), now, 7200)
    elsewhere = {**alive, "controller": "laptop-of-someone"}
    assert host_lock.staleness(elsewhere, socket.gethostname(), now, 7200) == ""  # cannot see it: trusted
    old = {**elsewhere, "started_at": (now - dt.timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert host_lock.staleness(old, socket.gethostname(), now, 7200) == "it started 3.0 h ago, more than 2 h"


def fake_proc(root: Path, pid: int, ticks: int, btime: int) -> Path:
    """A /proc with one process (its stat's field 22, the start in ticks) and the kernel's boot time."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (ansible-playboo) S 1 {pid} {pid} 0 -1 " + "0 " * 13 + f"{ticks} 0\n")
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\nprocesses 9\n")
    return root


def test_a_run_stays_itself_when_the_clock_is_set_and_a_recycled_pid_is_not_it(tmp_path: Path) -> None:
    """The boot time the kernel gives is the clock's time minus the time since boot: when the clock is set, the same
    process gets another start time. The run is its start in ticks, which never moves; its start time is for people."""
    proc = fake_proc(tmp_path / "proc", 4242, ticks=1_000_050, btime=1_796_619_800)
    run = host_lock.holder("root", "vm", 4242, "deploy_dflash.yml", proc=str(proc))
    started = dt.datetime.fromtimestamp(1_796_619_800 + 1_000_050 // os.sysconf("SC_CLK_TCK"), dt.UTC)
    assert run["start_ticks"] == 1_000_050 and run["started_at"] == f"{started:%Y-%m-%dT%H:%M:%SZ}"
    fake_proc(proc, 4242, ticks=1_000_050, btime=1_796_619_801)  # the clock set forward by under a second
    later = host_lock.holder("root", "vm", 4242, "deploy_dflash.yml", proc=str(proc))
    assert later["started_at"] != run["started_at"] and host_lock.same_run(run, later)
    now = dt.datetime.now(dt.UTC)
    assert host_lock.staleness(run, "vm", now, 900, proc=str(proc)) == ""
    fake_proc(proc, 4242, ticks=2_000_000, btime=1_796_619_801)  # pid 4242 recycled by another process
    recycled = host_lock.holder("root", "vm", 4242, "deploy_dflash.yml", proc=str(proc))
    assert not host_lock.same_run(run, recycled)
    gone = host_lock.staleness(run, "vm", now, 900, proc=str(proc))
    assert gone == "its process 4242 on this controller (vm) is gone"
    # A lock written before the ticks were kept is told by its start time, as it was.
    older = {k: v for k, v in recycled.items() if k != "start_ticks"}
    assert host_lock.same_run(older, recycled) and not host_lock.same_run(older, run)
    assert host_lock.staleness(older, "vm", now, 900, proc=str(proc)) == ""
    # Without the kernel's boot time the run is still told by its ticks; its time for people is unknown.
    (proc / "stat").write_text("cpu  1 2 3 4\nprocesses 9\n")
    blind = host_lock.running("vm", 4242, str(proc))
    assert blind == {"controller": "vm", "pid": 4242, "start_ticks": 2_000_000, "started_at": "unknown"}
    assert host_lock.same_run(recycled, blind) and host_lock.started_at(2_000_000, str(proc)) is None
    # Once the process is gone, a lock of either kind names a dead run, and the process has no start time.
    (proc / "4242" / "stat").unlink()
    assert host_lock.process_started_at(4242, proc=str(proc)) is None
    assert host_lock.running("vm", 4242, str(proc)) is None
    assert host_lock.holder("root", "vm", 4242, "deploy_dflash.yml", proc=str(proc))["start_ticks"] is None
    for lock in (run, older, {**older, "started_at": "unknown"}):
        assert host_lock.staleness(lock, "vm", now, 900, proc=str(proc)) == gone, lock


def test_a_free_host_is_locked_and_a_dead_runs_lock_is_taken_over_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "run" / "deploy.lock"
    first = run_module("dflash_host_lock", {"path": str(path), "playbook": "deploy_dflash.yml"})
    assert first["acquired"] is True and first["changed"] is False and not first.get("failed"), first
    held = json.loads(path.read_text())
    assert held["controller"] == socket.gethostname() and held["playbook"] == "deploy_dflash.yml"
    # That `ansible` process has exited: the next run, on the same controller, takes its lock over.
    second = run_module("dflash_host_lock", {"path": str(path), "playbook": "deploy_dflash.yml"})
    assert second["acquired"] is True and second["took_over"] == held, second
    assert second["msg"].startswith(f"localhost: took over the deploy lock of a dead run (its process {held['pid']} "
                                    f"on this controller ({socket.gethostname()}) is gone)")
    assert json.loads(path.read_text())["pid"] != held["pid"]


def test_a_live_run_keeps_its_lock_and_the_second_deploy_fails_at_once_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "deploy.lock"
    path.write_text(json.dumps(me()))
    out = run_module("dflash_host_lock", {"path": str(path), "playbook": "serve"})
    assert out.get("failed") and out["held_by"] == me(), out
    beat = dt.datetime.fromtimestamp(int(path.stat().st_mtime), dt.UTC)
    assert out["msg"] == (f"localhost: another deploy holds this host: deploy_dflash.yml run by tester on "
                          f"{socket.gethostname()} (pid {os.getpid()}, since {me()['started_at']}), its last "
                          f"heartbeat {beat:%H:%M:%S} UTC. One deploy runs at a time; wait for it to finish. If that "
                          "run is dead and this controller cannot tell (it ran elsewhere), it is taken over once its "
                          f"heartbeat is 15 min old (or remove {path} on localhost).")
    assert json.loads(path.read_text()) == me()
    # A run on another controller that started long ago but still beats is alive; one whose heartbeat stopped is dead.
    elsewhere = {**me(), "controller": "laptop-of-someone", "pid": 1, "started_at": "2020-01-01T00:00:00Z"}
    path.write_text(json.dumps(elsewhere))
    assert run_module("dflash_host_lock", {"path": str(path)}).get("failed")
    long_ago = dt.datetime.now(dt.UTC).timestamp() - 3700
    os.utime(path, (long_ago, long_ago))
    kept = run_module("dflash_host_lock", {"path": str(path), "stale_after_s": 7200})
    assert kept.get("failed") and json.loads(path.read_text()) == elsewhere, kept
    taken = run_module("dflash_host_lock", {"path": str(path), "stale_after_s": 3600})
    assert taken["acquired"] and taken["took_over"] == elsewhere, taken
    assert "(its last heartbeat was 62 min ago, more than 60 min)" in taken["msg"], taken["msg"]
    path.write_text("{not json")
    unreadable = run_module("dflash_host_lock", {"path": str(path)})
    assert unreadable["acquired"] and "its file cannot be read" in unreadable["msg"], unreadable


def test_check_mode_takes_no_lock_and_says_who_holds_one(tmp_path: Path) -> None:
    path = tmp_path / "deploy.lock"
    free = run_module("dflash_host_lock", {"path": str(path)}, check=True)
    assert free["msg"] == "localhost: --check takes no lock" and not path.exists() and not free.get("failed")
    path.write_text(json.dumps(me()))
    held = run_module("dflash_host_lock", {"path": str(path)}, check=True)
    assert not held.get("failed") and held["held_by"] == me() and json.loads(path.read_text()) == me()


def local_play(tmp_path: Path, tasks: str) -> subprocess.CompletedProcess[str]:
    """Run one play of `tasks` (YAML lines, indented 4) on localhost, as ansible-playbook runs a deploy."""
    play = tmp_path / "play.yml"
    play.write_text(f"- hosts: localhost\n  gather_facts: false\n  tasks:\n{tasks}")
    return run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                f"ansible_python_interpreter={HOST_PYTHON}", str(play)], env=ansible_environment())


def test_a_run_gives_back_only_its_own_lock(tmp_path: Path) -> None:
    path = tmp_path / "deploy.lock"
    proc = local_play(tmp_path, f"""\
    - {{dflash_host_lock: {{path: "{path}", playbook: test}}}}
    - {{ansible.builtin.command: "test -f {path}", changed_when: false}}
    - {{dflash_host_lock: {{path: "{path}", state: released}}}}
    - {{ansible.builtin.command: "test ! -e {path}", changed_when: false}}
    - {{ansible.builtin.copy: {{dest: "{path}", content: '{json.dumps(me())}'}}}}
    - {{dflash_host_lock: {{path: "{path}", state: released}}}}
""")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads(path.read_text()) == me()  # another run's lock stays


def test_the_lock_files_text_is_read_back_exactly_from_a_pseudo_terminal() -> None:
    """Over SSH a sudoable command runs on a pty (CR LF line ends): take-over compares the file's exact text."""
    spec = importlib.util.spec_from_file_location("lock_action", ROOT / "action_plugins" / "dflash_host_lock.py")
    assert spec and spec.loader
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    text = json.dumps(me(), sort_keys=True)
    beat = dt.datetime(2026, 12, 6, 8, 0, tzinfo=dt.UTC)
    stamp = int(beat.timestamp())
    for stdout in (f"HELD\n{stamp}\n{text}\n", f"HELD\r\n{stamp}\r\n{text}\r\n"):
        assert plugin.parse_output(stdout) == ("HELD", text, me(), beat), stdout
    assert plugin.parse_output("ACQUIRED\r\n0\r\n") == ("ACQUIRED", "", None, None)
    assert plugin.parse_output("HELD\r\n1\r\n{half")[2] == {
        "unreadable": "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)): '{half'"}


def test_a_runs_heartbeat_touches_its_lock_and_stops_the_run_once_another_run_took_it(tmp_path: Path) -> None:
    path = tmp_path / "deploy.lock"
    other = {**me(), "controller": "laptop-of-someone", "pid": 1}
    proc = local_play(tmp_path, f"""\
    - {{dflash_host_lock: {{path: "{path}", playbook: test}}}}
    - {{ansible.builtin.command: "touch -d '2 hours ago' {path}", changed_when: false}}
    - {{dflash_host_lock: {{path: "{path}", state: heartbeat}}}}
    - {{ansible.builtin.command: "find {path} -mmin -1 -print", register: fresh, changed_when: false}}
    - {{ansible.builtin.assert: {{that: ["fresh.stdout == '{path}'"]}}}}
    - {{ansible.builtin.copy: {{dest: "{path}", content: '{json.dumps(other)}'}}}}
    - {{dflash_host_lock: {{path: "{path}", state: heartbeat}}}}
    - {{ansible.builtin.command: "echo never reached", changed_when: false}}
""")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "ok=6" in proc.stdout and "failed=1" in proc.stdout and "never reached" not in proc.stdout, proc.stdout
    assert (f"localhost: this run no longer holds the deploy lock ({path}): deploy_dflash.yml run by tester on "
            f"laptop-of-someone (pid 1, since {me()['started_at']}) took it over (this run: pid ") in \
        " ".join(proc.stdout.split()), proc.stdout[-3000:]
    assert json.loads(path.read_text()) == other  # the other run's lock stays
