"""The rehearsal: the deploy entry point against the lab, as `make demo` runs it, and the lab's incident state."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash_infra import parsers
from helpers import ansible_environment, run, tool

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab


def plan_stage(*args: str):
    """The deploy's read-only stage (probe, preflight, plan) and its summary, as `make demo` starts."""
    return run([tool("ansible-playbook"), "deploy_dflash.yml", "-i", "inventory/lab", "-l", "pro6000",
                "--tags", "plan", *args], env=ansible_environment())


def test_plan_stage_probes_ct200_and_prints_the_plan_and_summary(lab: LabHandle) -> None:
    proc = plan_stage()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # The probe went through SSH to ct200's nvidia-smi stand-in and the planner used what it printed.
    assert "GPUs: 8 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition, kernel module 595.71.05 (open)" in out
    assert "ct200 has 8x NVIDIA RTX PRO 6000 Blackwell as group pro6000 expects" in out
    assert "plan: tp 2 x dp 4 on GPUs [0, 1, 2, 3, 4, 5, 6, 7]" in out
    assert "ct129" not in out.split("PLAY RECAP")[-1]  # -l pro6000 touched only ct200
    assert "changed=0" in out and "failed=0" in out


def test_plan_stage_under_check_mode_changes_nothing(lab: LabHandle) -> None:
    before = lab.changeable_state()
    proc = plan_stage("--check", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failed=0" in proc.stdout and lab.changeable_state() == before


def test_fresh_ct129_is_in_the_incident_state(lab: LabHandle) -> None:
    lab.cli_ok("reset", "ct129")
    smi = lab.ssh("ct129", "nvidia-smi")
    assert smi.returncode == 18
    assert smi.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                       "NVML library version: 580.159"]
    status = parsers.parse_text("nvml", smi.stdout, "ct129 nvidia-smi")
    assert (status["status"], status["library_version"]) == ("mismatch", "580.159")
    kernel = lab.ssh("ct129", "cat", "/var/lib/dflash-lab/proc/driver/nvidia/version")
    assert parsers.parse_text("driver", kernel.stdout, "ct129 version")["version"] == "580.126.09"
    cached = lab.ssh("ct129", "ls", "/var/cache/apt/archives")
    assert "libnvidia-compute-580_580.126.09-0ubuntu0.24.04.1_amd64.deb" in cached.stdout.split()


def test_ct200_stand_ins_parse_with_the_planner_parsers(lab: LabHandle) -> None:
    fields = "index,name,memory.total,compute_cap,driver_version,pci.bus_id,uuid"
    gpus = lab.ssh("ct200", "nvidia-smi", f"--query-gpu={fields}", "--format=csv")
    parsed = parsers.parse_text("gpus", gpus.stdout, "ct200 query-gpu")
    assert len(parsed) == 8 and {g["memory_total_mib"] for g in parsed} == {97887}
    apps = lab.ssh("ct200", "nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv")
    assert apps.returncode == 0, apps.stderr
    json.dumps(parsers.parse_text("apps", apps.stdout, "ct200 compute-apps"))
    table = lab.ssh("ct200", "nvidia-smi")
    assert parsers.parse_text("smi", table.stdout, "ct200 nvidia-smi")["driver_version"] == "595.71.05"
