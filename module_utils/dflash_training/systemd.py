"""The few systemctl calls the stop and the resume make: a unit's settings, whether it is enabled, stop, start,
enable, disable."""

from __future__ import annotations

from typing import Any

from .commands import run
from .errors import TrainingError

UNIT_PROPERTIES = ("ActiveState", "UnitFileState", "ExecStart", "WorkingDirectory", "User", "EnvironmentFiles")


def systemctl(*args: str) -> str:
    """Run systemctl; a failure is a TrainingError that names the command."""
    out = run(["systemctl", *args])
    if out.rc != 0:
        raise TrainingError(f"expected {out.describe()} to succeed; check `systemctl status {args[-1]}`")
    return out.stdout


def show(unit: str) -> dict[str, str]:
    """UNIT_PROPERTIES of a unit, as systemctl shows them."""
    text = systemctl("show", "--no-pager", f"--property={','.join(UNIT_PROPERTIES)}", "--", unit)
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def is_enabled(unit: str) -> bool:
    """True when the unit starts at boot (`systemctl is-enabled` says enabled)."""
    return run(["systemctl", "is-enabled", "--", unit]).stdout.strip() == "enabled"


def unit_record(unit: str) -> dict[str, Any]:
    """What the stop record keeps of the job's unit: enough to start (and enable) it again."""
    props = show(unit)
    return {"name": unit, "enabled": props.get("UnitFileState") == "enabled", "exec_start": props.get("ExecStart", ""),
            "working_directory": props.get("WorkingDirectory", ""), "user": props.get("User", ""),
            "environment_files": props.get("EnvironmentFiles", "")}
