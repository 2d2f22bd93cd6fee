#!/usr/bin/python3
# dflash-lab STAND-IN for the training job that runs on production ct200.
#
# It does no training. It behaves like the job from the outside: a long-running
# python3 process that prints progress lines (run.sh appends them to
# /root/train_slammed5.log) and holds GPU memory on every GPU, which the lab's
# nvidia-smi stand-in shows under --query-compute-apps. The registration lives in
# /run/dflash-lab/gpu-procs/<pid>.json; nvidia-smi ignores it once the pid is gone,
# as the driver frees GPU memory when a process dies.
#
# Environment:
#   TRAIN_IGNORE_SIGTERM=1    keep running on SIGTERM (only SIGKILL stops it)
#   TRAIN_GPU_MEMORY_MIB      memory held per GPU (default 91000)
#   TRAIN_GPUS                comma-separated GPU indexes (default: all in the profile)
#   TRAIN_INTERVAL_S          seconds between progress lines (default 5)
#   TRAIN_TOTAL_STEPS         steps until the run finishes (default 200000)
#   DFLASH_LAB_GPU_PROFILE    profile JSON (default /etc/dflash-lab/gpu-profile.json)
#   DFLASH_LAB_GPU_PROCS      registry dir (default /run/dflash-lab/gpu-procs)
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType


@dataclass(frozen=True)
class Settings:
    """Knobs of one run, read from the environment."""

    ignore_sigterm: bool
    memory_mib: int
    gpus: list[int]
    interval_s: float
    total_steps: int
    procs_dir: str


def profile_gpus(path: str) -> list[int]:
    """GPU indexes from the lab profile; 8 GPUs when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [int(g["index"]) for g in json.load(fh)["gpus"]]
    except (OSError, ValueError, KeyError):
        return list(range(8))


def settings_from_env(env: dict[str, str]) -> Settings:
    gpus_env = env.get("TRAIN_GPUS", "").strip()
    gpus = [int(x) for x in gpus_env.split(",") if x.strip()] if gpus_env else profile_gpus(
        env.get("DFLASH_LAB_GPU_PROFILE", "/etc/dflash-lab/gpu-profile.json"))
    return Settings(
        ignore_sigterm=env.get("TRAIN_IGNORE_SIGTERM", "0") not in ("", "0", "false", "no"),
        memory_mib=int(env.get("TRAIN_GPU_MEMORY_MIB", "91000")),
        gpus=gpus,
        interval_s=float(env.get("TRAIN_INTERVAL_S", "5")),
        total_steps=int(env.get("TRAIN_TOTAL_STEPS", "200000")),
        procs_dir=env.get("DFLASH_LAB_GPU_PROCS", "/run/dflash-lab/gpu-procs"),
    )


def start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat: lets nvidia-smi tell a reused pid from ours."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
        return fh.read().rsplit(")", 1)[-1].split()[19]


def register(s: Settings) -> str:
    """Write the GPU registration atomically; returns its path."""
    os.makedirs(s.procs_dir, exist_ok=True)
    pid = os.getpid()
    reg = {
        "pid": pid,
        "start_time": start_time(pid),
        "type": "C",
        "process_name": "python3",
        "gpus": [{"index": i, "used_memory_mib": s.memory_mib} for i in s.gpus],
        "note": "dflash-lab stand-in registration (training job)",
    }
    path = os.path.join(s.procs_dir, f"{pid}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(reg, fh)
    os.replace(tmp, path)
    return path


def unregister(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def progress_line(step: int, total: int) -> str:
    """A deterministic, plausible progress line for a step."""
    loss = 1.2 + 2.3 * math.exp(-step / 4000.0) + 0.02 * math.sin(step / 7.0)
    lr = 2e-5 * min(1.0, step / 500.0)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"[{stamp}] step {step}/{total} | epoch {step / 25000:.3f} | loss {loss:.4f} | "
            f"lr {lr:.2e} | grad_norm {0.8 + 0.1 * math.cos(step):.3f} | tokens/s {48000 + (step * 37) % 900}")


def main() -> int:
    s = settings_from_env(dict(os.environ))
    reg_path = register(s)
    stop = {"requested": False}

    def on_term(signum: int, _frame: FrameType | None) -> None:
        if s.ignore_sigterm:
            print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] received signal {signum}; ignoring it "
                  "(TRAIN_IGNORE_SIGTERM=1)", flush=True)
            return
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] training started pid={os.getpid()} gpus={s.gpus} "
          f"memory_per_gpu={s.memory_mib}MiB (dflash-lab stand-in)", flush=True)
    step = 0
    try:
        while step < s.total_steps and not stop["requested"]:
            step += 1
            print(progress_line(step, s.total_steps), flush=True)
            deadline = time.monotonic() + s.interval_s
            while not stop["requested"] and time.monotonic() < deadline:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if stop["requested"]:
            print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] SIGTERM: saving checkpoint at step {step} and exiting",
                  flush=True)
    finally:
        unregister(reg_path)
    return 143 if stop["requested"] else 0


if __name__ == "__main__":
    sys.exit(main())
