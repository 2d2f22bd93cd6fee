"""Test helpers: repository paths and the project's own tools."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A console script of the running venv (ansible-playbook, dflash-infra, ...)."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def ansible_environment() -> dict[str, str]:
    """The environment ansible-playbook runs with in tests: the repo's ansible.cfg, no colour."""
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def run(argv: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, **kwargs)
