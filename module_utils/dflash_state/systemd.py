"""systemd's view of the units the deploy manages or must know about (one `systemctl show` for all)."""

from __future__ import annotations

from typing import Any

from .commands import run

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "NRestarts", "InvocationID",
              "MainPID", "FragmentPath", "Result")


def show(units: list[str]) -> dict[str, dict[str, Any]]:
    """unit name -> its PROPERTIES (LoadState 'not-found' for a unit systemd does not know)."""
    if not units:
        return {}
    result = run(["systemctl", "show", "--no-pager", f"--property={','.join(PROPERTIES)}", "--", *units])
    out: dict[str, dict[str, Any]] = {}
    blocks = result["stdout"].strip().split("\n\n") if result["rc"] == 0 else []
    for unit, block in zip(units, blocks, strict=False):  # blocks may be short when systemctl failed
        props: dict[str, Any] = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        for key in ("NRestarts", "MainPID"):
            if str(props.get(key, "")).isdigit():
                props[key] = int(props[key])
        out[unit] = props
    for unit in units:
        out.setdefault(unit, {"Id": unit, "LoadState": "unknown", "error": result["stderr"].strip()})
    return out


def unit_of_pid(pid: int, proc_root: str = "/proc") -> str:
    """The systemd unit whose cgroup holds a process ('' for none): cgroup v2, v1 and hybrid alike."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        path = line.rsplit(":", 1)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""
