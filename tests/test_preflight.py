"""Preflight refuses the wrong container with a message naming both sides."""

from __future__ import annotations

from dflash_infra.catalogue import expected_gpus
from dflash_infra.preflight import hardware_problems

PRO6000 = {"gpu_name": "NVIDIA RTX PRO 6000 Blackwell", "gpu_count": 8, "memory_total_mib": 97887,
           "compute_cap": "12.0"}
A6000_GPUS = [{"index": i, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140, "compute_cap": "8.6"}
              for i in range(2)]


def test_the_right_host_passes_with_an_edition_suffix() -> None:
    gpus = [dict(g, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition") for g in expected_gpus(PRO6000)]
    assert hardware_problems("ct200", "pro6000", PRO6000, gpus) == []


def test_the_wrong_container_is_refused_naming_both() -> None:
    problems = hardware_problems("ct129", "pro6000", PRO6000, A6000_GPUS)
    assert problems == ["ct129 has 2x NVIDIA RTX A6000 (49140 MiB); group pro6000 expects 8x NVIDIA RTX PRO 6000 "
                        "Blackwell (97887 MiB), compute capability 12.0. Refusing to deploy. Check -l / inventory."]


def test_a_missing_gpu_is_refused() -> None:
    assert hardware_problems("ct200", "pro6000", PRO6000, expected_gpus(PRO6000)[:7])


def test_ecc_memory_change_is_noticed() -> None:
    hw = {"gpu_name": "NVIDIA RTX A6000", "gpu_count": 2, "memory_total_mib": 49140, "compute_cap": "8.6"}
    ecc_on = [dict(g, memory_total_mib=46068) for g in A6000_GPUS]
    assert "46068 MiB" in hardware_problems("ct129", "eval", hw, ecc_on)[0]


def test_no_gpu_visible() -> None:
    assert "no GPU visible" in hardware_problems("ct200", "pro6000", PRO6000, [])[0]


def test_shm_for_tp_groups() -> None:
    from dflash_infra.preflight import shm_problems
    assert shm_problems("ct200", 1, 64 * 2**20) == []
    assert shm_problems("ct200", 2, 2 * 2**30) == []
    assert "found 64 MiB" in shm_problems("ct200", 2, 64 * 2**20)[0]
    assert "found none mounted" in shm_problems("ct200", 2, None)[0]


def test_port_free_or_ours() -> None:
    from dflash_infra.preflight import parse_ss_listeners, port_problems
    ss = ('LISTEN 0      2048     127.0.200.1:30000      0.0.0.0:*    users:(("python",pid=812,fd=9))\n')
    listeners = parse_ss_listeners(ss)
    assert listeners == [{"local": "127.0.200.1:30000", "process": "python", "pid": 812}]
    assert port_problems("ct200", 30000, listeners, own_pids=[812]) == []
    assert port_problems("ct200", 30000, [], own_pids=[]) == []
    message = port_problems("ct200", 30000, listeners, own_pids=[])[0]
    assert "held by python (pid 812)" in message and "not the engine service" in message
