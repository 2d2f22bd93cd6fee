"""Fixtures shared by the whole suite."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, ansible_environment, use_module_utils

# The module_utils code is tested where it runs on the hosts: as ansible.module_utils.<package>.
use_module_utils()


@pytest.fixture(scope="session")
def ansible_env() -> dict[str, str]:
    return ansible_environment()


# The real SGLang Model Gateway for the smg_parser tests: its lab lock, in a cached venv of this machine's Python.
SMG_LOCK = ROOT / "locks" / "smg-1.13.0-py3.11-x86_64-manylinux_2_34.txt"
SMG_VENV = ROOT / ".cache" / "smg-parser"
SMG_WHEELS = Path(os.environ.get("LAB_WHEELS_DIR") or ROOT / ".cache" / "lab") / "gateway-wheels"


@pytest.fixture(scope="session")
def smg_python() -> Path:
    """smg's own interpreter: a venv holding exactly the lab lock (the lab's Python, this machine's 3.11)."""
    python, stamp = SMG_VENV / "bin" / "python", SMG_VENV / ".lock-sha256"
    digest = hashlib.sha256(SMG_LOCK.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_locks.py"), "wheelhouse", "--dest", str(SMG_WHEELS),
                    str(SMG_LOCK)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(SMG_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--require-hashes",
                    "--no-deps", "--no-index", "--find-links", str(SMG_WHEELS), "-r", str(SMG_LOCK)], check=True)
    stamp.write_text(digest)
    return python
