"""ct200 reached the production `via_pct` way: SSH to the Proxmox node stand-in (pve1), `pct exec 200 -- ...`.

Through `-i inventory/lab -i inventory/lab-pct` (production's via_pct settings) with HOME=<state>/ssh/home, whose
~/.ssh/known_hosts is the lab's: the deploy's probe and plan with ct200's own sshd stopped, one change and its
no-op re-run, host key checking, and what pct answers on the node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import ansible_runner
import pytest
from ansible.plugins.shell.sh import ShellModule
from ansible_collections.community.proxmox.plugins.connection.proxmox_pct_remote import Connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import BIN, ROOT

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab

INVENTORIES = [str(ROOT / "inventory" / "lab"), str(ROOT / "inventory" / "lab-pct")]
TARGET = "/var/tmp/dflash-pct-path-test"


def play(lab: LabHandle, tmp_path: Path, playbook: str, *cmdline: str,
         limit: str = "pro6000") -> ansible_runner.Runner:
    """ansible-playbook through ansible-runner on both lab inventories (a fresh private_data_dir per run)."""
    private = tmp_path / f"runner-{len(list(tmp_path.glob('runner-*')))}"
    private.mkdir()
    return ansible_runner.run(
        private_data_dir=str(private), project_dir=str(ROOT), playbook=playbook, inventory=INVENTORIES,
        limit=limit, cmdline=" ".join(cmdline) or None, quiet=True, rotate_artifacts=1,
        envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                 "ANSIBLE_NOCOLOR": "1", "HOME": str(lab.paths.paramiko_home)})


def changed(runner: ansible_runner.Runner, host: str = "ct200") -> int:
    return (runner.stats or {}).get("changed", {}).get(host, 0)


class PctdLog:
    """What the pct daemon logged since a mark: one line per pct command it served."""

    def __init__(self, lab: LabHandle) -> None:
        self.path = lab.paths.logs / "pctd.log"
        self.mark = self.path.stat().st_size

    def new_lines(self) -> list[str]:
        with self.path.open("rb") as log:
            log.seek(self.mark)
            return log.read().decode(errors="replace").splitlines()


def pct_command(vmid: int, command: str) -> str:
    """The string the proxmox_pct_remote connection sends to the node, built by the plugin's own code."""
    options = {"vmid": vmid, "remote_user": "root"}
    fake = SimpleNamespace(get_option=options.__getitem__)
    return Connection._build_pct_command(fake, command)  # type: ignore[arg-type]


def on_node(lab: LabHandle, command: str) -> subprocess.CompletedProcess[str]:
    """One command string run by the node's login shell over SSH, as the connection plugin does."""
    return lab.ssh("pve1", command)


def ct200_leader(lab: LabHandle) -> int:
    c = next(c for c in lab.mod.CONTAINERS if c.name == "ct200")
    pid = lab.mod.running_pid(lab.paths, c)
    leader = lab.mod.container_leader(pid) if pid else None
    assert leader, "ct200 is not running"
    return leader


@pytest.fixture()
def ct200_without_sshd(lab: LabHandle) -> Iterator[None]:
    """ct200's own sshd stopped (through nsenter, not SSH) for the test, started again afterwards."""
    leader = ct200_leader(lab)
    stop = subprocess.run(lab.mod.nsenter_argv(leader, "systemctl", "stop", "ssh.service"), capture_output=True,
                          text=True)
    assert stop.returncode == 0, stop.stderr
    try:
        assert lab.ssh("ct200", "true").returncode != 0, "ct200's sshd still answers"
        yield
    finally:
        start = subprocess.run(lab.mod.nsenter_argv(ct200_leader(lab), "systemctl", "start", "ssh.service"),
                               capture_output=True, text=True)
        assert start.returncode == 0, start.stderr
        assert lab.ssh("ct200", "true").returncode == 0, "ct200's sshd did not come back"


def test_the_deploy_probe_reaches_ct200_through_pct_without_its_sshd(
        lab: LabHandle, tmp_path: Path, ct200_without_sshd: None) -> None:
    log = PctdLog(lab)
    runner = play(lab, tmp_path, "deploy_dflash.yml", "--tags", "plan")
    out = runner.stdout.read()
    assert runner.rc == 0, out[-5000:]
    assert "ct200 has 8x NVIDIA RTX PRO 6000 Blackwell" in out, out[-3000:]
    assert changed(runner) == 0
    served = [line for line in log.new_lines() if " exec 200 status=" in line]
    modules = [line for line in served if "AnsiballZ_" in line and "status=0" in line]
    assert modules, "no module ran in ct200 through the pct daemon:\n" + "\n".join(log.new_lines()[-20:])
    # Every command came back through pct with its own exit status: none was refused by pct (255) or killed by a
    # signal (128+N). A module may exit 1 where its task expects it (the summary's slurp of a record not written yet).
    statuses = [int(re.search(r" status=(\d+)", line)[1]) for line in served]
    assert all(s < 128 for s in statuses), "\n".join(served)


