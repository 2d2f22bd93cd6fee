"""The proxmox_guest role against the lab: the node stand-in pve1 and its Proxmox VE API stand-in (lab/pve/api.py,
started by `lab up`), whose snapshots are copies of the lab containers' disks.

- ct129 in its incident state: playbooks/align_driver.yml --check lists the downgrades and changes nothing;
  snapshotted by playbooks/proxmox_snapshot.yml (--check, refused while stopped, then
  started by the play), a change made after it; deploy_dflash.yml with dflash_proxmox_guard: identified from /proc
  (nvidia-smi cannot run), a snapshot taken right before the apt transaction, the driver aligned, held and pinned
  (tests/lab/playbooks/verify_aligned.yml) and the plan served, a second run and a --check run change nothing;
  then playbooks/rollback.yml -e dflash_rollback=container back to the first snapshot: the change and the deploy
  are gone, the mismatch is back and ct129 runs.
- playbooks/proxmox_audit.yml with a stale nvidia-uvm major injected into pve1:/etc/pve/lxc/200.conf: reported
  with its diff under --check (nothing changes), fixed by a real run, and a second run changes nothing.

    .venv/bin/pytest -m lab tests/lab/test_proxmox_lab.py      # as root
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, LabHandle

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
MARKER = "/root/changed-after-the-snapshot"


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    # JSON results keep each message on one line (the YAML format folds long ones).
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def run_playbook(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A playbook of the repository against the lab inventory, as an operator runs it."""
    return subprocess.run([str(BIN / "ansible-playbook"), path, "-i", "inventory/lab", *args],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True)


