"""Captures from the real H200 run (tests/device/run.sh): parsers on them, and the planner's fixed-overhead budget.

The files under tests/fixtures/nvidia/h200-device-run were written on the GPU test machine and are not edited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_infra import memory, parsers

RUN = Path(__file__).resolve().parent / "fixtures" / "nvidia" / "h200-device-run"


def parse(kind: str, name: str, fields: list[str] | None = None):
    return parsers.parse_file(kind, RUN / name, fields)


def test_query_gpu_with_and_without_header_agree() -> None:
    header = parse("gpus", "query-gpu-header.csv")
    bare = parse("gpus", "query-gpu-noheader-nounits.csv",
                 ["index", "name", "memory.total", "driver_version", "compute_cap", "pci.bus_id", "uuid"])
    assert header == bare
    assert header[0]["name"] == "NVIDIA H200" and header[0]["memory_total_mib"] == 143771
    assert header[0]["compute_cap"] == "9.0" and header[0]["driver_version"] == "580.159.04"


def test_compute_apps_show_the_real_process() -> None:
    apps = parse("apps", "query-compute-apps.csv")
    assert [(a["process_name"], a["used_memory_mib"]) for a in apps] == [("python3", 10758)]
    bare = parse("apps", "query-compute-apps-noheader.csv", ["pid", "process_name", "used_gpu_memory"])
    assert bare[0]["pid"] == apps[0]["pid"]


def test_tables_version_and_kernel_module() -> None:
    idle = parse("smi", "nvidia-smi.txt")
    busy = parse("smi", "nvidia-smi-with-process.txt")
    assert idle["processes_state"] == "none_running"
    assert [p["pid"] for p in busy["processes"]] == [parse("apps", "query-compute-apps.csv")[0]["pid"]]
    assert parse("smi-version", "nvidia-smi-version.txt")["driver_version"] == "580.159.04"
    module = parse("driver", "proc-driver-nvidia-version.txt")
    assert (module["version"], module["flavor"]) == ("580.159.04", "open")
    assert parse("nvml", "nvidia-smi.txt")["status"] == "ok"


def test_proc_devices_gives_the_uvm_major() -> None:
    devices = parsers.parse_proc_devices((RUN / "proc-devices.txt").read_text(), "proc-devices.txt")
    assert devices.major("nvidia-uvm") == 238 and devices.major("nvidia") == 195


def test_libraries_come_from_a_bind_mount_with_no_package() -> None:
    text = (RUN / "libraries.txt").read_text()
    targets = {line.split(" -> ")[1] for line in text.splitlines() if " -> " in line}
    assert {parsers.library_version_from_path(t) for t in targets} == {"580.159.04"}
    assert "(no dpkg package)" in text


def test_the_play_skipped_alignment_and_planned_tp1() -> None:
    log = (RUN / "play.log").read_text()
    assert "alignment skipped" in log and "not package managed" in log
    assert "tp_size                 1" in log
    assert "failed=0" in log and "changed=0" in log


@pytest.fixture()
def overhead() -> dict:
    return json.loads((RUN / "overhead.json").read_text())


def test_fixed_overhead_fits_the_planners_constants(overhead: dict) -> None:
    # Measured: CUDA context + cuBLAS workspace of one process. The engine's own heuristic budgets 512 MiB of
    # constant overhead, less than measured; the planner's draft-worker allowance adds another 512 MiB
    # constant, so the plan as a whole covers the measurement (documented in dflash_infra/memory.py).
    measured = overhead["fixed_overhead_mib"]
    assert measured > 512, "the engine's 512 MiB constant alone would be enough; revisit the allowance"
    assert measured <= 512 + memory.draft_worker_reserved_mib(0)
    # nvidia-smi's total (what SGLang's heuristic reads) exceeds what CUDA can hand out.
    assert overhead["total_mib"] < 143771


def test_allocations_carry_no_hidden_overhead(overhead: dict) -> None:
    assert abs(overhead["alloc_overhead_mib"]) <= 64
