"""LAB STAND-IN: the simulated GPUs the engine "runs" on, and its registration with the lab's nvidia-smi.

GPU memory comes from SGLANG_STANDIN_GPU_MEMORY_MIB, else the lab's GPU profile
(/etc/dflash-lab/gpu-profile.json, or $DFLASH_LAB_GPU_PROFILE), else 97887 MiB (RTX PRO 6000).
The process registers itself in /run/dflash-lab/gpu-procs/<pid>.json (or $DFLASH_LAB_GPU_PROCS),
the format lab/kit/nvidia_smi.py reads, so `nvidia-smi --query-compute-apps` lists it while it lives.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass

PROFILE_PATH = "/etc/dflash-lab/gpu-profile.json"
PROCS_DIR = "/run/dflash-lab/gpu-procs"
DEFAULT_GPU_MIB = 97887


@dataclass(frozen=True)
class GpuSetup:
    """Per-GPU memory of the simulated box and the GPU indices this process uses."""

    memory_total_mib: int
    memory_used_mib: int
    gpus: list[int]
    name: str | None = None  # the GPU model's name (what torch.cuda.get_device_name says), when the profile has it


def _profile(env: dict[str, str]) -> dict | None:
    """The lab GPU profile JSON, or None outside the lab."""
    path = env.get("DFLASH_LAB_GPU_PROFILE", PROFILE_PATH)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def visible_gpus(env: dict[str, str], profile: dict | None, needed: int) -> list[int]:
    """CUDA_VISIBLE_DEVICES, else the first `needed` GPUs of the profile (or 0..needed-1)."""
    raw = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if raw:
        return [int(x) for x in raw.split(",") if x.strip()][:needed]
    indices = [int(g["index"]) for g in (profile or {}).get("gpus", [])] or list(range(needed))
    return indices[:needed]


def gpu_setup(env: dict[str, str], needed: int) -> GpuSetup:
    """Memory per GPU and the GPUs used, from the environment and the lab profile."""
    profile = _profile(env)
    model = (profile or {}).get("gpu_model") or {}
    if env.get("SGLANG_STANDIN_GPU_MEMORY_MIB"):
        total = int(env["SGLANG_STANDIN_GPU_MEMORY_MIB"])
    else:
        total = int(model.get("memory_total_mib", DEFAULT_GPU_MIB))
    used = int(model.get("memory_reserved_mib", 0)) + int(model.get("memory_idle_used_mib", 0))
    return GpuSetup(memory_total_mib=total, memory_used_mib=used, gpus=visible_gpus(env, profile, needed),
                    name=model.get("name"))


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: lets nvidia-smi tell a reused pid from ours."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[19]
    except OSError:
        return None


def register(env: dict[str, str], gpus: list[int], used_memory_mib: int) -> str | None:
    """Write /run/dflash-lab/gpu-procs/<pid>.json atomically; None when the lab directory is absent."""
    folder = env.get("DFLASH_LAB_GPU_PROCS", PROCS_DIR)
    if not os.path.isdir(folder):
        return None
    pid = os.getpid()
    record = {
        "pid": pid,
        "start_time": _start_time(pid),
        "type": "C",
        "process_name": "python3",
        "gpus": [{"index": i, "used_memory_mib": used_memory_mib} for i in gpus],
        "used_memory_mib": used_memory_mib,
        "note": "dflash-lab stand-in registration (sglang engine stand-in)",
    }
    path = os.path.join(folder, f"{pid}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)
    return path


def unregister(path: str | None) -> None:
    """Remove the registration (the driver frees a dead process's memory; so does nvidia-smi's stand-in)."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
