"""Preflight refuses the wrong container with a message naming both sides."""

from __future__ import annotations

from dflash_infra import preflight
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
    from dflash_infra.preflight import holder_problems
    ours = {"pid": 812, "process": "python", "unit": "sglang-qwen.service", "local": "127.0.200.1:30000"}
    stray = {"pid": 901, "process": "python3", "unit": "stray-server.service", "local": "127.0.200.1:30000"}
    assert holder_problems("ct200", 30000, [ours], "sglang-qwen.service", "127.0.200.1") == []
    assert holder_problems("ct200", 30000, [], "sglang-qwen.service", "127.0.200.1") == []
    [message] = holder_problems("ct200", 30000, [stray], "sglang-qwen.service", "127.0.200.1")
    assert "held by python3 (pid 901, unit stray-server.service, on 127.0.200.1:30000)" in message
    assert "not the engine service this deploy manages (sglang-qwen.service)" in message


def test_behind_the_gateway_each_port_belongs_to_its_own_unit() -> None:
    def listener(pid: int, unit: str, local: str) -> dict[str, object]:
        return {"pid": pid, "process": "python", "unit": unit, "local": local}
    replicas = [{"name": f"sglang-qwen-r{i}.service", "host": "127.0.0.1", "port": 30001 + i} for i in range(2)]
    state = {"ports": {"30000": [listener(5, "sglang-qwen.service", "0.0.0.0:30000")],  # migrated by this deploy
                       "30001": [listener(6, "sglang-qwen-r0.service", "127.0.0.1:30001")],
                       "30002": [listener(7, "sglang-qwen-r0.service", "127.0.0.1:30002")],
                       "29000": [listener(8, "smg-gateway.service", "127.0.0.1:29000")]}}
    [wrong] = preflight.serving_problems("ct200", state, 1, 30000, "sglang-qwen.service", "0.0.0.0", replicas,
                                         "smg-gateway.service", [(29000, "127.0.0.1")])
    assert wrong.startswith("ct200: port 30002 is held by python (pid 7, unit sglang-qwen-r0.service") and \
        "not the engine service this deploy manages (sglang-qwen-r1.service)" in wrong
    stranger = {"ports": {"30000": [listener(9, "nginx.service", "0.0.0.0:30000")]}}
    [taken] = preflight.serving_problems("ct200", stranger, 1, 30000, "sglang-qwen.service", "0.0.0.0", replicas,
                                         "smg-gateway.service", [(29000, "127.0.0.1")])
    assert "not a service this deploy runs there (smg-gateway.service, sglang-qwen.service)" in taken
    # The metrics port: another host's gateway on its own address of a shared network is not in the way (two labs
    # of one machine), a stranger on the gateway's address is, and the way out names the setting.
    other = {"ports": {"29000": [{"pid": None, "process": None, "unit": "", "local": "127.1.200.1:29000"}]}}
    assert preflight.serving_problems("ct200", other, 1, 30000, "sglang-qwen.service", "0.0.0.0", replicas,
                                      "smg-gateway.service", [(29000, "127.0.0.1")]) == []
    metrics = {"ports": {"29000": [listener(11, "prometheus.service", "127.0.0.1:29000")]}}
    [held] = preflight.serving_problems("ct200", metrics, 1, 30000, "sglang-qwen.service", "0.0.0.0", replicas,
                                        "smg-gateway.service", [(29000, "127.0.0.1")])
    assert "port 29000 is held by python (pid 11, unit prometheus.service" in held
    assert "choose another dflash_gateway_settings.prometheus_port" in held
    # A one-process plan on a host that serves through the gateway: said as such, with the two ways out.
    routed = {"ports": {"30000": [listener(10, "smg-gateway.service", "0.0.0.0:30000")]}}
    [back] = preflight.serving_problems("ct200", routed, 1, 30000, "sglang-qwen.service", "0.0.0.0", (),
                                        "smg-gateway.service")
    assert "this host serves through the SGLang Model Gateway" in back and "dflash_serve_through_gateway: true" in back
    assert "ansible-playbook playbooks/stop_serving.yml -l ct200" in back


def test_a_listener_on_another_address_of_a_shared_network_does_not_take_the_port() -> None:
    # Containers may share one network namespace (the lab's do): another host's engine on its own address is not
    # in the way, a wildcard listener on either side is.
    from dflash_infra.preflight import holder_problems, overlaps
    other = {"pid": None, "process": None, "unit": "", "local": "127.0.200.1:30000"}
    assert holder_problems("ct129", 30000, [other], "sglang-qwen.service", "127.0.129.1") == []
    assert "a process of another PID namespace" in holder_problems("ct129", 30000, [other], "sglang-qwen.service",
                                                                   "0.0.0.0")[0]
    assert overlaps("127.0.129.1", "0.0.0.0:30000") and overlaps("::", "[::1]:30000")
    assert not overlaps("127.0.129.1", "[::1]:30000")


def test_an_endpoint_beyond_loopback_needs_a_key_or_a_deliberate_choice() -> None:
    [problem] = preflight.endpoint_problems("ct200", "0.0.0.0", 30000, api_key_set=False, allow_anonymous=False)
    assert problem.startswith("ct200: the endpoint would listen on 0.0.0.0:30000, beyond loopback, with no API key")
    assert "vault_dflash_service_api_key" in problem and "dflash_service_allow_anonymous: true" in problem
    assert preflight.endpoint_problems("ct200", "0.0.0.0", 30000, api_key_set=True, allow_anonymous=False) == []
    assert preflight.endpoint_problems("ct200", "0.0.0.0", 30000, api_key_set=False, allow_anonymous=True) == []
    for loopback in ("127.0.200.1", "::1", "localhost"):
        assert preflight.endpoint_problems("ct200", loopback, 30000, False, False) == []
    assert preflight.endpoint_problems("ct200", "ct200.internal", 30000, False, False)  # a name is not loopback
    # The replicas of a host another host's gateway fronts are its endpoint: named by their own setting.
    [replicas] = preflight.endpoint_problems("ct201", "0.0.0.0", 30001, False, False, "dflash_worker_listen")
    assert replicas.startswith("ct201: the endpoint would listen on 0.0.0.0:30001, beyond loopback, with no API key")
    assert "(dflash_worker_listen)" in replicas and "(dflash_service_listen)" not in replicas
