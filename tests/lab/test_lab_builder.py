"""The lab builder boots real systemd containers that Ansible reaches like the production ones.

The tests run in file order on one session lab; the last one tears it down.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
READY = ("running", "degraded")


def ansible(*args: str) -> subprocess.CompletedProcess[str]:
    """Ad-hoc ansible from the project venv against the lab inventory, host key checking on."""
    exe = Path(sys.executable).with_name("ansible")
    binary = str(exe) if exe.exists() else shutil.which("ansible") or "ansible"
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_STDOUT_CALLBACK="default")
    return subprocess.run([binary, "-i", str(REPO / "inventory" / "lab"), *args], cwd=REPO, text=True,
                          capture_output=True, env=env, stdin=subprocess.DEVNULL)


def one_line_results(output: str) -> dict[str, str]:
    """Host -> rest of the line from `ansible -o` output."""
    results = {}
    for line in output.splitlines():
        host, sep, rest = line.partition(" | ")
        if sep:
            results[host.strip()] = rest
    return results


def test_lab_up_boots_every_container(lab: LabHandle) -> None:
    status = lab.status()
    assert sorted(status) == sorted(lab.names)
    for name, row in status.items():
        assert row["pid"], f"{name} has no systemd-nspawn process: {row}"
        assert row["systemd"] in READY, f"{name}: systemd is {row['systemd']}"
        assert row["ssh"], f"{name}: sshd on {row['address']} does not accept the lab key"
        assert row["address"] == lab.addresses[name]


def test_ansible_ping_reaches_both_containers(lab: LabHandle) -> None:
    proc = ansible("all", "-m", "ansible.builtin.ping", "-o")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = one_line_results(proc.stdout)
    assert sorted(results) == sorted(lab.names)
    assert all(r.startswith("SUCCESS") and '"pong"' in r for r in results.values()), results


def test_inventory_groups_match_production_names(lab: LabHandle) -> None:
    containers = sorted(c.name for c in lab.machines if not c.is_node)
    for group, expected in (("pro6000", ["ct200"]), ("eval", ["ct129"]), ("proxmox_nodes", ["pve1"]),
                            ("proxmox_containers", containers)):
        proc = ansible(group, "--list-hosts")
        assert proc.returncode == 0, proc.stderr
        hosts = sorted(line.strip() for line in proc.stdout.splitlines()[1:] if line.strip())
        assert hosts == expected, f"group {group}: {hosts}"


def test_systemd_inside_is_running_or_degraded(lab: LabHandle) -> None:
    for name in lab.names:
        proc = lab.ssh(name, "systemctl", "is-system-running")
        assert proc.stdout.strip() in READY, f"{name}: {proc.stdout}{proc.stderr}"
        pid1 = lab.ssh(name, "cat", "/proc/1/comm")
        assert pid1.stdout.strip() == "systemd", f"{name}: PID 1 is {pid1.stdout!r}"


def test_hostnames_match_inventory_names(lab: LabHandle) -> None:
    proc = ansible("all", "-m", "ansible.builtin.command", "-a", "hostname", "-o")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host, rest in one_line_results(proc.stdout).items():
        assert rest.rstrip().endswith(f"(stdout) {host}"), f"{host}: {rest}"


def test_sshd_listens_only_on_the_container_address(lab: LabHandle) -> None:
    for name in lab.names:
        proc = lab.ssh(name, "ss", "-Hltnp")
        assert proc.returncode == 0, proc.stderr
        sockets = [line.split()[3] for line in proc.stdout.splitlines() if '"sshd"' in line]
        assert sockets == [f"{lab.addresses[name]}:22"], f"{name}: sshd listens on {sockets}"


def test_containers_have_their_own_identity(lab: LabHandle) -> None:
    machine_ids = {n: lab.ssh(n, "cat", "/etc/machine-id").stdout.strip() for n in lab.names}
    host_keys = {n: lab.ssh(n, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for n in lab.names}
    assert len(set(machine_ids.values())) == len(lab.names), machine_ids
    assert len(set(host_keys.values())) == len(lab.names), host_keys
    # NCCL at TP > 1 needs a shared-memory tmpfs in each container.
    for guest in (c for c in lab.machines if not c.is_node):
        shm = lab.ssh(guest.name, "findmnt", "-n", "-o", "FSTYPE", "/dev/shm")
        assert shm.stdout.strip() == "tmpfs", f"{guest.name}: {shm.stdout}{shm.stderr}"


def test_each_container_runs_its_units_in_cgroups_of_its_own(lab: LabHandle) -> None:
    # Shared cgroups would let one container's `systemctl stop sglang-qwen.service` kill another's engine (every
    # container of every lab of this machine runs units of the same names).
    seen: dict[str, str] = {}
    for c in lab.machines:
        leader = lab.mod.container_leader(lab.mod.running_pid(lab.paths, c))
        assert leader is not None, c.name
        unified = next(line.split(":", 2)[2] for line in Path(f"/proc/{leader}/cgroup").read_text().splitlines()
                       if line.startswith("0::"))
        assert unified.endswith("/payload/init.scope") and "/dflash-lab/" in unified, (c.name, unified)
        seen[c.name] = unified
        # Inside, the container sees its own root: the unit names host_state reads are the container's own.
        inside = lab.ssh(c.name, "cat", "/proc/self/cgroup").stdout
        assert "0::/system.slice/ssh.service" in inside.splitlines(), (c.name, inside)
    assert len(set(seen.values())) == len(seen), seen


def test_host_keys_are_checked_against_the_lab_known_hosts(lab: LabHandle, tmp_path: Path) -> None:
    container = lab.mod.CONTAINERS[0]
    argv = lab.mod.ssh_argv(lab.paths, container, "true")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = [a.replace(str(lab.paths.known_hosts), str(empty)) for a in argv]
    proc = subprocess.run(argv, text=True, capture_output=True, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "Host key verification failed" in proc.stderr


def test_second_up_changes_nothing(lab: LabHandle) -> None:
    before = {n: row["pid"] for n, row in lab.status().items()}
    out = lab.cli_ok("up")
    assert "nothing to do" in out, out
    assert {n: row["pid"] for n, row in lab.status().items()} == before


def test_stop_and_start_one_container_keeps_its_disk(lab: LabHandle) -> None:
    name, other = lab.names[1], lab.names[0]
    other_pid = lab.status()[other]["pid"]
    marker = "/root/lab-stop-start-marker"
    assert lab.ssh(name, "touch", marker).returncode == 0

    lab.cli_ok("stop", name)
    stopped = lab.status()
    assert stopped[name]["pid"] is None and stopped[name]["systemd"] == "offline"
    assert lab.mod.nspawn_pids_for(lab.paths.machine(name)) == []
    assert lab.ssh(name, "true").returncode != 0
    assert stopped[other]["pid"] == other_pid and stopped[other]["systemd"] in READY

    lab.cli_ok("start", name)
    started = lab.status()
    assert started[name]["pid"] and started[name]["systemd"] in READY and started[name]["ssh"]
    assert lab.ssh(name, "test", "-f", marker).returncode == 0, "the disk was not kept across stop/start"
    assert lab.ssh(name, "rm", "-f", marker).returncode == 0


def test_up_restarts_a_container_whose_nspawn_died(lab: LabHandle) -> None:
    name = lab.names[0]
    old_pid = lab.status()[name]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    assert lab.status()[name]["systemd"] in ("orphaned", "offline")

    out = lab.cli_ok("up")
    assert "nothing to do" not in out
    row = lab.status()[name]
    assert row["pid"] and row["pid"] != old_pid
    assert row["systemd"] in READY and row["ssh"]
    assert lab.mod.orphan_leaders(lab.paths.machine(name)) == []


@pytest.mark.lab_teardown
def test_down_leaves_no_process_and_no_mount(lab: LabHandle) -> None:
    uuids = {lab.mod.machine_uuid(lab.paths.machine(n)) for n in lab.names}
    lab.cli_ok("down")

    for pid in lab.mod.all_pids():
        argv = lab.mod.cmdline(pid)
        if argv and argv[0].endswith("systemd-nspawn") and lab.mod.is_alive(pid):
            assert str(lab.paths.machines) not in " ".join(argv), f"nspawn still running: {argv}"
        env = lab.mod.environ(pid)
        assert env.get("container_uuid") not in uuids or not lab.mod.is_alive(pid), f"container process {pid} left"
    assert lab.mod.mounts_under(lab.paths.state) == []
    for name in lab.names:
        assert not lab.paths.machine(name).exists()
        assert lab.status()[name]["systemd"] == "offline"
    assert lab.paths.base_stamp.exists(), "lab down must keep the cached base rootfs"