def test_one_change_through_pct_then_a_rerun_changes_nothing(lab: LabHandle, tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    text = "quotes ' \" ` $HOME $(id) \\n\nnewline\ttab\n"
    payload.write_bytes(text.encode() + os.urandom(3 * 1024 * 1024))
    playbook = tmp_path / "write.yml"
    playbook.write_text(
        "- name: Write a file on ct200 through its node\n"
        "  hosts: ct200\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Copy the payload to ct200\n"
        "      ansible.builtin.copy:\n"
        f"        src: {payload}\n"
        f"        dest: {TARGET}\n"
        "        mode: '0600'\n")
    lab.ssh("ct200", "rm", "-f", TARGET)
    try:
        log = PctdLog(lab)
        first = play(lab, tmp_path, str(playbook))
        assert first.rc == 0, first.stdout.read()[-5000:]
        assert changed(first) == 1
        assert any(" exec 200 status=0" in line and "cat > " in line for line in log.new_lines())
        remote = lab.ssh("ct200", "sha256sum", TARGET).stdout.split()[:1]
        assert remote == [hashlib.sha256(payload.read_bytes()).hexdigest()]
        second = play(lab, tmp_path, str(playbook))
        assert second.rc == 0, second.stdout.read()[-5000:]
        assert changed(second) == 0
    finally:
        lab.ssh("ct200", "rm", "-f", TARGET)


def test_the_node_host_key_is_checked(lab: LabHandle, tmp_path: Path) -> None:
    # A HOME whose known_hosts lacks pve1: paramiko must refuse the node (no terminal to ask on), not add it.
    empty_home = tmp_path / "home"
    empty_home.mkdir()
    log = PctdLog(lab)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", HOME=str(empty_home))
    proc = subprocess.run([str(BIN / "ansible"), "-i", INVENTORIES[0], "-i", INVENTORIES[1], "ct200", "-m",
                           "ansible.builtin.ping"], cwd=ROOT, env=env, text=True, capture_output=True,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "ct200 | UNREACHABLE!" in proc.stdout, proc.stdout + proc.stderr
    assert not (empty_home / ".ssh" / "known_hosts").exists(), "pve1's host key was recorded without a check"
    assert not [line for line in log.new_lines() if " exec 200 " in line]


def test_pct_on_the_node_answers_like_pct(lab: LabHandle) -> None:
    listing = on_node(lab, "pct list")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert rows[0] == ["VMID", "Status", "Lock", "Name"]
    assert ["129", "running", "ct129"] in rows and ["200", "running", "ct200"] in rows
    assert on_node(lab, "pct status 200").stdout == "status: running\n"

    config = on_node(lab, "pct config 200").stdout.splitlines()
    uvm = lab.mod.char_major(lab.mod.PROC_DEVICES_FIXTURE.read_text(), "nvidia-uvm")
    assert "hostname: ct200" in config
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in config
    assert f"lxc.cgroup2.devices.allow: c {uvm}:* rwm" in config
    mounts = [line.split()[1] for line in config if line.startswith("lxc.mount.entry:")]
    assert mounts == [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                             "/dev/nvidia-uvm-tools"]
    on_disk = (lab.paths.etc_pve / "lxc" / "200.conf").read_text()
    assert on_node(lab, "cat /etc/pve/lxc/200.conf").stdout == on_disk

    missing = on_node(lab, "pct exec 999 -- true")
    assert missing.returncode == 255
    assert "Configuration file 'nodes/pve1/lxc/999.conf' does not exist" in missing.stderr


def test_a_container_without_a_running_lab_machine_is_not_running(lab: LabHandle) -> None:
    conf = lab.paths.etc_pve / "lxc" / "300.conf"
    conf.write_text((lab.paths.etc_pve / "lxc" / "129.conf").read_text().replace("hostname: ct129",
                                                                                 "hostname: ct300"))
    try:
        assert on_node(lab, "pct status 300").stdout == "status: stopped\n"
        proc = on_node(lab, "pct exec 300 -- true")
        assert proc.returncode == 255 and "container '300' not running!" in proc.stderr
    finally:
        conf.unlink()


def test_the_plugin_command_string_arrives_intact_through_the_node_shell(lab: LabHandle) -> None:
    args = ["it's", 'say "hi"', "$HOME `id` $(id)", "two\nlines", "tab\there", ""]
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    command = " ".join(ShellModule().quote(a) for a in ["/usr/bin/python3", "-c", script, *args])
    proc = on_node(lab, pct_command(200, command))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == args
    status = on_node(lab, pct_command(200, "/bin/sh -c " + shlex.quote("echo out; echo err >&2; exit 3")))
    assert (status.returncode, status.stdout, status.stderr) == (3, "out\n", "err\n")