def playbook(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_playbook(f"playbooks/{name}", *args)


def deploy(*args: str) -> subprocess.CompletedProcess[str]:
    """deploy_dflash.yml against the lab, as an operator runs it."""
    return run_playbook("deploy_dflash.yml", *args)


def recap(stdout: str, host: str) -> dict[str, int]:
    match = re.search(rf"^{host}\s+:\s+(.*)$", stdout, re.MULTILINE)
    assert match, f"no PLAY RECAP line for {host}:\n{stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


@pytest.fixture(scope="module")
def pve(lab: LabHandle) -> Any:
    """A client of the lab's API stand-in, with its CA and token (what the lab inventory reads)."""
    daemons = {d["name"]: d for d in json.loads(lab.cli("status", "--json").stdout).get("daemons", [])}
    assert daemons.get("pve-api", {}).get("ready"), f"`lab up` should run the API stand-in: {daemons}"
    return lab.pve_node()


def wait(pve: Any, upid: str) -> None:
    """Poll the task until it stops (the stand-in's tasks end by themselves) and require OK."""
    status = pve.tasks(upid).status.get()
    while status["status"] != "stopped":
        time.sleep(0.2)
        status = pve.tasks(upid).status.get()
    assert status["exitstatus"] == "OK", status


@pytest.fixture
def records(tmp_path: Path) -> Iterator[list[str]]:
    """-e for a snapshot record folder of this test (the operator's own records stay untouched)."""
    yield ["-e", f"proxmox_guest_record_dir={tmp_path / 'records'}"]


def test_the_deploy_identifies_aligns_and_serves_the_incident_and_the_rollback_restores_it(
        lab: LabHandle, pve: Any, records: list[str]) -> None:
    # ct129 in its initial state: user space 580.159.03 over kernel module 580.126.09, nvidia-smi in mismatch.
    lab.cli_ok("reset", "ct129")
    assert lab.ssh("ct129", "nvidia-smi").returncode == 18
    # The alignment stage under --check lists the downgrades to the kernel module's version and changes nothing.
    dpkg = "sha256sum /var/lib/dpkg/status; dpkg --get-selections | sha256sum; ls -1 /etc/apt/preferences.d"
    dpkg_before = lab.ssh("ct129", dpkg).stdout
    listed = playbook("align_driver.yml", "-l", "eval", "--check")
    assert listed.returncode == 0, listed.stdout[-4000:] + listed.stderr
    assert "would change 13 package(s) in one apt transaction" in listed.stdout
    for package in ("libnvidia-compute-580", "nvidia-utils-580", "nvidia-kernel-common-580"):
        assert re.search(rf"{package} 580\.159\.03-0ubuntu0\.24\.04\.1 -> 580\.126\.09-0ubuntu0\.24\.04\.1\s+"
                         rf"\(downgrade", listed.stdout), package
    assert "nvidia-firmware-580-580.126.09 (not installed) -> 580.126.09-0ubuntu0.24.04.1" in listed.stdout
    assert lab.ssh("ct129", dpkg).stdout == dpkg_before
    assert lab.ssh("ct129", "nvidia-smi").returncode == 18
    ct129 = pve.lxc(129)
    snapshot = ("-l", "eval", "-e", "proxmox_guest_stage=align", *records)
    guarded = ("-l", "eval", "-e", "dflash_proxmox_guard=true", *records)
    try:
        # First the incident snapshotted on its own (playbooks/proxmox_snapshot.yml), and a change made after it.
        before = [s["name"] for s in ct129.snapshot.get()]
        dry = playbook("proxmox_snapshot.yml", *snapshot, "--check")
        assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr
        assert re.search(r"Snapshot dflash-align-\d{8}-\d{6} would be created", dry.stdout)
        assert [s["name"] for s in ct129.snapshot.get()] == before
        # A stopped container stops the play unless the play may start it.
        wait(pve, ct129.status.shutdown.post())
        refused = playbook("proxmox_snapshot.yml", *snapshot)
        assert refused.returncode != 0
        assert "expected a running container, found it stopped" in refused.stdout
        assert "-e proxmox_guest_start_stopped=true" in refused.stdout
        taken = playbook("proxmox_snapshot.yml", *snapshot, "-e", "proxmox_guest_start_stopped=true")
        assert taken.returncode == 0, taken.stdout[-4000:] + taken.stderr
        assert ct129.status.current.get()["status"] == "running"
        incident = re.search(r"Snapshot (dflash-align-\d{8}-\d{6}) created", taken.stdout)[1]
        assert incident in [s["name"] for s in ct129.snapshot.get()]
        record = json.loads(next(Path(records[1].split("=", 1)[1]).glob("*-129.json")).read_text())
        assert (record["name"], record["stage"], record["vmid"]) == (incident, "align", 129)
        assert lab.ssh("ct129", f"echo changed > {MARKER}").returncode == 0
        check_back = playbook("rollback.yml", "-l", "eval", "-e", "dflash_rollback=container", "--check", *records)
        assert check_back.returncode == 0, check_back.stdout[-4000:] + check_back.stderr
        assert f"would roll back to {incident} (recorded by the last snapshot play)" in check_back.stdout
        assert lab.ssh("ct129", f"test -e {MARKER}").returncode == 0

        # The one deploy command checks it against group eval from /proc/driver/nvidia/gpus (NVML cannot start),
        # snapshots it right before the apt transaction, aligns it and serves the plan on its two A6000s.
        started = time.monotonic()
        first = deploy(*guarded)
        first_s = time.monotonic() - started
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr
        assert "ct129 has 2x NVIDIA RTX A6000 as group eval expects (/proc/driver/nvidia/gpus)" in first.stdout
        name = re.search(r"Snapshot (dflash-align-\d{8}-\d{6}) created", first.stdout)[1]
        # The snapshot comes after the plan and before the transaction; another one before the engine install.
        assert first.stdout.index(name) < first.stdout.index("Install the user-space set at the kernel module")
        engine = re.search(r"Snapshot (dflash-engine-upgrade-\d{8}-\d{6}) created", first.stdout)[1]
        smi = lab.ssh("ct129", "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        assert smi.returncode == 0 and smi.stdout.split() == ["580.126.09", "580.126.09"]
        record = json.loads(lab.ssh("ct129", "cat /var/lib/dflash-infra/deployment.json").stdout)
        assert record["gates"]["state"] == "ready" and record["plan"]["tp_size"] == 2
        assert record["driver"] == {"kernel_module": "580.126.09", "user_space": "580.126.09"}
        # Aligned, held and pinned: the set's versions and holds, the pin and apt's policy 1001, the
        # unattended-upgrades blacklist, no trap package, dpkg --audit clean, the libraries on the kernel module.
        aligned = run_playbook("tests/lab/playbooks/verify_aligned.yml", "-l", "eval")
        assert aligned.returncode == 0 and recap(aligned.stdout, "ct129")["failed"] == 0, aligned.stdout[-4000:]
        # Converged: a second run and a --check run change nothing and take no snapshot.
        started = time.monotonic()
        again = deploy(*guarded)
        again_s = time.monotonic() - started
        assert again.returncode == 0 and recap(again.stdout, "ct129")["changed"] == 0, again.stdout[-3000:]
        check = deploy(*guarded, "--check")
        assert check.returncode == 0 and recap(check.stdout, "ct129")["changed"] == 0, check.stdout[-3000:]
        ours = sorted(s["name"] for s in ct129.snapshot.get() if s["name"].startswith("dflash-"))
        assert ours == sorted([incident, name, engine])
        print(f"deploy of the incident (guard on): {first_s:.1f} s; no-op re-run: {again_s:.1f} s")

        # Back to the snapshot of the incident: the change made after it and the deploy's holds are gone, the
        # mismatch is back, and the container runs.
        back = playbook("rollback.yml", "-l", "eval", "-e", "dflash_rollback=container",
                        "-e", f"proxmox_guest_rollback_to={incident}", *records)
        assert back.returncode == 0, back.stdout[-4000:] + back.stderr
        assert f"Snapshot {incident} rolled back" in back.stdout
        assert ct129.status.current.get()["status"] == "running"
        after = lab.ssh("ct129", f"test -e {MARKER}; echo $?; apt-mark showhold")
        assert after.stdout.split("\n")[0] == "1" and "nvidia-utils-580" not in after.stdout, after.stdout
        assert lab.ssh("ct129", "systemctl is-system-running").stdout.strip() in ("running", "degraded")
        smi = lab.ssh("ct129", "nvidia-smi")
        assert smi.returncode == 18 and "Driver/library version mismatch" in smi.stdout + smi.stderr
        secret = lab.pve_token()["value"]
        runs = (dry, refused, taken, check_back, first, again, check, back)
        assert all(secret not in p.stdout + p.stderr for p in runs)
    finally:
        if ct129.status.current.get()["status"] != "running":
            wait(pve, ct129.status.start.post())
        for snap in ct129.snapshot.get():
            if snap["name"].startswith(("dflash-align-", "dflash-engine-upgrade-")):
                wait(pve, ct129.snapshot(snap["name"]).delete())
        lab.ssh("ct129", f"rm -f {MARKER}")


@pytest.fixture
def conf_200(lab: LabHandle) -> Iterator[Path]:
    """pve1:/etc/pve/lxc/200.conf on the lab host; put back as it was afterwards."""
    path = lab.paths.state / "pve" / "etc-pve" / "lxc" / "200.conf"
    original = path.read_text()
    yield path
    path.write_text(original)


def test_audit_finds_the_injected_uvm_drift_and_fixes_it(conf_200: Path) -> None:
    good = conf_200.read_text()
    assert "lxc.cgroup2.devices.allow: c 238:* rwm\n" in good  # the node's nvidia-uvm major (H200 capture)
    drifted = good.replace("c 238:* rwm", "c 511:* rwm")
    conf_200.write_text(drifted)

    check = playbook("proxmox_audit.yml", "-l", "pro6000", "--check", "--diff",
                     "-e", "proxmox_guest_fix_passthrough=true")
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr
    assert "NVIDIA passthrough drifted from pve1 (nvidia-uvm is 238" in check.stdout
    assert "-lxc.cgroup2.devices.allow: c 511:* rwm" in check.stdout
    assert "+lxc.cgroup2.devices.allow: c 238:* rwm" in check.stdout
    assert conf_200.read_text() == drifted

    fix = playbook("proxmox_audit.yml", "-l", "pro6000", "-e", "proxmox_guest_fix_passthrough=true")
    assert fix.returncode == 0, fix.stdout[-4000:] + fix.stderr
    assert recap(fix.stdout, "ct200")["changed"] >= 1
    assert conf_200.read_text() == good
    assert "the fixed passthrough applies when the container starts again" in fix.stdout

    again = playbook("proxmox_audit.yml", "-l", "pro6000", "-e", "proxmox_guest_fix_passthrough=true")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr
    assert recap(again.stdout, "ct200")["changed"] == 0
    assert "NVIDIA passthrough matches pve1 (nvidia 195, nvidia-uvm 238, GPUs 0-7)" in again.stdout
