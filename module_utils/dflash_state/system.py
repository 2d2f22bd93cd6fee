"""The host itself: platform (Python, glibc, distribution), /dev/shm and free space."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def _os_release() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep:
                    out[key] = value.strip('"')
    except OSError:
        pass
    return out


def platform_info() -> dict[str, Any]:
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else ""
    release = _os_release()
    return {"python": ".".join(str(v) for v in sys.version_info[:3]), "machine": platform.machine(),
            "glibc": (libc or "").replace("glibc ", "") or None, "os_id": release.get("ID"),
            "os_version": release.get("VERSION_ID"), "kernel": platform.release()}


def filesystem(path: str) -> dict[str, Any]:
    """Size and free bytes of the file system holding `path` (its nearest existing parent)."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        probe = parent if parent != probe else ""
    if not probe:
        return {"path": path, "exists": False}
    st = os.statvfs(probe)
    return {"path": path, "exists": os.path.exists(path), "measured_at": probe,
            "size_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def shm() -> dict[str, Any]:
    """/dev/shm, where NCCL keeps its intra-node buffers: size in bytes, or mounted false."""
    if not os.path.ismount("/dev/shm") and not os.path.isdir("/dev/shm"):
        return {"mounted": False}
    fs = filesystem("/dev/shm")
    return {"mounted": True, "size_bytes": fs.get("size_bytes")}
