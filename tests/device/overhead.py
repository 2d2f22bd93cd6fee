"""Measure on a real GPU the fixed memory overheads the planner budgets for (run on a GPU host, not in CI).

Reports, from nvidia-smi's and CUDA's own counters: memory used before any CUDA context, after creating one,
after cuBLAS/cuDNN warm-up, and after allocating N GiB; then compares the per-process overhead with the
planner's constant reserve (memory.engine_reserved_mib's 512 MiB term) and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MIB = 1024 * 1024


def smi_used_mib(index: int) -> int:
    """memory.used of one GPU as nvidia-smi reports it (includes every process's context)."""
    out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--alloc-gib", type=int, default=8, help="GiB to allocate in one tensor")
    args = parser.parse_args()

    import torch  # imported late: the "before" reading must precede any CUDA context

    from dflash_infra import memory

    before = smi_used_mib(args.gpu)
    torch.cuda.set_device(args.gpu)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    after_context = smi_used_mib(args.gpu)

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    after_cublas = smi_used_mib(args.gpu)

    block = torch.empty(args.alloc_gib * 1024 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free_alloc, _ = torch.cuda.mem_get_info()
    after_alloc = smi_used_mib(args.gpu)
    reserved_by_torch = torch.cuda.memory_reserved() // MIB
    del block, a

    context_mib = after_context - before
    cublas_mib = after_cublas - after_context
    alloc_overhead_mib = (after_alloc - after_cublas) - args.alloc_gib * 1024
    planner_constant = 512  # memory.engine_reserved_mib: "reserved = 512.0 + ..."
    report = {
        "gpu": torch.cuda.get_device_name(args.gpu),
        "total_mib": total // MIB,
        "driver_free_after_context_mib": free // MIB,
        "used_before_mib": before,
        "cuda_context_mib": context_mib,
        "cublas_workspace_and_kernels_mib": cublas_mib,
        "alloc_gib": args.alloc_gib,
        "alloc_overhead_mib": alloc_overhead_mib,
        "torch_reserved_mib": reserved_by_torch,
        "free_after_alloc_mib": free_alloc // MIB,
        "fixed_overhead_mib": context_mib + cublas_mib,
        "planner_constant_reserve_mib": planner_constant,
        "planner_reserve_for_this_gpu_tp1_mib": memory.engine_reserved_mib(
            total // MIB, 1, memory.capacity_defaults(total // MIB, 1).chunked_prefill_size,
            memory.capacity_defaults(total // MIB, 1).cuda_graph_max_bs),
    }
    report["fixed_overhead_vs_planner_constant"] = round(report["fixed_overhead_mib"] / planner_constant, 2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
