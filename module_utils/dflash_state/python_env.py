"""What a Python virtual environment holds, read from its dist-info folders and pyvenv.cfg (no interpreter of the
venv started), and the version of the interpreter that would create it when there is none yet."""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from .commands import run
from .files import read_file


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(venv: str) -> dict[str, str]:
    """canonical distribution name -> version, for every *.dist-info in the venv's site-packages."""
    out: dict[str, str] = {}
    for meta in sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info", "METADATA"))):
        name = version = ""
        try:
            with open(meta, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                    elif not line.strip():
                        break
        except OSError:
            continue
        if name and version:
            out[_canonical(name)] = version
    return out


def pyvenv_version(path: str) -> str | None:
    """The Python version pyvenv.cfg names (`version` up to 3.11, `version_info` from 3.12 on)."""
    found: dict[str, str] = {}
    try:
        with open(os.path.join(path, "pyvenv.cfg"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition("=")
                if sep:
                    found[key.strip()] = value.strip()
    except OSError:
        return None
    return found.get("version_info") or found.get("version") or None


def interpreter_version(interpreter: str) -> str | None:
    """major.minor.micro of an interpreter (a program name or path), None when it does not run."""
    out = run([interpreter, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], timeout=20)
    return (out["stdout"].strip() or None) if out["rc"] == 0 else None


def venv(path: str, capabilities_file: str = "", lock_file: str = "", interpreter: str = "") -> dict[str, Any]:
    """{path, python (the venv's interpreter exists), python_version, distributions, capabilities (the engine
    role's cache), lock (the copy of the lock it was installed from), interpreter_version (of the interpreter
    that would create it, asked only when the venv has none)}."""
    python = os.path.join(path, "bin", "python")
    out: dict[str, Any] = {"path": path, "python": os.access(python, os.X_OK), "distributions": {}}
    if out["python"]:
        out["distributions"] = distributions(path)
        out["python_version"] = pyvenv_version(path)
    elif interpreter:
        out["interpreter"] = interpreter
        out["interpreter_version"] = interpreter_version(interpreter)
    if capabilities_file:
        out["capabilities"] = read_file(capabilities_file, as_json=True)
    if lock_file:
        out["lock"] = read_file(lock_file)
    return out
