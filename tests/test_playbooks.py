"""Playbook wiring: top-level group_vars apply everywhere, offline planning contacts no host, filters load."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from helpers import ROOT, run, tool

sys.path.insert(0, str(ROOT / "filter_plugins"))
import dflash as dflash_filters


def playbook(env, *args: str):
    return run([tool("ansible-playbook"), *args], env=env)


def test_group_vars_apply_to_the_plan_playbook(ansible_env) -> None:
    # The plan needs dflash_engine (group_vars/all) and dflash_expected_hardware (group_vars/pro6000): the play
    # fails on an undefined variable if the entry point misses the top-level group_vars.
    proc = playbook(ansible_env, "playbooks/plan.yml", "-l", "pro6000", "-e", "dflash_plan_offline=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sglang 0.5.23" in proc.stdout
    assert "tp_size                 2" in proc.stdout and "ok=" in proc.stdout


@pytest.mark.parametrize("entry", ["deploy_dflash.yml", "playbooks/serve.yml", "playbooks/stop_training.yml"])
def test_runs_that_work_on_the_host_refuse_an_offline_plan_with_the_group_vars_values(ansible_env, entry: str) -> None:
    # The refusal names the engine pin (group_vars/all) and the group's hardware (group_vars/pro6000), which
    # proves those files apply to this entry point, before any host is contacted.
    proc = playbook(ansible_env, entry, "-l", "pro6000", "-e", "dflash_plan_offline=true")
    assert proc.returncode != 0
    assert ("dflash_plan_offline=true plans sglang 0.5.23 on group pro6000's expected hardware (8x NVIDIA RTX PRO "
            "6000 Blackwell) without contacting the host") in proc.stdout, proc.stdout[-3000:]
    assert "UNREACHABLE" not in proc.stdout


def test_offline_plan_contacts_no_host(ansible_env) -> None:
    # The production inventory's host names do not resolve here: any connection attempt would be
    # reported as UNREACHABLE. The offline plan finishes with the table instead, also under --check.
    proc = playbook(ansible_env, "playbooks/plan.yml", "-l", "pro6000", "-e", "dflash_plan_offline=true", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unreachable=0" in proc.stdout and "UNREACHABLE" not in proc.stdout
    assert "smallest TP valid for both models" in proc.stdout


def test_offline_plan_for_eval_is_tp2(ansible_env) -> None:
    proc = playbook(ansible_env, "playbooks/plan.yml", "-l", "eval", "-e", "dflash_plan_offline=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tp_size                 2" in proc.stdout


def test_plan_errors_stop_the_play(ansible_env) -> None:
    proc = playbook(ansible_env, "playbooks/plan.yml", "-l", "pro6000", "-e", "dflash_plan_offline=true",
                    "-e", '{"dflash_plan_overrides": {"tp_size": 3}}')
    assert proc.returncode != 0
    assert "the plan has errors, nothing was changed" in proc.stdout
    assert "tp 3" in proc.stdout


def test_production_inventory_has_no_ip_literals() -> None:
    import re
    for path in (ROOT / "inventory" / "production").rglob("*.yml"):
        assert not re.search(r"\b\d{1,3}(\.\d{1,3}){3}\b", path.read_text()), path


def test_filters_are_thin_adapters() -> None:
    filters = dflash_filters.FilterModule().filters()
    hw = {"group": "eval", "gpu_name": "NVIDIA RTX A6000", "gpu_count": 2, "memory_total_mib": 49140,
          "compute_cap": "8.6"}
    gpus = filters["dflash_plan_gpus"]({}, hw)  # an offline plan: the group's hardware
    assert [g["index"] for g in gpus] == [0, 1]
    assert filters["dflash_identity_problems"]({"source": "nvidia-smi", "gpus": gpus}, "ct129", hw) == []
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="expected"):
        filters["dflash_plan_gpus"]({}, {"gpu_name": "NVIDIA RTX A6000"})


@pytest.mark.parametrize("entry", ["sync_models.yml", "stop_training.yml", "resume_training.yml"])
def test_stage_playbooks_pass_no_role_variables(entry: str) -> None:
    import yaml
    for play in yaml.safe_load((ROOT / "playbooks" / entry).read_text()):
        assert "vars" not in play and play.get("tags")
        steps = play.get("roles", []) + play.get("tasks", [])
        # The block that holds the changes after the deploy lock (its `always` gives the lock back): its steps.
        steps = [inner for step in steps for inner in (step.get("block", []) + step.get("always", [])
                                                        if "block" in step else [step])]
        assert steps and all("vars" not in step for step in steps)
        assert all(set(step) <= {"role", "name", "ansible.builtin.import_role", "ansible.builtin.include_role",
                                 "ansible.builtin.import_tasks"} for step in steps)


def test_a_host_joins_another_hosts_endpoint_with_one_inventory_variable(ansible_env, tmp_path) -> None:
    """The production inventory plus a second PRO 6000 box, ct201, whose group names ct200 as its gateway host:
    planned offline (no host contacted), ct201's replica listens on every interface and is reached by the
    inventory's name; ct200's own replicas stay on loopback."""
    import shutil

    import yaml

    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "production", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["proxmox_containers"]["children"]["pro6000_pair"] = {"hosts": {"ct201": {
        "dflash_ssh_host": "ct201.internal", "proxmox_vmid": 201, "proxmox_node": "pve1"}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    (inventory / "group_vars" / "pro6000_pair.yml").write_text(yaml.safe_dump({
        "dflash_gateway_host": "ct200", "dflash_serve_through_gateway": True,
        "dflash_expected_hardware": {"group": "pro6000_pair", "gpu_name": "NVIDIA RTX PRO 6000 Blackwell",
                                     "gpu_count": 2, "memory_total_mib": 97887, "compute_cap": "12.0"}}))
    proc = playbook(ansible_env, "-i", str(inventory), "playbooks/plan.yml", "-l", "ct200,ct201",
                    "-e", "dflash_plan_offline=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replica 3: GPUs 6,7 at http://127.0.0.1:30004" in proc.stdout  # ct200's, on loopback
    assert "replica 0: GPUs 0,1 at http://ct201.internal:30001" in proc.stdout
    assert "--host 0.0.0.0 --port 30001" in proc.stdout and "UNREACHABLE" not in proc.stdout  # ct201's replica


def _takes_the_lock(task: dict) -> bool:
    return str(task.get("ansible.builtin.import_tasks", "")).endswith("tasks/lock.yml")


LOCKING = sorted(p.relative_to(ROOT).as_posix()
                 for p in [ROOT / "deploy_dflash.yml", *(ROOT / "playbooks").glob("*.yml")]
                 if "tasks/lock.yml" in p.read_text())


def test_every_playbook_that_changes_a_container_takes_the_deploy_lock() -> None:
    assert {"deploy_dflash.yml", "playbooks/canary.yml", "playbooks/rollback.yml", "playbooks/serve.yml",
            "playbooks/stop_serving.yml", "playbooks/proxmox_snapshot.yml", "playbooks/proxmox_audit.yml"} \
        <= set(LOCKING), LOCKING


@pytest.mark.parametrize("entry", LOCKING)
def test_a_playbook_that_takes_the_deploy_lock_gives_it_back_failed_or_not(entry: str) -> None:
    """Everything after the lock runs in one block whose `always` gives it back (tasks/unlock.yml): a failed run
    leaves no lock behind for the next one, from any controller, to wait out."""
    plays = [play for play in yaml.safe_load((ROOT / entry).read_text()) if any(map(_takes_the_lock, play["tasks"]))]
    assert plays, entry
    for play in plays:
        tasks = play["tasks"]
        after = tasks[next(i for i, t in enumerate(tasks) if _takes_the_lock(t)) + 1:]
        assert len(after) == 1 and "block" in after[0], f"{entry}: after the lock: {[t.get('name') for t in after]}"
        always = [str(t.get("ansible.builtin.import_tasks", "")) for t in after[0].get("always", [])]
        assert [a.rsplit("/", 1)[-1] for a in always] == ["unlock.yml"], always
        assert "unlock.yml" not in str(after[0]["block"])


def gpu_host_check(ansible_env, tmp_path, run: str | None) -> subprocess.CompletedProcess:
    """playbooks/gpu_host_check.yml --check on localhost, a host of no inventory group, as if it were the GPU test
    machine of a device run (tests/fixtures/nvidia/<run>): nvidia-smi replays its captures (tests/replay_nvidia_smi.py)
    and the driver's /proc folder holds its version banner and information files. `run` None: no NVIDIA GPU at all."""
    proc_dir = tmp_path / "proc-driver-nvidia"
    proc_dir.mkdir()
    env = dict(ansible_env)
    smi = "/nonexistent/nvidia-smi"
    if run is not None:
        captures = ROOT / "tests" / "fixtures" / "nvidia" / run
        (proc_dir / "version").write_text((captures / "proc-driver-nvidia-version.txt").read_text())
        for info in captures.glob("proc-driver-nvidia-gpus-*-information.txt"):
            bus = info.name.removeprefix("proc-driver-nvidia-gpus-").removesuffix("-information.txt")
            (proc_dir / "gpus" / bus.replace("_", ":")).mkdir(parents=True)
            (proc_dir / "gpus" / bus.replace("_", ":") / "information").write_text(info.read_text())
        env["DFLASH_REPLAY_CAPTURES"] = str(captures)
        smi = str(ROOT / "tests" / "replay_nvidia_smi.py")
    return playbook(env, "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                    "-e", f"dflash_nvidia_smi={smi}", "-e", f"dflash_nvidia_proc_dir={proc_dir}",
                    "playbooks/gpu_host_check.yml", "--check")


