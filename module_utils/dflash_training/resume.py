"""How a stopped job starts again: its unit, or its recorded command line as a transient systemd unit with its cwd,
user, kept environment and log. Pure: the argv is built here and run by the job's resume."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

TRANSIENT_PREFIX = "dflash-training-resumed-"


def transient_unit_name(now: datetime) -> str:
    """The name of the transient unit that runs a resumed command line (shown by `systemctl status`)."""
    return f"{TRANSIENT_PREFIX}{now.strftime('%Y%m%d%H%M%S')}"


def resume_argv(resume: Mapping[str, Any], unit_name: str) -> list[str]:
    """systemd-run argv starting the recorded command line detached from the SSH session, in its cwd, as its user,
    with its environment file and kept variables, its output appended to its log."""
    argv = ["systemd-run", f"--unit={unit_name}", "--collect", f"--uid={resume.get('user') or 'root'}",
            f"--property=WorkingDirectory={resume.get('cwd') or '/'}"]
    if resume.get("env_file"):
        argv.append(f"--property=EnvironmentFile=-{resume['env_file']}")
    argv += [f"--setenv={key}={value}" for key, value in (resume.get("env") or {}).items()]
    if resume.get("log"):
        argv += [f"--property=StandardOutput=append:{resume['log']}",
                 f"--property=StandardError=append:{resume['log']}"]
    return [*argv, "--", *resume["command"]]
