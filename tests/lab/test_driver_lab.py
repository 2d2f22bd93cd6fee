"""playbooks/align_driver.yml against the lab on a matched host: ct200 (595.71.05 on both sides) is only probed.
The incident (ct129: kernel module 580.126.09, user space 580.159.03) is listed by align_driver.yml --check and
aligned once, by the whole deploy with its no-op re-run and --check, with the Proxmox guard on, in
test_proxmox_lab.py (the snapshot before the transaction, then the rollback).

    .venv/bin/pytest -m lab tests/lab/test_driver_lab.py      # as root, lab up
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import ansible_environment, run, tool

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab


def test_matched_host_plans_no_package_change(lab: LabHandle) -> None:
    # ct200 (595.71.05 on both sides) is only probed: --check, and the plan must say aligned.
    proc = run([tool("ansible-playbook"), "playbooks/align_driver.yml", "-i", "inventory/lab", "-l", "pro6000",
                "--check"], env=ansible_environment())
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "ct200: aligned: user space equals the kernel module (595.71.05)" in proc.stdout
    assert "would change" not in proc.stdout
