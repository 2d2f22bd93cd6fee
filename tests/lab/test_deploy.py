"""deploy_dflash.yml end to end in the lab, through ansible-runner (a fresh private_data_dir per run): group pro6000
serves through the SGLang Model Gateway, so ct200 runs the real smg in front of four engine stand-ins (tp 2 each).

Order matters and is the operator's: a dry run on a fresh lab, the deploy, the no-op re-run, the dry run on
the converged lab, then the fault matrix at deploy level: wrong hardware, a stray server on the engine port,
a kernel module whose user space is not in the apt cache, an interrupted dpkg run; a re-run the production way
through the Proxmox node (pct, API checks; a no-op takes no snapshot); last, a container stopped mid-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import ansible_runner
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash_infra import locks
from helpers import BIN, ROOT, ansible_environment

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab

# ct200's replicas (one engine unit per GPU pair) and the first one's own record: what a one-unit host keeps in
# /var/lib/dflash-infra/deployment.json, each replica keeps in its own state folder.
REPLICAS = [f"sglang-qwen-r{i}.service" for i in range(4)]
R0 = REPLICAS[0]
R0_RECORD = "/var/lib/dflash-infra/sglang-qwen-r0/deployment.json"
GATEWAY = "smg-gateway.service"


def runner_args(tmp_path: Path, *cmdline: str, extravars: dict | None = None, env: dict | None = None) -> dict:
    private = tmp_path / f"runner-{len(list(tmp_path.iterdir()))}"
    private.mkdir()
    return dict(
        private_data_dir=str(private), project_dir=str(ROOT), playbook="deploy_dflash.yml",
        inventory=str(ROOT / "inventory" / "lab"), limit="pro6000", cmdline=" ".join(cmdline) or None,
        extravars=extravars or {}, quiet=True, rotate_artifacts=1,
        envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                 "ANSIBLE_NOCOLOR": "1", **(env or {})})


def deploy(tmp_path: Path, *cmdline: str, extravars: dict | None = None) -> ansible_runner.Runner:
    return ansible_runner.run(**runner_args(tmp_path, *cmdline, extravars=extravars))


def changed(runner: ansible_runner.Runner) -> int:
    return (runner.stats or {}).get("changed", {}).get("ct200", 0)


def stdout(runner: ansible_runner.Runner) -> str:
    return runner.stdout.read()


@pytest.fixture(scope="module")
def fresh_lab(lab: LabHandle) -> LabHandle:
    lab.cli_ok("reset", "ct200", "ct129")
    return lab


def test_check_on_a_fresh_lab_finishes_and_changes_nothing(fresh_lab: LabHandle, tmp_path: Path) -> None:
    before = fresh_lab.changeable_state()
    runner = deploy(tmp_path, "--check", "--diff")
    out = stdout(runner)
    assert runner.rc == 0, out[-5000:]
    assert "would stop 1 process(es)" in out and "check mode: nothing was changed" in out
    assert fresh_lab.changeable_state() == before


def test_deploy_on_a_fresh_lab_passes_every_gate(fresh_lab: LabHandle, tmp_path: Path) -> None:
    runner = deploy(tmp_path)
    out = stdout(runner)
    assert runner.rc == 0, out[-5000:]
    ct200 = fresh_lab.addresses["ct200"]
    folded = " ".join(out.split())  # the callback folds long messages
    assert f"serving: http://{ct200}:30000/v1 (Qwen3.6-27B) through {GATEWAY}, 4 replica(s)" in folded, out[-3000:]
    assert "ct200: synced models pass the DFlash checks; weights for the plan: " in folded, out[-3000:]
    for i in range(4):
        assert (f"replica {i}: sglang-qwen-r{i}.service on GPUs {2 * i},{2 * i + 1} at http://{ct200}:{30001 + i}, "
                "started; gates ready") in folded, out[-3000:]
    record = json.loads(fresh_lab.ssh("ct200", "cat", R0_RECORD).stdout)
    assert record["engine"]["version"] == "0.5.23+lab" and record["plan"]["tp_size"] == 2
    assert record["plan"]["gpu_ids"] == [0, 1] and "--dp-size" not in record["args"]
    unit = fresh_lab.ssh("ct200", "systemctl", "show", R0, "-p", "ExecStart").stdout
    for flag in record["args"]:
        assert flag in unit
    with urllib.request.urlopen(f"http://{ct200}:30000/v1/models", timeout=10) as response:
        models = json.load(response)
    assert [m["id"] for m in models["data"]] == ["Qwen3.6-27B"]
    assert "train.py" not in fresh_lab.ssh("ct200", "pgrep", "-af", "train.py").stdout
    # The record names the very manifests the source has (its manifest cache on ct129) for both models.
    for role, name in (("target", "Qwen3.6-27B"), ("draft", "Qwen3.6-27B-DFlash")):
        source = json.loads(fresh_lab.ssh("ct129", "cat", f"/var/cache/dflash-infra/manifests/{name}.json").stdout)
        version = f"/root/models/.dflash-versions/{name}/{source['manifest_sha256'][:16]}"
        assert record["models"][role] == {"path": version, "manifest_sha256": source["manifest_sha256"]}
        # The engine loads that version folder; the model's path is a link to it, switched after the gates.
        assert f"--{'model-path' if role == 'target' else 'speculative-draft-model-path'} {version}" in \
            " ".join(record["args"])
        assert fresh_lab.ssh("ct200", "readlink", "-f", f"/root/models/{name}").stdout.strip() == version
    # ... and the unit names them too, with the driver it runs on (a change of either restarts the engine).
    unit_file = fresh_lab.ssh("ct200", "cat", f"/etc/systemd/system/{R0}").stdout
    assert f"manifest {record['models']['target']['manifest_sha256']}" in unit_file
    assert "NVIDIA user space 595.71.05 on kernel module 595.71.05" in unit_file


def test_second_run_changes_nothing(fresh_lab: LabHandle, tmp_path: Path) -> None:
    runner = deploy(tmp_path)
    assert runner.rc == 0, stdout(runner)[-5000:]
    assert changed(runner) == 0


def test_check_on_the_converged_lab_reports_no_change(fresh_lab: LabHandle, tmp_path: Path) -> None:
    runner = deploy(tmp_path, "--check", "--diff")
    assert runner.rc == 0, stdout(runner)[-5000:]
    assert changed(runner) == 0


@pytest.mark.parametrize("stage", ["plan", "stop_training", "align_driver", "sync_models", "serve"])
def test_each_stage_alone_agrees_with_the_deploy(fresh_lab: LabHandle, tmp_path: Path, stage: str) -> None:
    # One plan whatever the entry point: after the full deploy, every stage playbook run on its own plans what
    # the deploy planned (from what the host has) and finds nothing to change.
    before = json.loads(fresh_lab.ssh("ct200", "cat", R0_RECORD).stdout)
    runner = ansible_runner.run(**{**runner_args(tmp_path), "playbook": f"playbooks/{stage}.yml"})
    out = stdout(runner)
    assert runner.rc == 0, out[-5000:]
    assert changed(runner) == 0, out[-5000:]
    after = json.loads(fresh_lab.ssh("ct200", "cat", R0_RECORD).stdout)
    assert after == before


def changed_tasks(runner: ansible_runner.Runner) -> list[str]:
    """The names of the tasks that reported a change (each once, in the order they ran)."""
    names: list[str] = []
    for event in runner.events:
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_item_on_ok") and (data.get("res") or {}).get("changed"):
            name = str(data.get("task", ""))
            if name not in names:
                names.append(name)
    return names


# A wheel the engine's lock does not list, from the lab's gateway wheelhouse (make lab-wheels), put in /tmp/<HAND>/.
HAND = "typing_extensions"

# Drift on a converged host, one thing at a time: the next deploy repairs exactly that and reports changed for
# exactly the tasks that repair it (a restart follows a changed unit or model: the engine holds them open).
DRIFTS = {
    # One replica's unit: only that replica leaves the gateway, restarts and comes back; the others serve; then the
    # load gate through the gateway (compared with the first deploy's figures there).
    "a byte of a replica's unit": (
        f"sed -i 's/^RestartSec=10$/RestartSec=11/' /etc/systemd/system/{R0} && systemctl daemon-reload",
        [f"Take the replica out of the gateway (requests finish), {R0}",
         "Back up the unit and environment file that are about to be replaced",
         f"Write the unit, validated with systemd-analyze verify, {R0}",
         "Restart the engine now when the unit or its inputs changed",
         "Snapshot the gated unit and environment file as last-good and write the record",
         f"Put the replica back into the gateway, {R0}",
         # A replica restarted: the endpoint is proven through the gateway after the rollout, its figures recorded.
         "Record the figures through the gateway (the next deploy compares with them)"]),
    "a package hold": ("apt-mark unhold libnvidia-compute-595 >/dev/null",
                       ["Hold every package of the user-space set (installing clears holds)"]),
    "the pin file": ("echo '# drift' >> /etc/apt/preferences.d/dflash-nvidia-userspace.pref",
                     ["Pin the user-space set to the kernel module's version"]),
    "a model file's size": ("truncate -s -1 /root/models/Qwen3.6-27B-DFlash/model.safetensors",
                            ["Copy, verify and move the models into place"]),
    "the training job started again": ("systemctl start lab-training-autostart.service",
                                       ["Stop the training job and wait until the GPUs the plan needs are free"]),
    # Someone pip-installs a package into the engine's venv by hand (a wheel copied in: the lab has no PyPI).
    "a package pip-installed into the engine's venv": (
        f"cd /tmp/{HAND} && /opt/sglang/venv/bin/pip install -q --no-index ./*.whl",
        ["Remove the distributions the lock does not list"]),
    # A package of the gateway's lock removed by hand: put back from the lock (hashes required), no restart.
    "a package uninstalled from the gateway's venv": (
        "/opt/smg/venv/bin/python -m pip uninstall -q -y setproctitle",
        ["Put the lock on the host for pip", "Install the locked distributions, hashes required",
         "Keep the lock the venv now holds (the one pip installed from)"]),
}


@pytest.mark.parametrize("drift", list(DRIFTS))
def test_drift_on_a_converged_host_is_repaired_exactly(fresh_lab: LabHandle, tmp_path: Path, drift: str) -> None:
    command, repairs = DRIFTS[drift]
    hand = sorted((fresh_lab.paths.state / "gateway-wheels").glob(f"{HAND}-*.whl"))[-1] if HAND in command else None
    if hand:
        assert fresh_lab.ssh("ct200", "mkdir", "-p", f"/tmp/{HAND}").returncode == 0
        fresh_lab.put("ct200", hand, f"/tmp/{HAND}/{hand.name}")
    made = fresh_lab.ssh("ct200", "sh", "-c", shlex.quote(command))
    assert made.returncode == 0, made.stderr
    runner = deploy(tmp_path)
    out = stdout(runner)
    assert runner.rc == 0, out[-5000:]
    repaired = changed_tasks(runner)
    assert repaired == repairs, f"changed: {repaired}\n{out[-3000:]}"
    if drift == "a byte of a replica's unit":  # its load gate compared with its previous deployment's figures
        flat = " ".join(out.split())
        assert re.search(r"load gate: concurrency 32: 32 requests, 0 failed, [0-9.]+ tok/s, [0-9.]+ req/s, "
                         r"acceptance [0-9.]+ over 32 requests \(previous deployment: [0-9.]+ tok/s, acceptance "
                         r"[0-9.]+\)", flat), flat[-3000:]
        # Through the gateway, at the endpoint's capacity (4 x 32), against the first deploy's figures there.
        assert re.search(r"ct200: load gate through smg-gateway\.service: concurrency 128: 128 requests, 0 failed, "
                         r"[0-9.]+ tok/s, [0-9.]+ req/s, acceptance [0-9.]+ over \d+ requests \(previous deployment: "
                         r"[0-9.]+ tok/s", flat), flat[-3000:]
        assert "through the gateway, load at concurrency 128: 128 requests, 0 failed" in flat, flat[-3000:]
    if "gateway" in drift:
        assert "+ setproctitle 1.3.8 (missing)" in out, out[-3000:]
        assert "setproctitle" in fresh_lab.ssh("ct200", "/opt/smg/venv/bin/python", "-m", "pip", "list").stdout
    if hand:  # reported by name and version, and gone
        assert f"- typing-extensions {hand.name.split('-')[1]} (not in the lock)" in out, out[-3000:]
        left = fresh_lab.ssh("ct200", "/opt/sglang/venv/bin/python", "-m", "pip", "list", "--format=freeze")
        assert left.returncode == 0 and "typing" not in left.stdout.lower(), left.stdout


def test_after_the_drifts_the_host_is_converged(fresh_lab: LabHandle, tmp_path: Path) -> None:
    runner = deploy(tmp_path)
    assert runner.rc == 0 and changed(runner) == 0, stdout(runner)[-5000:]
    # The record names the lock the engine's venv holds, and the host keeps that very lock.
    record = json.loads(fresh_lab.ssh("ct200", "cat", R0_RECORD).stdout)
    lock = ROOT / "locks" / record["engine"]["lock"]["file"]
    assert record["engine"]["lock"]["sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert record["engine"]["packages"] == {"sglang": "0.5.23+lab"}
    copy = fresh_lab.ssh("ct200", "sha256sum", "/var/lib/dflash-infra/locks/engine.txt").stdout.split()[0]
    assert copy == record["engine"]["lock"]["sha256"]


def test_two_deploys_at_once_the_second_fails_at_once_naming_the_first(fresh_lab: LabHandle, tmp_path: Path) -> None:
    let_go = tmp_path / "let-go"
    holder = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", "inventory/lab", "-l", "ct200",
                               "tests/lab/playbooks/hold_lock.yml", "-e", f"hold_until={let_go}"],
                              cwd=ROOT, env=ansible_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        while True:  # until the first run holds ct200's lock (or has ended without it)
            lock = fresh_lab.ssh("ct200", "cat", "/run/dflash-infra/deploy.lock")
            if lock.returncode == 0 and json.loads(lock.stdout)["pid"] == holder.pid:
                break
            assert holder.poll() is None, holder.communicate()[0][-3000:]
        second = deploy(tmp_path)
        out = stdout(second)
        assert second.rc != 0 and changed(second) == 0, out[-3000:]
        assert f"ct200: another deploy holds this host: Hold the deploy lock until told to let go run by root on " \
               f"{socket.gethostname()} (pid {holder.pid}, since " in out, out[-3000:]
        check = deploy(tmp_path, "--check")
        assert check.rc == 0 and "holds the deploy lock" in stdout(check), stdout(check)[-3000:]
    finally:
        let_go.touch()
        held_out = holder.communicate(timeout=300)[0]
    assert holder.returncode == 0, held_out[-3000:]
    after = deploy(tmp_path)
    assert after.rc == 0 and changed(after) == 0, stdout(after)[-3000:]
    assert fresh_lab.ssh("ct200", "test", "!", "-e", "/run/dflash-infra/deploy.lock").returncode == 0


def test_another_controllers_lock_is_kept_while_its_heartbeat_is_fresh_and_taken_over_once_stale(
        fresh_lab: LabHandle, tmp_path: Path) -> None:
    """Two controllers: a run on another machine (whose process this controller cannot see) holds ct200's lock. While
    its heartbeat (the lock file's modification time) is fresh the deploy refuses, naming it; once the heartbeat is
    older than the stale limit (15 min) the deploy takes the lock over, saying whose it was, and goes on."""
    path = "/run/dflash-infra/deploy.lock"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    other = {"owner": "alice", "controller": "ops-laptop", "pid": 4242, "started_at": started,
             "playbook": "deploy_dflash.yml"}
    (tmp_path / "deploy.lock").write_text(json.dumps(other))
    fresh_lab.put("ct200", tmp_path / "deploy.lock", path)
    try:
        live = deploy(tmp_path)
        out = " ".join(stdout(live).split())
        assert live.rc != 0 and changed(live) == 0, out[-3000:]
        assert (f"ct200: another deploy holds this host: deploy_dflash.yml run by alice on ops-laptop (pid 4242, "
                f"since {started}), its last heartbeat ") in out, out[-3000:]
        assert json.loads(fresh_lab.ssh("ct200", "cat", path).stdout) == other  # not taken
        assert fresh_lab.ssh("ct200", "touch", "-d", f"@{int(time.time()) - 20 * 60}", path).returncode == 0
        stale = deploy(tmp_path)
        out = " ".join(stdout(stale).split())
        assert stale.rc == 0 and changed(stale) == 0, out[-3000:]
        took_over = (r"ct200: took over the deploy lock of a dead run \(its last heartbeat was 2\d min ago, more "
                     r"than 15 min\): deploy_dflash.yml run by alice on ops-laptop \(pid 4242, since "
                     + re.escape(started) + r"\)")
        assert re.search(took_over, out), out[-3000:]
        assert fresh_lab.ssh("ct200", "test", "!", "-e", path).returncode == 0  # given back by the run that took it
    finally:
        fresh_lab.ssh("ct200", "rm", "-f", path)


def test_stop_serving_hands_the_gpus_back_for_training_and_the_next_deploy_serves_again(
        fresh_lab: LabHandle, tmp_path: Path) -> None:
    """The user's way back to training after a deploy, and forward to serving again."""
    def play(name: str) -> ansible_runner.Runner:
        return ansible_runner.run(**{**runner_args(tmp_path), "playbook": f"playbooks/{name}.yml"})

    def states() -> dict[str, tuple[str, str]]:
        return {u: (fresh_lab.ssh("ct200", "systemctl", "is-active", u).stdout.strip(),
                    fresh_lab.ssh("ct200", "systemctl", "is-enabled", u).stdout.strip()) for u in [GATEWAY, *REPLICAS]}

    refused = play("resume_training")
    out = stdout(refused)
    assert refused.rc != 0 and f"held by {R0} (pids " in out, out[-3000:]
    assert "Stop the holder first (ansible-playbook playbooks/stop_serving.yml -l ct200)," in out, out[-3000:]
    stopped = play("stop_serving")
    assert stopped.rc == 0, stdout(stopped)[-3000:]
    assert set(states().values()) == {("inactive", "disabled")}, states()
    record = json.loads(fresh_lab.ssh("ct200", "cat", "/var/lib/dflash-infra/stopped-serving.json").stdout)
    assert record["units"] == [GATEWAY, *REPLICAS] and record["by"] == "playbooks/stop_serving.yml"
    again = play("stop_serving")
    assert again.rc == 0 and changed(again) == 0, stdout(again)[-3000:]
    resumed = play("resume_training")
    assert resumed.rc == 0 and "started the training job" in stdout(resumed), stdout(resumed)[-3000:]
    assert fresh_lab.ssh("ct200", "pgrep", "-f", "train.py").returncode == 0
    served = deploy(tmp_path)
    repaired = changed_tasks(served)
    assert served.rc == 0, stdout(served)[-5000:]
    assert "Stop the training job and wait until the GPUs the plan needs are free" in repaired, repaired
    assert "Forget that playbooks/stop_serving.yml stopped the engine (it serves again)" in repaired, repaired
    assert set(states().values()) == {("active", "enabled")}, states()
    assert fresh_lab.ssh("ct200", "test", "!", "-e", "/var/lib/dflash-infra/stopped-serving.json").returncode == 0
    converged = deploy(tmp_path)
    assert converged.rc == 0 and changed(converged) == 0, stdout(converged)[-3000:]


def test_wrong_hardware_is_refused_before_any_change(fresh_lab: LabHandle, tmp_path: Path) -> None:
    before = fresh_lab.changeable_state()
    eval_hardware = {"group": "eval", "gpu_name": "NVIDIA RTX A6000", "gpu_count": 2, "memory_total_mib": 49140,
                     "compute_cap": "8.6"}
    runner = deploy(tmp_path, extravars={"dflash_expected_hardware": eval_hardware})
    out = stdout(runner)
    assert runner.rc != 0
    assert ("ct200 has 8x NVIDIA RTX PRO 6000 Blackwell Workstation Edition (97887 MiB); group eval expects "
            "2x NVIDIA RTX A6000 (49140 MiB), compute capability 8.6. Refusing to deploy.") in out
    assert fresh_lab.changeable_state() == before


def test_a_model_path_one_level_too_high_is_refused_and_nothing_is_deleted(fresh_lab: LabHandle,
                                                                          tmp_path: Path) -> None:
    """A typo in dflash_models (the target's path set to the model root): another model's weights and a file of the
    team's there stay untouched; the deploy is refused before anything changes, naming the path and the rule."""
    fresh_lab.ssh("ct200", "sh", "-c", shlex.quote("mkdir -p /root/models/Other-Model && echo weights > "
                                                   "/root/models/Other-Model/model.safetensors && echo mine > "
                                                   "/root/models/notes.txt"))
    before = fresh_lab.changeable_state()
    models = yaml.safe_load((ROOT / "group_vars" / "all" / "models.yml").read_text())["dflash_models"]
    models = {role: {**m, "path": m["path"].replace("{{ dflash_model_root }}", "/root/models")}
              for role, m in models.items()}
    models["target"]["path"] = "/root/models"
    runner = deploy(tmp_path, extravars={"dflash_models": models})
    out = stdout(runner)
    assert runner.rc != 0
    assert "target.path: expected a folder under the model root /root/models, found '/root/models'" in out, out[-3000:]
    assert fresh_lab.ssh("ct200", "cat", "/root/models/Other-Model/model.safetensors", "/root/models/notes.txt"
                         ).stdout == "weights\nmine\n"
    assert fresh_lab.changeable_state() == before
    fresh_lab.ssh("ct200", "rm", "-rf", "/root/models/Other-Model", "/root/models/notes.txt")


def test_an_unmanaged_server_on_the_engine_port_is_refused(fresh_lab: LabHandle, tmp_path: Path) -> None:
    # The duplicate-server mistake: something else listens where the engine must.
    fresh_lab.ssh("ct200", "systemctl", "stop", GATEWAY)
    server = fresh_lab.ssh("ct200", "systemd-run", "--unit=stray-server", "python3", "-m", "http.server",
                           "30000", "--bind", fresh_lab.addresses["ct200"])
    assert server.returncode == 0, server.stderr
    try:
        runner = deploy(tmp_path, "--tags", "plan")
        out = stdout(runner)
        assert runner.rc != 0
        assert "port 30000 is held by python3" in out, out[-3000:]
        assert "which is not a service this deploy runs there (smg-gateway.service, sglang-qwen.service)" in out
    finally:
        fresh_lab.ssh("ct200", "systemctl", "stop", "stray-server")
        fresh_lab.ssh("ct200", "systemctl", "start", GATEWAY)


def set_kernel_module(lab: LabHandle, version: str) -> None:
    """What a host reboot into another NVIDIA kernel module looks like from ct200 (GPU simulation kit)."""
    script = ("import json, re, pathlib\n"
              "p = pathlib.Path('/etc/dflash-lab/gpu-profile.json'); d = json.loads(p.read_text())\n"
              f"old = d['kernel_module']['version']; d['kernel_module']['version'] = '{version}'\n"
              "p.write_text(json.dumps(d))\n"
              "v = pathlib.Path('/var/lib/dflash-lab/proc/driver/nvidia/version')\n"
              f"v.write_text(v.read_text().replace(old, '{version}'))\n")
    proc = lab.ssh("ct200", "python3", "-c", shlex.quote(script))
    assert proc.returncode == 0, proc.stderr


def test_a_kernel_module_without_its_user_space_debs_is_refused_before_any_change(
        fresh_lab: LabHandle, tmp_path: Path) -> None:
    before = fresh_lab.changeable_state()
    set_kernel_module(fresh_lab, "595.71.06")
    try:
        runner = deploy(tmp_path)
        out = stdout(runner)
        assert runner.rc != 0
        assert "ct200: missing:" in out and "595.71.06" in out, out[-4000:]
        assert "training_stop :" not in out and "nvidia_userspace : Install" not in out
        assert fresh_lab.changeable_state() == before
    finally:
        set_kernel_module(fresh_lab, "595.71.05")


def test_an_interrupted_dpkg_run_is_recovered_by_the_next_deploy(fresh_lab: LabHandle, tmp_path: Path) -> None:
    unpack = fresh_lab.ssh("ct200", "bash", "-c", shlex.quote(
        "cd /var/cache/apt/archives && dpkg --unpack $(ls ./*_595.71.05-*.deb "
        "| grep -v -e nvidia-dkms -e nvidia-driver -e linux-modules) && dpkg --audit"))
    assert "unpacked but not yet configured" in unpack.stdout, unpack.stdout + unpack.stderr
    runner = deploy(tmp_path)
    out = stdout(runner)
    assert runner.rc == 0, out[-5000:]
    assert "interrupted dpkg run" in out
    audit = fresh_lab.ssh("ct200", "dpkg", "--audit")
    assert audit.returncode == 0 and audit.stdout.strip() == "", audit.stdout
    assert "libnvidia-compute-595" in fresh_lab.ssh("ct200", "apt-mark", "showhold").stdout


def test_a_rerun_through_the_proxmox_node_checks_the_container_and_changes_nothing(
        fresh_lab: LabHandle, tmp_path: Path) -> None:
    # ct200 the production way: SSH to the node stand-in pve1, `pct exec 200`, the Proxmox VE API stand-in for the
    # running check and the passthrough audit. The host is converged, so the guard takes no snapshot. (The snapshots
    # before the apt transaction and before the engine install are taken by the deploy of the incident in
    # test_proxmox_lab.py, through the same API.)
    pctd_log = fresh_lab.paths.logs / "pctd.log"
    logged = pctd_log.stat().st_size if pctd_log.exists() else 0
    ct200 = fresh_lab.pve_node().lxc(200)
    snapshots = sorted(s["name"] for s in ct200.snapshot.get())
    runner = ansible_runner.run(**runner_args(
        tmp_path, "-i", str(ROOT / "inventory" / "lab-pct"),
        extravars={"proxmox_guest_record_dir": str(tmp_path / "snapshots")},
        env={"HOME": str(fresh_lab.paths.paramiko_home)}))
    out = stdout(runner)
    assert runner.rc == 0, out[-5000:]
    assert changed(runner) == 0, out[-5000:]
    assert "container: running on pve1, GPU passthrough ok" in out
    assert "exec 200" in pctd_log.read_text()[logged:]
    assert sorted(s["name"] for s in ct200.snapshot.get()) == snapshots
    assert fresh_lab.pve_token()["value"] not in out


GATEWAY_KEY = "lab-gateway-key-not-a-secret-7d2f"


def wait_healthy(urls: list[str], attempts: int = 120) -> list[str]:
    """The URLs that did not answer 200 within `attempts` tries, one second apart (engines loading after a boot)."""
    pending = list(urls)
    for _ in range(attempts):
        for url in list(pending):
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        pending.remove(url)
            except OSError:
                pass
        if not pending:
            break
        threading.Event().wait(1)
    return pending


def test_an_api_key_and_a_new_plan_roll_through_a_power_off_and_the_keys_stay_out_of_sight(
        fresh_lab: LabHandle, tmp_path: Path) -> None:
    """The endpoint's key (ansible-vault in production) and a new plan (another memory fraction: a new unit and a
    restart of every replica) given to a converged host. The running gateway takes the key first (a keyless engine
    accepts a request that carries one), then each replica takes its new unit and the key in turn (drained,
    restarted, added back through the control plane, which has its own key). ct200 powers off while r0 is starting
    on its new unit; the next run converges. A client needs the key, the control plane its own; neither key is in a
    unit, in `ps`, in the journal or in the play's output."""
    extravars = {"dflash_service_api_key": GATEWAY_KEY, "dflash_plan_overrides": {"mem_fraction_static": 0.75}}
    restarting = threading.Event()

    def watch(event: dict) -> bool:
        task = (event.get("event_data") or {}).get("task", "")
        if event.get("event") == "playbook_on_task_start" and task.startswith("Wait for the engine"):
            restarting.set()
        return True

    thread, runner = ansible_runner.run_async(**runner_args(tmp_path, extravars=extravars), event_handler=watch)
    try:
        assert restarting.wait(timeout=600), "the deploy never reached the engine's readiness gates"
        fresh_lab.cli_ok("stop", "ct200")
    finally:
        thread.join()
    assert runner.rc != 0
    interrupted = stdout(runner)
    # The gateway took the key before r0 left it: after the power-off it boots on its keyed unit.
    assert interrupted.index("Give the running gateway the endpoint's new API key first") < interrupted.index(
        "Take the replica out of the gateway (requests finish), sglang-qwen-r0.service"), interrupted[-3000:]
    fresh_lab.cli_ok("start", "ct200")
    # The power-off is orderly (systemd stops the engine first): when the failed gate's rescue still reached the host,
    # r0 went back to its last good unit; otherwise it boots on its new one. The next run starts once the boot has
    # settled and every replica answers (one still starting would be restarted without a drain).
    booted = fresh_lab.ssh("ct200", "timeout", "120", "systemctl", "is-system-running", "--wait").stdout.strip()
    assert booted in ("running", "degraded"), booted
    health = [f"http://{fresh_lab.addresses['ct200']}:{30001 + i}/health" for i in range(len(REPLICAS))]
    down = wait_healthy(health)
    r0_argv = fresh_lab.ssh("ct200", "systemctl", "cat", REPLICAS[0]).stdout.replace("\\\n", " ").split()
    r0_on_new_unit = r0_argv[r0_argv.index("--mem-fraction-static") + 1] == "0.75"
    again = deploy(tmp_path, extravars=extravars)
    out = stdout(again)
    assert again.rc == 0, out[-5000:]
    flat = " ".join(out.split())
    found = re.findall(r"replica (\d): \S+ on GPUs [\d,]+ at \S+ ([a-z ,]+?)(?:, gated again and recorded as ([^;]+))?;"
                       r" gates ready", flat)
    did = {index: action for index, action, _ in found}
    why = {index: reason for index, _, reason in found if reason}
    # Every replica on its old unit is restarted on the new one (drained first when the gateway routes to it: after
    # the boot that depends on when smg's health checks took it back); r0 on its new unit is not restarted, only
    # gated again, and says why (the engine the boot started is not the process any record names); a replica that
    # did not come back after the power-off is started.
    rolled = {"drained, restarted and added back", "restarted"}
    expected = {"0": {"unchanged"} if r0_on_new_unit else rolled, **dict.fromkeys("123", rolled)}
    expected.update({str(health.index(url)): {"started"} for url in down})
    assert sorted(did) == sorted(expected) and all(did[i] in expected[i] for i in did), (r0_on_new_unit, down, did)
    assert list(why) == (["0"] if did["0"] == "unchanged" else []), why
    assert all(re.fullmatch(r"the running engine is invocation \w+, the record names \w+ \(a rollback or systemd "
                            r"started it since\)|no deployment record names the running engine", reason)
               for reason in why.values()), why
    record = json.loads(fresh_lab.ssh("ct200", "cat", R0_RECORD).stdout)
    assert record["plan"]["mem_fraction_static"] == 0.75
    assert "--mem-fraction-static" in record["args"] and "0.75" in record["args"]
    assert record["gates"]["state"] == "ready", record["gates"]
    settled = deploy(tmp_path, extravars=extravars)
    assert settled.rc == 0 and changed(settled) == 0, stdout(settled)[-3000:]
    # The gateway from its lab lock, exactly.
    freeze = fresh_lab.ssh("ct200", "/opt/smg/venv/bin/python", "-m", "pip", "list", "--format=freeze").stdout
    lock = locks.parse((ROOT / "locks" / "smg-1.13.0-py3.11-x86_64-manylinux_2_34.txt").read_text())
    installed = dict(line.split("==") for line in freeze.split())
    assert locks.compare(installed, lock) == {"missing": [], "changed": [], "extra": []}, freeze

    url = f"http://{fresh_lab.addresses['ct200']}:30000"
    body = json.dumps({"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 8}).encode()

    def call(path: str, key: str = "", data: bytes | None = None, base: str = url) -> int:
        request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert call("/v1/chat/completions", GATEWAY_KEY, body) == 200
    assert call("/v1/chat/completions", "", body) == 401
    assert call("/generate", "", json.dumps({"text": "hi"}).encode()) == 401
    # A replica holds the same key (the gateway sends it to its workers): no way around the gateway without it.
    for port in range(30001, 30001 + len(REPLICAS)):  # every replica took the key in its turn
        replica = f"http://{fresh_lab.addresses['ct200']}:{port}"
        assert call("/v1/chat/completions", "", body, replica) == 401, replica
        assert call("/v1/chat/completions", GATEWAY_KEY, body, replica) == 200, replica
    assert call("/workers") == 401 and call("/workers", GATEWAY_KEY) == 401  # the control plane has its own key
    control = fresh_lab.ssh("ct200", "cat", "/etc/dflash-infra/smg-gateway/control-plane-key").stdout.strip()
    assert len(control) >= 40 and call("/workers", control) == 200
    modes = fresh_lab.ssh("ct200", "stat -c '%a %U' /etc/dflash-infra/smg-gateway /etc/dflash-infra/smg-gateway/"
                          "api-key /etc/dflash-infra/smg-gateway/control-plane-key").stdout.split("\n")
    assert [m for m in modes if m] == ["700 root", "600 root", "600 root"], modes
    seen = {"units": fresh_lab.ssh("ct200", "systemctl", "cat", GATEWAY, *REPLICAS).stdout,
            "ps": fresh_lab.ssh("ct200", "ps", "-ww", "-eo", "user,args").stdout,
            "journal": fresh_lab.ssh("ct200", "journalctl", "-u", GATEWAY, *[f"-u{u}" for u in REPLICAS],
                                     "--no-pager").stdout,
            "play": out + stdout(again)}
    assert "smg::router" in seen["ps"] and "LoadCredential=control-plane-key:" in seen["units"]
    for where, text in seen.items():
        assert GATEWAY_KEY not in text and control not in text, f"a key is in the {where}"
    for where, text in (("interrupted run's output", interrupted), ("output", out), ("no-op run's output",
                                                                                     stdout(settled))):
        assert GATEWAY_KEY not in text and control not in text, f"a key is in the {where}"




def test_a_key_rotated_in_a_run_whose_gate_fails_holds_on_every_replica_and_the_gateway(
        fresh_lab: LabHandle, tmp_path: Path) -> None:
    """The endpoint's key rotated (GATEWAY_KEY -> ROTATED) in a run whose load gate through the gateway fails (the
    previous figures through it written a hundred times faster): the gateway takes the new key first, every replica
    takes it in its turn, the failed gate puts each restarted replica back on its last good unit, and the key of this
    run stays in force, said by the play: the old key is refused (401) through the gateway and on every replica, the
    new one served. A revoked key never comes back with a rollback."""
    rotated = "lab-rotated-key-not-a-secret-51c9e0a4"
    extravars = {"dflash_service_api_key": rotated, "dflash_plan_overrides": {"mem_fraction_static": 0.75}}
    gateway_load = "/var/lib/dflash-infra/smg-gateway.load.json"
    recorded = fresh_lab.ssh("ct200", "cat", gateway_load).stdout
    first = json.loads(recorded)["load"]
    faster = {"recorded_at": "2026-12-01T00:00:00Z", "load": {**first, "figures": [
        {**row, "output_tokens_per_s": row["output_tokens_per_s"] * 100} for row in first["figures"]]}}
    (tmp_path / "faster.json").write_text(json.dumps(faster))
    (tmp_path / "recorded.json").write_text(recorded)
    fresh_lab.put("ct200", tmp_path / "faster.json", gateway_load)
    try:
        failed = deploy(tmp_path, extravars=extravars)
    finally:
        fresh_lab.put("ct200", tmp_path / "recorded.json", gateway_load)
    out = " ".join(stdout(failed).split())
    assert failed.rc != 0, out[-3000:]
    assert "ct200: the endpoint failed the load gate through smg-gateway.service (figures: " in out, out[-5000:]
    assert "the API key of this run stays in force" in out, out[-5000:]
    assert rotated not in stdout(failed) and GATEWAY_KEY not in stdout(failed)
    body = json.dumps({"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 8}).encode()

    def status_of(base: str, key: str) -> int:
        request = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    address = fresh_lab.addresses["ct200"]
    for base in [f"http://{address}:30000"] + [f"http://{address}:{30001 + i}" for i in range(len(REPLICAS))]:
        assert (status_of(base, rotated), status_of(base, GATEWAY_KEY)) == (200, 401), base
    healed = deploy(tmp_path, extravars=extravars)
    assert healed.rc == 0, stdout(healed)[-5000:]
