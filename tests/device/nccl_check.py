"""Start a tensor-parallel NCCL group with the environment the sglang service unit sets, and all-reduce.

The environment is not retyped here: it is read from a rendered unit (`--unit /etc/systemd/system/
sglang-qwen.service`) or composed the way roles/sglang_service does it (its defaults' sglang_service_environment
plus CUDA_VISIBLE_DEVICES from the plan's gpu_ids, the plan made by the planner on this host's GPUs).
Before any rank starts, the environment is checked against the group size, so a wrong one (two ranks, one
visible GPU) fails with a sentence instead of an NCCL hang. Runs on a GPU host with torch (not in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# NVLink multicast stays off on shared hosts (it can take a host's GPUs out of service).
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def unit_environment(text: str) -> tuple[dict[str, str], int]:
    """Environment= assignments and --tp-size of a rendered unit."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line.removeprefix("Environment=")):
                key, _, value = word.partition("=")
                env[key] = value
    words = shlex.split(text.replace("\\\n", " "))
    tp = int(words[words.index("--tp-size") + 1]) if "--tp-size" in words else 1
    return env, tp


def role_environment(tp: int | None) -> tuple[dict[str, str], int, dict]:
    """sglang_service's environment for the plan this host gets (tp override optional)."""
    import yaml

    from dflash_infra import parsers
    from dflash_infra.planner import plan_dict

    defaults = yaml.safe_load((ROOT / "roles/sglang_service/defaults/main.yml").read_text())
    fields = ["index", "name", "memory.total", "compute_cap"]
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                         check=True, capture_output=True, text=True).stdout
    gpus = parsers.parse_text("gpus", out, "nvidia-smi", fields)
    request = {"gpus": gpus, "target": {"name": "Qwen3.6-27B"}, "draft": {"name": "Qwen3.6-27B-DFlash"},
               "speculative": {"algorithm": "dflash", "block_size": 16, "draft_window": 16, "max_draft_tokens": 16},
               "sglang_version": "0.5.23", "overrides": {"tp_size": tp} if tp else {}}
    plan = plan_dict(request)
    env = {k: str(v) for k, v in defaults["sglang_service_environment"].items()}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in plan.get("gpu_ids") or [])
    return env, int(plan.get("tp_size") or tp or 0), plan


def environment_problems(env: dict[str, str], ranks: int, host_gpus: int) -> list[str]:
    """Why this environment cannot host `ranks` NCCL ranks (one GPU each)."""
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    problems = []
    if ranks < 1:
        problems.append(f"expected a group of at least one rank, found {ranks} (the plan has errors?)")
    if len(visible) < ranks:
        problems.append(f"{ranks} ranks need {ranks} GPUs, but CUDA_VISIBLE_DEVICES={','.join(visible) or '(empty)'} "
                        f"exposes {len(visible)}; render the unit from a plan whose gpu_ids cover tp x dp")
    bad = [d for d in visible if not d.isdigit() or int(d) >= host_gpus]
    if bad:
        problems.append(f"CUDA_VISIBLE_DEVICES names GPU(s) {','.join(bad)} that this host (with {host_gpus}) lacks")
    return problems


def rank_main(rank: int, world: int, port: int, size_mib: int, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(size_mib * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert float(x[0]) == world, f"all-reduce sum {float(x[0])} != {world}"
    iters = 10
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    if rank == 0:
        nbytes = x.numel() * 4
        bus = nbytes * 2 * (world - 1) / world / seconds if world > 1 else 0.0
        Path(result_path).write_text(json.dumps({
            "world_size": world, "bytes": nbytes, "seconds_per_allreduce": seconds,
            "algbw_gbps": nbytes / seconds / 1e9, "busbw_gbps": bus / 1e9,
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())), "sum_ok": True}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", type=Path, help="a rendered sglang service unit to take the environment from")
    parser.add_argument("--tp", type=int, help="plan with this tp (default: the planner's choice)")
    parser.add_argument("--visible", help="override CUDA_VISIBLE_DEVICES (to show a wrong environment being caught)")
    parser.add_argument("--size-mib", type=int, default=256)
    args = parser.parse_args()

    import torch
    import torch.multiprocessing as mp

    if args.unit:
        env, ranks = unit_environment(args.unit.read_text())
        source = str(args.unit)
    else:
        env, ranks, plan = role_environment(args.tp)
        source = f"roles/sglang_service defaults + plan (tp {plan.get('tp_size')}, errors {plan.get('errors')})"
        if args.tp and plan.get("errors"):
            ranks = args.tp
    if args.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.visible
    env.update(SAFETY_ENV)
    report = {"environment_from": source, "environment": env, "ranks": ranks}
    problems = environment_problems(env, ranks, torch.cuda.device_count())
    if problems:
        report.update(status="refused", problems=problems)
        print(json.dumps(report, indent=2))
        return 2
    os.environ.update(env)  # before any CUDA call in the ranks: the unit's view of the GPUs
    result = Path("/tmp/nccl_check_result.json")
    port = 29500 + os.getpid() % 1000
    mp.spawn(rank_main, args=(ranks, port, args.size_mib, str(result)), nprocs=ranks, join=True)
    report.update(status="ok", allreduce=json.loads(result.read_text()))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
