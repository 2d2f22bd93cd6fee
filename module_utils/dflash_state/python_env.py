"""What a Python virtual environment holds, read from its dist-info folders (no interpreter started)."""

from __future__ import annotations

import glob
import os
import re
from typing import Any

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


def venv(path: str, capabilities_file: str = "") -> dict[str, Any]:
    """{path, python (the venv's interpreter exists), distributions, capabilities (the engine role's cache)}."""
    python = os.path.join(path, "bin", "python")
    out: dict[str, Any] = {"path": path, "python": os.access(python, os.X_OK), "distributions": {}}
    if out["python"]:
        out["distributions"] = distributions(path)
    if capabilities_file:
        out["capabilities"] = read_file(capabilities_file, as_json=True)
    return out
