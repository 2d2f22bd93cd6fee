"""What a model folder holds, read cheaply: its config and index (small files only), and how it stands against
its verified state file by sizes and mtimes (no model byte is read). Pure and JSON-able, for the modules that
report host state."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import SyncError
from .manifest import list_files, read_manifest

# How many differing paths stamp() names.
DIFFERING_SHOWN = 5


def describe(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json and the index's metadata.total_size of a model folder (small files only)."""
    root = Path(folder)
    out: dict[str, Any] = {"path": str(root), "present": (root / "config.json").is_file()}
    if out["present"]:
        out["config"] = json.loads((root / "config.json").read_text())
    index = root / "model.safetensors.index.json"
    if index.is_file():
        out["index_total_size"] = int((json.loads(index.read_text()).get("metadata") or {}).get("total_size") or 0)
    if root.is_dir():
        out["weights_file_bytes"] = sum(st.st_size for rel, st in list_files(root) if rel.endswith(".safetensors"))
    return out


def _present(dest: Path) -> dict[str, os.stat_result]:
    try:
        return dict(list_files(dest))
    except SyncError:
        return {}


def stamp(dest: str | os.PathLike[str], state_path: str | os.PathLike[str]) -> dict[str, Any]:
    """A model folder against its verified state file, by sizes and mtimes only: matches is true when every file
    of the state is there with its size and mtime and nothing else is; differing names the first few that are not.
    state_digest is the verified manifest's sha256 (equal to the source manifest's for an exact copy)."""
    state = read_manifest(Path(state_path))
    present = _present(Path(dest))
    out: dict[str, Any] = {"state_present": state is not None, "state_digest": state.digest() if state else None,
                           "files": len(present), "bytes": sum(st.st_size for st in present.values())}
    known = state.by_path() if state else {}
    differing = sorted(
        [rel for rel, f in known.items()
         if rel not in present or (present[rel].st_size, present[rel].st_mtime_ns) != (f.size, f.mtime_ns)]
        + [rel for rel in present if rel not in known])
    out["matches"] = state is not None and not differing
    out["differing"] = differing[:DIFFERING_SHOWN]
    return out
