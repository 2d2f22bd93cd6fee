"""The NVIDIA side of a host: the kernel module's /proc files and nvidia-smi's two queries.

/proc/driver/nvidia/gpus/<bus>/information is readable without NVML, so a host whose user space does not
match its kernel module (nvidia-smi refuses to run) still says which GPUs it has.
"""

from __future__ import annotations

import os
from typing import Any

from .commands import run


def read_proc(proc_dir: str) -> dict[str, Any]:
    """The version banner and each GPU's information file under the driver's /proc folder (or a stand-in)."""
    out: dict[str, Any] = {"dir": proc_dir, "version": None, "gpus": []}
    try:
        with open(os.path.join(proc_dir, "version"), encoding="utf-8", errors="replace") as fh:
            out["version"] = fh.read()
    except OSError:
        pass
    gpus_dir = os.path.join(proc_dir, "gpus")
    try:
        buses = sorted(os.listdir(gpus_dir))
    except OSError:
        buses = []
    for bus in buses:
        try:
            with open(os.path.join(gpus_dir, bus, "information"), encoding="utf-8", errors="replace") as fh:
                out["gpus"].append({"bus": bus, "information": fh.read()})
        except OSError:
            continue
    return out


def query(nvidia_smi: str, gpu_fields: list[str], app_fields: list[str]) -> dict[str, Any]:
    """nvidia-smi --query-gpu and, when that works, --query-compute-apps, as {rc, stdout, stderr} each.

    A failing nvidia-smi (driver/library mismatch, absent) is a finding, not an error of the probe.
    """
    gpus = run([nvidia_smi, f"--query-gpu={','.join(gpu_fields)}", "--format=csv,noheader,nounits"])
    out: dict[str, Any] = {"gpu_fields": gpu_fields, "app_fields": app_fields, "gpus": gpus, "apps": None}
    if gpus["rc"] == 0:
        out["apps"] = run([nvidia_smi, f"--query-compute-apps={','.join(app_fields)}", "--format=csv,noheader,nounits"])
    return out
