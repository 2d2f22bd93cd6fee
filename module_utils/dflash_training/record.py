"""The record of a stopped job (what ran, where, as whom, on which GPUs, how to start it again): built, written
0600 with a backup of the one it replaces, read back for the resume, and kept as resumed afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import TrainingError

SCHEMA = 1


def stop_record(host: str, found: Mapping[str, Any], held: Mapping[Any, list[int]], unit: Mapping[str, Any],
                env_file: str, resume_command: list[str], now: str,
                boot_units: Iterable[str] = ()) -> dict[str, Any]:
    """The stopped-training.json record: what ran, where, as whom, with which GPUs, and how to start it again."""
    held_by = {int(k): v for k, v in held.items()}
    procs = [dict(p, gpus=held_by.get(int(p["pid"]), [])) for p in found.get("roots", [])]
    kids = [dict(p, gpus=held_by.get(int(p["pid"]), [])) for p in found.get("descendants", [])]
    gpus = sorted({g for p in procs + kids for g in p["gpus"] if g >= 0})
    first = procs[0] if procs else {}
    return {"schema": SCHEMA, "host": host, "stopped_at": now, "mode": found.get("mode"),
            "unit": dict(unit) if unit else None, "env_file": env_file, "boot_units": list(boot_units),
            "gpus": gpus, "processes": procs, "descendants": kids,
            "resume": {"command": list(resume_command) or list(first.get("cmdline", [])),
                       "cwd": first.get("cwd", "/"), "user": first.get("user", "root"),
                       "log": first.get("log", ""), "env": first.get("env", {}), "env_file": env_file}}


def describe_line(p: Mapping[str, Any]) -> str:
    """One line per recorded process for the play output (no environment values)."""
    gpus = ",".join(str(g) for g in p.get("gpus", [])) or "none"
    return (f"pid {p['pid']} user {p.get('user')} since {p.get('started_at')}: {' '.join(p.get('cmdline', []))} "
            f"(cwd {p.get('cwd') or '?'}, log {p.get('log') or 'none'}, GPUs {gpus})")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_record(path: Path, record: Mapping[str, Any]) -> str | None:
    """Write the record (0600, its folder 0755); a record it replaces is kept beside it as
    <name>.<pid>.<YYYY-mm-dd@HH:MM:SS>~. Returns that backup's path, or None."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    text = json.dumps(record, indent=4, sort_keys=True) + "\n"
    backup = None
    if path.exists():
        if path.read_text(errors="replace") == text:
            return None
        backup = f"{path}.{os.getpid()}.{time.strftime('%Y-%m-%d@%H:%M:%S')}~"
        shutil.copy2(path, backup)
    _write(path, text)
    return backup


def read_record(path: Path) -> dict[str, Any] | None:
    """The record of the stopped job, or None when there is none; a record that cannot start the job again is a
    TrainingError."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        record: dict[str, Any] = json.loads(text)
    except ValueError as exc:
        raise TrainingError(f"{path}: expected the JSON record of a stopped job, found unreadable JSON ({exc}); "
                            "fix or remove it") from None
    resume = record.get("resume") if isinstance(record, dict) else None
    if not isinstance(resume, dict) or not isinstance(record.get("gpus"), list):
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise TrainingError(f"{path}: expected a record with `resume` and `gpus` (schema {SCHEMA}), found keys "
                            f"{found}; fix or remove it")
    if not record.get("unit") and not resume.get("command"):
        raise TrainingError(f"{path}: the record names neither a unit nor a command line to start; nothing to "
                            "resume from it. Start the job by hand and remove the record")
    return record


def resumed_path(path: Path, now: datetime) -> Path:
    """Where a resumed record is kept: <name without .json>.resumed-<UTC stamp>.json beside it."""
    return path.with_name(re.sub(r"\.json$", "", path.name) + f".resumed-{now.strftime('%Y%m%dT%H%M%SZ')}.json")


def keep_resumed(path: Path, kept: Path) -> None:
    """Keep the active record under its resumed name (0600) and remove it, so a second resume is a no-op."""
    _write(kept, path.read_text())
    path.unlink()
