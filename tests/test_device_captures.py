"""Captures from the real GPU runs of tests/device/run.sh (an H200, then an H100 test machine): the parsers on them,
the read-only play's outcome, and the planner's fixed-overhead budget.

The files under tests/fixtures/nvidia/<card>-device-run were written on the GPU test machines and are not edited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_infra import memory, parsers

NVIDIA = Path(__file__).resolve().parent / "fixtures" / "nvidia"
RUN = NVIDIA / "h200-device-run"
H100_RUN = NVIDIA / "h100-device-run"
# Each run's card as nvidia-smi named it, with its memory.
CARDS = {RUN: ("NVIDIA H200", 143771), H100_RUN: ("NVIDIA H100 80GB HBM3", 81559)}
runs = pytest.mark.parametrize("run", list(CARDS), ids=[p.name for p in CARDS])


def parse(kind: str, name: str, fields: list[str] | None = None, run: Path = RUN):
    return parsers.parse_file(kind, run / name, fields)


@runs
def test_query_gpu_with_and_without_header_agree(run: Path) -> None:
    header = parse("gpus", "query-gpu-header.csv", run=run)
    bare = parse("gpus", "query-gpu-noheader-nounits.csv",
                 ["index", "name", "memory.total", "driver_version", "compute_cap", "pci.bus_id", "uuid"], run=run)
    assert header == bare
    assert (header[0]["name"], header[0]["memory_total_mib"]) == CARDS[run]
    assert header[0]["compute_cap"] == "9.0" and header[0]["driver_version"] == "580.159.04"


@runs
def test_compute_apps_show_the_real_process(run: Path) -> None:
    apps = parse("apps", "query-compute-apps.csv", run=run)
    assert [(a["process_name"], a["used_memory_mib"]) for a in apps] == [("python3", 10758)]
    bare = parse("apps", "query-compute-apps-noheader.csv", ["pid", "process_name", "used_gpu_memory"], run=run)
    assert bare[0]["pid"] == apps[0]["pid"]


@runs
def test_tables_version_and_kernel_module(run: Path) -> None:
    idle = parse("smi", "nvidia-smi.txt", run=run)
    busy = parse("smi", "nvidia-smi-with-process.txt", run=run)
    assert idle["processes_state"] == "none_running"
    assert [p["pid"] for p in busy["processes"]] == [parse("apps", "query-compute-apps.csv", run=run)[0]["pid"]]
    assert parse("smi-version", "nvidia-smi-version.txt", run=run)["driver_version"] == "580.159.04"
    module = parse("driver", "proc-driver-nvidia-version.txt", run=run)
    assert (module["version"], module["flavor"]) == ("580.159.04", "open")
    assert parse("nvml", "nvidia-smi.txt", run=run)["status"] == "ok"


@runs
def test_proc_devices_gives_the_uvm_major(run: Path) -> None:
    devices = parsers.parse_proc_devices((run / "proc-devices.txt").read_text(), "proc-devices.txt")
    assert devices.major("nvidia-uvm") == 238 and devices.major("nvidia") == 195


@runs
def test_libraries_come_from_a_bind_mount_with_no_package(run: Path) -> None:
    text = (run / "libraries.txt").read_text()
    targets = {line.split(" -> ")[1] for line in text.splitlines() if " -> " in line}
    assert {parsers.library_version_from_path(t) for t in targets} == {"580.159.04"}
    assert "(no dpkg package)" in text


def test_the_h100s_information_file_names_the_card_nvidia_smi_names() -> None:
    [info] = [parsers.parse_gpu_information(p.read_text(), source=p.name)
              for p in sorted(H100_RUN.glob("proc-driver-nvidia-gpus-*-information.txt"))]
    [gpu] = parse("gpus", "query-gpu-header.csv", run=H100_RUN)
    assert info["name"] == gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert info["uuid"] == gpu["uuid"] and info["bus_location"] == "0000:00:06.0"


def test_the_h200_play_skipped_alignment_and_planned_tp1() -> None:
    log = (RUN / "play.log").read_text()
    assert "alignment skipped" in log and "not package managed" in log
    assert "tp_size                 1" in log
    assert "failed=0" in log and "changed=0" in log


def test_the_h100_play_planned_on_its_own_gpus_and_said_what_would_fit() -> None:
    """The H100 is in no inventory group: the play says it plans on the card nvidia-smi reports, leaves the bind-mounted
    libraries alone, and the planner refuses the catalogue's models at block 16 on one 80 GB card, naming what would
    fit (tests/test_planner.py holds each suggestion against a plan); run.sh counts that refusal as a result."""
    log = (H100_RUN / "play.log").read_text()
    assert ("localhost is in no group with dflash_expected_hardware: planned on its own GPUs\n        as nvidia-smi "
            "reports them, 1x NVIDIA H100 80GB HBM3 (81559 MiB, compute capability\n        9.0).") in log
    assert "not_package_managed: libnvidia-ml.so.1 resolves to /usr/local/nvidia/lib64" in log
    assert ("Qwen3.6-27B does not fit on 1x NVIDIA H100 80GB HBM3 (81559 MiB): tp 1: the linear-attention state pool "
            "holds no request (5.2 GiB left after weights). What would fit: at tp 1: speculative.block_size 6") in log
    assert "undefined" not in log and "changed=0" in log
    assert log.rstrip().endswith("play.log says what would fit): a result")


@pytest.fixture(params=list(CARDS), ids=[p.name for p in CARDS])
def overhead(request: pytest.FixtureRequest) -> dict:
    loaded: dict = json.loads((request.param / "overhead.json").read_text())
    return loaded


def test_fixed_overhead_fits_the_planners_constants(overhead: dict) -> None:
    # Measured: CUDA context + cuBLAS workspace of one process. The engine's own heuristic budgets 512 MiB of
    # constant overhead, less than measured; the planner's draft-worker allowance adds another 512 MiB
    # constant, so the plan as a whole covers the measurement (documented in dflash_infra/memory.py).
    measured = overhead["fixed_overhead_mib"]
    assert measured > 512, "the engine's 512 MiB constant alone would be enough; revisit the allowance"
    assert measured <= 512 + memory.draft_worker_reserved_mib(0)
    # nvidia-smi's total (what SGLang's heuristic reads) exceeds what CUDA can hand out.
    assert overhead["total_mib"] < next(mib for name, mib in CARDS.values() if name == overhead["gpu"])


def test_allocations_carry_no_hidden_overhead(overhead: dict) -> None:
    assert abs(overhead["alloc_overhead_mib"]) <= 64