def test_gpu_host_check_plans_a_host_outside_every_group_on_its_own_gpus(ansible_env, tmp_path) -> None:
    """The H200 test machine's captures: no group declares its hardware, so the play says it plans on the card
    nvidia-smi reports and plans it (TP1), under --check, changing nothing."""
    proc = gpu_host_check(ansible_env, tmp_path, "h200-device-run")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert ("localhost is in no group with dflash_expected_hardware: planned on its own GPUs\n        as nvidia-smi "
            "reports them, 1x NVIDIA H200 (143771 MiB, compute capability 9.0).") in proc.stdout
    assert "tp_size                 1" in proc.stdout and "changed=0" in proc.stdout


def test_gpu_host_check_on_the_h100_says_what_would_fit(ansible_env, tmp_path) -> None:
    proc = gpu_host_check(ansible_env, tmp_path, "h100-device-run")
    assert proc.returncode != 0
    assert "1x NVIDIA H100 80GB HBM3 (81559 MiB, compute capability\n        9.0)." in proc.stdout
    # The play failed where run.sh expects (the planner's refusal for this card), nowhere before it.
    before = proc.stdout.split("\nfatal:")[0]
    assert before[before.rindex("TASK ["):].startswith("TASK [serving_plan : Compute the deployment plan]")
    assert "What would fit: at tp 1: speculative.block_size 6 (draft_window >= 6) fits" in proc.stdout
    assert "undefined" not in proc.stdout


