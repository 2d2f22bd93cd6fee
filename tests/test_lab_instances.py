"""Two labs on one machine (LAB_INSTANCE): lab N's machines on 127.N.x.1, its own state folder, the first lab's base
rootfs, and the lab inventory pointing at the same addresses (make test runs its lab tests on lab 0 and lab 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import BIN, ROOT, ansible_environment

LAB = ROOT / "lab"


def lab_config(instance: str | None, **env: str) -> dict[str, object]:
    """The machine table and settings lab/labbuilder/config.py derives in a fresh process for LAB_INSTANCE."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LAB_")}
    environ.update(env)
    if instance is not None:
        environ["LAB_INSTANCE"] = instance
    code = ("import json, labctl; s = labctl.Settings.from_env(); p = labctl.Paths(s.state, s.rootfs); "
            "print(json.dumps({'machines': {c.name: c.address for c in labctl.CONTAINERS}, 'state': str(s.state), "
            "'base': str(p.base), 'key': str(p.key), 'unbuilt_on_demand': [c.name for c in labctl.CONTAINERS "
            "if c.on_demand and not p.created_stamp(c.name).exists()]}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=LAB, env=environ, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    config: dict[str, object] = json.loads(proc.stdout)
    return config


def test_lab_zero_is_the_lab_as_it_always_was() -> None:
    config = lab_config(None)
    config.pop("unbuilt_on_demand")
    assert config == {
        "machines": {"ct200": "127.0.200.1", "ct129": "127.0.129.1", "pve1": "127.0.10.1", "ct201": "127.0.201.1"},
        "state": str(ROOT / ".cache" / "lab"), "base": str(ROOT / ".cache" / "lab" / "rootfs" / "base"),
        "key": str(ROOT / ".cache" / "lab" / "ssh" / "id_ed25519")}


def test_lab_one_has_its_own_addresses_and_state_and_clones_the_first_labs_base() -> None:
    config = lab_config("1")
    config.pop("unbuilt_on_demand")
    assert config == {
        "machines": {"ct200": "127.1.200.1", "ct129": "127.1.129.1", "pve1": "127.1.10.1", "ct201": "127.1.201.1"},
        "state": str(ROOT / ".cache" / "lab-1"), "base": str(ROOT / ".cache" / "lab" / "rootfs" / "base"),
        "key": str(ROOT / ".cache" / "lab-1" / "ssh" / "id_ed25519")}
    moved = lab_config("1", LAB_STATE_DIR="/srv/lab-b", LAB_ROOTFS_DIR="/srv/rootfs")
    assert (moved["state"], moved["base"]) == ("/srv/lab-b", "/srv/rootfs/base")


@pytest.mark.parametrize("raw", ["x", "10", "-1"])
def test_a_lab_instance_that_is_not_a_digit_is_refused(raw: str) -> None:
    environ = dict(os.environ, LAB_INSTANCE=raw)
    proc = subprocess.run([sys.executable, "-c", "import labctl"], cwd=LAB, env=environ, capture_output=True,
                          text=True)
    assert proc.returncode != 0
    assert f"LAB_INSTANCE must be a number 0-9 (the second byte of the lab's loopback addresses), found {raw!r}" \
        in proc.stderr


@pytest.mark.parametrize("instance", ["0", "1"])
def test_the_lab_inventory_reaches_the_machines_of_its_lab(instance: str) -> None:
    env = {k: v for k, v in ansible_environment().items() if not k.startswith("LAB_")}
    env.update(LAB_INSTANCE=instance, ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    proc = subprocess.run(
        [str(BIN / "ansible"), "-i", "inventory/lab", "all", "-c", "local", "-m", "ansible.builtin.debug",
         "-a", "msg={{ [ansible_host, lab_state_dir | realpath, ansible_ssh_private_key_file | realpath] }}"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = lab_config(instance)
    state = config["state"]
    unbuilt = config["unbuilt_on_demand"]
    for name, address in config["machines"].items():  # type: ignore[attr-defined]
        if name in unbuilt:  # an on-demand machine (ct201) is in the inventory once it is built
            assert f"{name} | SUCCESS" not in proc.stdout, proc.stdout
            continue
        start = proc.stdout.index(f"{name} | SUCCESS => ") + len(f"{name} | SUCCESS => ")
        shown = json.loads(proc.stdout[start:proc.stdout.index("\n}", start) + 2])
        assert shown["msg"] == [address, state, f"{state}/ssh/id_ed25519"], proc.stdout


def test_the_lab_inventory_takes_a_moved_state_folder_and_wheels_and_holds_plain_values(tmp_path: Path) -> None:
    """LAB_STATE_DIR and LAB_WHEELS_DIR move the state and the wheelhouses; every variable is a plain value (no
    template left for a task to render again), with the production groups and host names."""
    env = {k: v for k, v in ansible_environment().items() if not k.startswith("LAB_")}
    env.update(LAB_INSTANCE="1", LAB_STATE_DIR=str(tmp_path / "state"), LAB_WHEELS_DIR=str(tmp_path / "wheels"))
    proc = subprocess.run([str(BIN / "ansible-inventory"), "-i", "inventory/lab", "--list"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = json.loads(proc.stdout)
    assert listed["proxmox_containers"]["children"] == ["pro6000", "eval"]
    assert (listed["pro6000"]["hosts"], listed["eval"]["hosts"], listed["proxmox_nodes"]["hosts"]) == \
        (["ct200"], ["ct129"], ["pve1"])
    ct200 = listed["_meta"]["hostvars"]["ct200"]
    assert {key: ct200[key] for key in ("ansible_host", "proxmox_vmid", "proxmox_node", "lab_instance",
                                        "lab_state_dir", "lab_wheels_dir", "ansible_ssh_private_key_file")} == {
        "ansible_host": "127.1.200.1", "proxmox_vmid": 200, "proxmox_node": "pve1", "lab_instance": "1",
        "lab_state_dir": str(tmp_path / "state"), "lab_wheels_dir": str(tmp_path / "wheels"),
        "ansible_ssh_private_key_file": str(tmp_path / "state" / "ssh" / "id_ed25519")}
    assert f"UserKnownHostsFile={tmp_path / 'state' / 'ssh' / 'known_hosts'}" in ct200["ansible_ssh_common_args"]
    script = subprocess.run([str(ROOT / "inventory" / "lab" / "hosts.py"), "--list"], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    own = json.loads(script.stdout)  # what the script sets (ansible-inventory adds the group_vars files)
    values = [*own.pop("_meta")["hostvars"].values(), *(group.get("vars", {}) for group in own.values())]
    assert values and not [key for found in values for key, value in found.items() if "{{" in str(value)], own


def test_a_bad_lab_instance_stops_a_run_of_the_lab_inventory_saying_why() -> None:
    env = {k: v for k, v in ansible_environment().items() if not k.startswith("LAB_")}
    env.update(LAB_INSTANCE="x")
    proc = subprocess.run([str(BIN / "ansible"), "-i", "inventory/lab", "all", "-c", "local", "-m",
                           "ansible.builtin.ping"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "SUCCESS" not in proc.stdout, proc.stdout + proc.stderr
    assert "inventory/lab: LAB_INSTANCE must be a number 0-9" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("hybrid", [True, False])
def test_each_machine_gets_a_cgroup_of_its_own_in_the_hierarchies_systemd_uses(tmp_path: Path, hybrid: bool) -> None:
    sys.path.insert(0, str(LAB))
    from labbuilder.host import join_cgroups, machine_cgroups

    unified, named = tmp_path / "unified", tmp_path / "systemd"
    # The mount lines of this machine's /proc/self/mountinfo (hybrid: cgroup2 beside v1 with name=systemd), and a
    # pure cgroup2 host's.
    mounts = (f"46 37 0:41 / {named} rw,relatime shared:21 - cgroup cgroup rw,name=systemd\n"
              f"47 37 0:42 / {unified} rw,relatime shared:22 - cgroup2 cgroup2 rw\n"
              f"38 37 0:33 / {tmp_path / 'memory'} rw,relatime shared:13 - cgroup cgroup rw,memory\n"
              if hybrid else f"30 24 0:26 / {unified} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n")
    cgroup = ("9:name=systemd:/ci\n4:memory:/process_api/c9b5\n0::/ci\n" if hybrid else "0::/ci\n")
    (tmp_path / "mountinfo").write_text(f"22 1 0:21 / /proc rw - proc proc rw\n{mounts}")
    (tmp_path / "cgroup").write_text(cgroup)
    folders = machine_cgroups("ct200-abc", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    expected = ([named / "ci" / "dflash-lab" / "ct200-abc"] if hybrid else []) + [unified / "ci/dflash-lab/ct200-abc"]
    assert folders == expected and all(f.is_dir() for f in folders)
    argv = join_cgroups(folders, ["systemd-nspawn", "-D", "/x y"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["sh", "systemd-nspawn", "-D", "/x y"]
    # The shell joins every cgroup and then execs the command as the same process.
    out = subprocess.run([*argv[:4], "sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout
    assert [f"{out.strip()}\n"] * len(folders) == [(f / "cgroup.procs").read_text() for f in folders]
