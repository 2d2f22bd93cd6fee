"""Run a read-only command and keep what it printed: the one way the collectors call programs."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

# Programs are looked up here as well as on PATH: a non-login SSH session may lack the sbin folders.
EXTRA_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def which(program: str) -> str | None:
    """The program's path (absolute paths are taken as they are), or None when it is not installed."""
    if os.path.isabs(program):
        return program if os.access(program, os.X_OK) else None
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(EXTRA_PATH)
    return shutil.which(program, path=path)


def run(argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """{rc, stdout, stderr} of a command; rc None with a message in stderr when it could not run at all."""
    program = which(argv[0])
    if program is None:
        return {"rc": None, "stdout": "", "stderr": f"{argv[0]}: command not found"}
    environment = dict(os.environ, LC_ALL="C", **(env or {}))
    try:
        proc = subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              env=environment, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": f"{argv[0]}: no answer within {timeout:g} s"}
    except OSError as exc:
        return {"rc": None, "stdout": "", "stderr": f"{argv[0]}: {exc}"}
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