def test_gpu_host_check_refuses_a_host_without_an_nvidia_gpu_saying_so(ansible_env, tmp_path) -> None:
    proc = gpu_host_check(ansible_env, tmp_path, None)
    assert proc.returncode != 0
    assert ("localhost has no NVIDIA GPU to check: nvidia-smi: nvidia-smi is not installed\n        (no NVIDIA "
            "user-space utilities); /proc/driver/nvidia/gpus lists none.") in proc.stdout
    assert "undefined" not in proc.stdout and "Check the NVIDIA user space" not in proc.stdout


@pytest.mark.parametrize(("extra", "message"), [
    # The role's argument spec answers first for a value of the wrong kind, naming the role input.
    ('{"dflash_speculative": [1]}', "argument 'serving_plan_speculative' is of type list"),
    ('{"dflash_speculative": "x"}', "argument 'serving_plan_speculative' is of type str"),
    ('{"dflash_speculative": {"algorithm": "dflash", "block_size": "abc"}}',
     "speculative.block_size: expected an integer from 1 to 64, found 'abc'"),
    ('{"dflash_service_port": "abc"}', "serve.port: expected an integer from 1 to 65535, found 'abc'"),
    ('{"dflash_served_model_name": "a\\nb"}', "serve.served_model_name: expected 1-128 of letters"),
    ('{"dflash_plan_overrides": {"tp_size": -1}}', "overrides.tp_size: expected an integer from 1 to 64, found -1"),
    ('{"dflash_plan_overrides": [1]}', "serving_plan_overrides"),
])
def test_a_bad_value_given_to_the_play_fails_naming_the_field_never_a_traceback(ansible_env, extra: str,
                                                                                message: str) -> None:
    proc = playbook(ansible_env, "playbooks/plan.yml", "-l", "eval", "-e", "dflash_plan_offline=true", "-e", extra)
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr and "has no attribute" not in proc.stdout
