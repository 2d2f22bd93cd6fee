"""Every molecule scenario in molecule/ runs its full sequence against the lab (create ... verify, destroy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import BIN, ROOT, run

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab

SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(lab: LabHandle, scenario: str, tmp_path: Path) -> None:
    # A fresh ephemeral directory: molecule starts with no state, so prepare runs even after an interrupted run.
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", ANSIBLE_NOCOLOR="1",
               PY_COLORS="0", ANSIBLE_FORCE_COLOR="0", MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule"))
    env.pop("ANSIBLE_CONFIG", None)  # molecule writes its own ansible.cfg for the scenario
    proc = run([str(BIN / "molecule"), "test", "-s", scenario], env=env, stdin=subprocess.DEVNULL)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"molecule test -s {scenario} failed:\n{tail}"
