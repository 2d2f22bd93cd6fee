"""host_state: the dflash_host_state module run for real on this machine, and the controller's reading of its
result (dflash_infra.host_state, plan_inputs, preflight) on real captures from the H200 test machine."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from dflash_infra import host_state, plan_inputs, preflight
from helpers import ROOT, run, tool

H200 = ROOT / "tests" / "fixtures" / "nvidia" / "h200-device-run"
H200_MACHINE = ROOT / "tests" / "fixtures" / "nvidia" / "h200-test-machine"
INFORMATION = (H200_MACHINE / "proc-driver-nvidia-gpus-0000_00_06.0-information.txt").read_text()
GPU_FIELDS = ["index", "name", "memory.total", "driver_version", "compute_cap", "pci.bus_id", "uuid"]
APP_FIELDS = ["pid", "process_name", "used_gpu_memory"]
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n"
H200_HARDWARE = {"group": "h200", "gpu_name": "NVIDIA H200", "gpu_count": 1, "memory_total_mib": 143771,
                 "compute_cap": "9.0"}


def raw_state(smi_rc: int = 0, smi_out: str | None = None) -> dict[str, Any]:
    """A dflash_host_state result as the module returns it on the H200 test machine (its real captures)."""
    ok = smi_rc == 0
    return {
        "nvidia": {
            "proc": {"dir": "/proc/driver/nvidia", "version": (H200 / "proc-driver-nvidia-version.txt").read_text(),
                     "gpus": [{"bus": "0000:00:06.0", "information": INFORMATION}]},
            "smi": {"gpu_fields": GPU_FIELDS, "app_fields": APP_FIELDS,
                    "gpus": {"rc": smi_rc, "stderr": "",
                             "stdout": (H200 / "query-gpu-noheader-nounits.csv").read_text() if ok
                             else (smi_out or MISMATCH)},
                    "apps": ({"rc": 0, "stderr": "", "stdout": (H200 / "query-compute-apps-noheader.csv").read_text()}
                             if ok else None)},
        },
        "userspace": {"probe": "arch\tamd64\nlib\tlibnvidia-ml.so.1\t/usr/local/nvidia/lib64/libnvidia-ml.so.1\t"
                               "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04\t\n",
                      "debs": [], "dpkg": {"audit": "", "audit_rc": 0, "apt_check_rc": 0}},
    }


def test_a_working_host_is_identified_by_nvidia_smi() -> None:
    state = host_state.normalize(raw_state())
    assert state["smi"]["status"] == "ok"
    assert state["identity"]["source"] == "nvidia-smi"
    assert [(g["name"], g["memory_total_mib"]) for g in state["identity"]["gpus"]] == [("NVIDIA H200", 143771)]
    assert [p["pid"] for p in state["gpu_processes"]] == [466]
    assert state["kernel_module"]["version"] == "580.159.04"
    assert state["driver"]["status"] == "not_package_managed"
    assert state["gpu_information"][0]["uuid"] == "GPU-ee3729f3-f3e0-707b-4478-8312f077d0e1"
    assert preflight.identity_problems("h200", H200_HARDWARE, state["identity"]) == []
    assert plan_inputs.plan_gpus(state, H200_HARDWARE) == state["gpus"]


def test_a_host_in_a_driver_library_mismatch_is_identified_from_proc() -> None:
    # The CT129 incident: NVML refuses to start, but the kernel module's information files still name the GPUs.
    state = host_state.normalize(raw_state(smi_rc=18))
    assert state["smi"]["status"] == "mismatch" and state["gpus"] == [] and state["gpu_processes"] == []
    assert state["identity"] == {"source": "/proc/driver/nvidia/gpus", "gpus": [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-ee3729f3-f3e0-707b-4478-8312f077d0e1",
         "pci_bus_id": "0000:00:06.0", "memory_total_mib": None, "compute_cap": None}]}
    assert preflight.identity_problems("h200", H200_HARDWARE, state["identity"]) == []
    # The plan uses the group's memory until the driver is aligned (nvidia-smi cannot tell it).
    assert [g["memory_total_mib"] for g in plan_inputs.plan_gpus(state, H200_HARDWARE)] == [143771]


def test_a_mismatched_host_of_another_kind_is_still_refused() -> None:
    state = host_state.normalize(raw_state(smi_rc=18))
    a6000 = {"group": "eval", "gpu_name": "NVIDIA RTX A6000", "gpu_count": 2, "memory_total_mib": 49140,
             "compute_cap": "8.6"}
    [message] = preflight.identity_problems("ct129", a6000, state["identity"])
    assert message == ("ct129 has 1x NVIDIA H200 (read from /proc/driver/nvidia/gpus: nvidia-smi cannot run); "
                       "group eval expects 2x NVIDIA RTX A6000 (49140 MiB). Refusing to deploy. Check -l / inventory.")


def test_no_gpu_at_all_is_refused_with_where_it_looked() -> None:
    raw = raw_state(smi_rc=18)
    raw["nvidia"]["proc"]["gpus"] = []
    state = host_state.normalize(raw)
    assert state["identity"] == {"source": "none", "gpus": []}
    assert "neither to nvidia-smi nor in /proc/driver/nvidia/gpus" in preflight.identity_problems(
        "ct200", H200_HARDWARE, state["identity"])[0]
    assert plan_inputs.plan_gpus(state, H200_HARDWARE) == []


def test_an_offline_plan_uses_the_groups_hardware() -> None:
    assert [g["name"] for g in plan_inputs.plan_gpus({}, H200_HARDWARE)] == ["NVIDIA H200"]


def test_the_plan_uses_verified_copies_on_the_host_and_the_catalogue_before_the_first_sync() -> None:
    catalogue = {"target": {"name": "Qwen3.6-27B", "path": "/root/models/Qwen3.6-27B"},
                 "draft": {"name": "Qwen3.6-27B-DFlash", "path": "/root/models/Qwen3.6-27B-DFlash"}}
    spec = {"algorithm": "dflash"}
    before = plan_inputs.plan_models(catalogue, {}, spec)
    assert before["target"]["weights_bytes"] == 55562855904 and before["target"]["config"]["model_type"]
    synced_config = dict(before["target"]["config"], note="the host's own copy")
    state = {"models": {
        "target": {"name": "Qwen3.6-27B", "path": "/root/models/Qwen3.6-27B",
                   "describe": {"present": True, "config": synced_config, "index_total_size": 55000000000},
                   "stamp": {"matches": True, "state_digest": "ab" * 32}},
        "draft": {"name": "Qwen3.6-27B-DFlash", "path": "/root/models/Qwen3.6-27B-DFlash",
                  "describe": {"present": True, "config": before["draft"]["config"]},
                  "stamp": {"matches": False, "state_present": True, "state_digest": "cd" * 32}}}}
    after = plan_inputs.plan_models(catalogue, state, spec)
    assert after["target"]["config"]["note"] == "the host's own copy"
    assert after["target"]["weights_bytes"] == 55000000000
    # A folder that differs from its verified state is not trusted: the catalogue's figures are used.
    assert after["draft"]["weights_bytes"] == before["draft"]["weights_bytes"]
    assert plan_inputs.manifests(catalogue, state) == {
        "target": {"path": "/root/models/Qwen3.6-27B", "manifest_sha256": "ab" * 32},
        "draft": {"path": "/root/models/Qwen3.6-27B-DFlash", "manifest_sha256": None}}
    assert "draft" not in plan_inputs.plan_models(catalogue, state, {"algorithm": "none"})


def test_files_are_matched_directly_or_as_children_of_a_listed_folder() -> None:
    entry = {"exists": True, "kind": "file", "sha256": "11" * 32, "mode": "0644", "owner": "root", "group": "root"}
    state = {"files": {"/etc/apt/x.pref": dict(entry),
                       "/usr/local/lib/dflash-infra": {"exists": True, "kind": "dir", "mode": "0755", "owner": "root",
                                                       "group": "root", "children": {"sglang-ready": dict(entry)}}}}
    assert host_state.file_matches(state, "/etc/apt/x.pref", "11" * 32, "0644", "root", "root")
    assert not host_state.file_matches(state, "/etc/apt/x.pref", "22" * 32)
    assert not host_state.file_matches(state, "/etc/apt/x.pref", "11" * 32, "0600")
    assert host_state.file_matches(state, "/usr/local/lib/dflash-infra/sglang-ready", "11" * 32, "0644")
    assert not host_state.file_matches(state, "/nowhere", "11" * 32)
    assert host_state.dir_matches(state, "/usr/local/lib/dflash-infra", "0755", "root", "root")
    assert not host_state.dir_matches(state, "/usr/local/lib/dflash-infra", "0700")
    assert host_state.existing(state, ["/nowhere", "/etc/apt/x.pref"]) == ["/etc/apt/x.pref"]
    assert host_state.path_entry(state, "/nowhere") == {"path": "/nowhere", "exists": False}


# ---------------------------------------------------------------------------------------------
# The module itself, run by ansible on this machine against a tree that looks like a GPU host
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def gpu_host(tmp_path: Path) -> dict[str, Any]:
    """A /proc/driver/nvidia stand-in, an nvidia-smi stand-in printing the H200's real CSV, a venv, files."""
    proc = tmp_path / "proc-nvidia"
    (proc / "gpus" / "0000:00:06.0").mkdir(parents=True)
    (proc / "version").write_text((H200 / "proc-driver-nvidia-version.txt").read_text())
    (proc / "gpus" / "0000:00:06.0" / "information").write_text(INFORMATION)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n"
                   f"  --query-gpu=*) cat {H200 / 'query-gpu-noheader-nounits.csv'} ;;\n"
                   f"  --query-compute-apps=*) cat {H200 / 'query-compute-apps-noheader.csv'} ;;\nesac\n")
    smi.chmod(0o755)
    venv = tmp_path / "venv"
    dist = venv / "lib" / "python3.11" / "site-packages" / "sglang-0.5.23.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\nbody\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion_info = 3.12.3\n")
    (venv / "installed-lock.txt").write_text("# the lock\n")
    caps = {"name": "sglang", "version": "0.5.23", "flags": ["--help"]}
    (venv / "dflash-capabilities.json").write_text(json.dumps(caps))
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "deployment.json").write_text(json.dumps({"unit_sha256": "ab"}))
    (state_dir / "secret.env").write_text("SGLANG_API_KEY=not-returned\n")
    return {"root": tmp_path, "proc": proc, "smi": smi, "venv": venv, "state_dir": state_dir}


def run_module(args: dict[str, Any], *extra: str) -> dict[str, Any]:
    """dflash_host_state through `ansible localhost -m`, its JSON result (ansible's one-line callback)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    proc = run([tool("ansible"), "localhost", "-c", "local", "-i", "localhost,", "-e",
                "ansible_python_interpreter=/usr/bin/python3", "-m", "dflash_host_state", "-a", json.dumps(args),
                *extra],
               env=env)
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result


def test_the_module_reads_a_gpu_host_in_one_call_and_changes_nothing(gpu_host: dict[str, Any]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    before = {p: p.stat().st_mtime_ns for p in gpu_host["root"].rglob("*")}
    try:
        result = run_module({
            "nvidia": {"nvidia_smi": str(gpu_host["smi"]), "proc_dir": str(gpu_host["proc"]),
                       "gpu_fields": GPU_FIELDS, "app_fields": APP_FIELDS},
            "files": [{"path": str(gpu_host["state_dir"]), "children": True}, {"path": "/nowhere/at/all"}],
            "users": ["root", "no-such-user-dflash"], "groups": ["root", "no-such-group-dflash"],
            "venvs": [{"path": str(gpu_host["venv"]),
                       "capabilities_file": str(gpu_host["venv"] / "dflash-capabilities.json"),
                       "lock_file": str(gpu_host["venv"] / "installed-lock.txt"), "interpreter": "/usr/bin/python3"},
                      {"path": str(gpu_host["root"] / "no-venv-yet"), "interpreter": "/usr/bin/python3",
                       "lock_file": str(gpu_host["root"] / "no-lock-yet.txt")}],
            "ports": [port], "filesystems": [str(gpu_host["root"] / "not-yet" / "models")],
            "health": [{"url": f"http://127.0.0.1:{server.server_address[1]}/", "timeout": 5}],
        }, "--check")
    finally:
        listener.close()
        server.shutdown()
    assert result["changed"] is False and "failed" not in result, result
    # The action plugin of the same name ran the module and parsed what it read into the fact.
    state = result["ansible_facts"]["host_state_current"]
    assert state["identity"]["source"] == "nvidia-smi" and state["gpus"][0]["name"] == "NVIDIA H200"
    assert state["gpu_information"][0]["bus_location"] == "0000:00:06.0"
    children = state["files"][str(gpu_host["state_dir"])]["children"]
    assert children["deployment.json"]["json"] == {"unit_sha256": "ab"}
    assert "content" not in children["secret.env"] and "not-returned" not in json.dumps(result)
    assert state["files"]["/nowhere/at/all"] == {"path": "/nowhere/at/all", "exists": False}
    assert state["accounts"]["users"]["root"]["uid"] == 0 and state["accounts"]["users"]["no-such-user-dflash"] is None
    assert state["accounts"]["groups"]["no-such-group-dflash"] is None
    venv = state["venvs"][str(gpu_host["venv"])]
    assert venv["distributions"]["sglang"] == "0.5.23" and venv["capabilities"]["json"]["version"] == "0.5.23"
    # The venv's Python from its pyvenv.cfg; the lock it was installed from by hash; no interpreter asked.
    assert venv["python_version"] == "3.12.3" and "interpreter_version" not in venv
    assert venv["lock"]["sha256"] == hashlib.sha256(b"# the lock\n").hexdigest()
    missing = state["venvs"][str(gpu_host["root"] / "no-venv-yet")]
    assert missing["python"] is False and missing["lock"]["exists"] is False
    assert missing["interpreter_version"] == state["system"]["platform"]["python"]  # the module's own /usr/bin/python3
    [holder] = state["ports"][str(port)]
    assert holder["pid"] == os.getpid() and holder["local"] == f"127.0.0.1:{port}"
    fs = state["system"]["filesystems"][str(gpu_host["root"] / "not-yet" / "models")]
    assert fs["exists"] is False and fs["measured_at"] == str(gpu_host["root"]) and fs["free_bytes"] > 0
    assert next(iter(state["health"].values()))["status"] == 200
    assert state["system"]["platform"]["python"].startswith("3.")
    assert before == {p: p.stat().st_mtime_ns for p in gpu_host["root"].rglob("*")}


def test_the_module_reads_only_the_sections_asked_for(gpu_host: dict[str, Any]) -> None:
    result = run_module({"sections": ["nvidia"], "nvidia": {"nvidia_smi": "/nonexistent/nvidia-smi",
                                                             "proc_dir": str(gpu_host["proc"])}})
    state = result["ansible_facts"]["host_state_current"]
    assert state["read"]["sections"] == ["nvidia"] and state["sections"] == ["nvidia"]
    assert set(state["read"]["seconds"]) == {"nvidia"}
    assert state["smi"]["status"] == "absent" and state["identity"]["source"] == "/proc/driver/nvidia/gpus"


def test_the_module_says_which_entry_lacks_its_path() -> None:
    result = run_module({"files": [{"path": "/etc/hostname"}, {"content": True}]})
    assert result["failed"] is True
    assert result["msg"] == ("dflash_host_state: expected every entry of files to have a path, found entries [1] "
                             "without one")


def test_the_module_refuses_an_unknown_section() -> None:
    result = run_module({"sections": ["gpus"]})
    assert result["failed"] is True and "value of sections must be one or more of" in result["msg"]


def test_proc_bus_names_and_information_files_of_the_lab_kit_match_the_real_layout() -> None:
    import sys
    sys.path.insert(0, str(ROOT / "lab" / "kit"))
    import provision  # lab/kit/provision.py
    from dflash_infra import parsers
    profile = {"gpu_model": {"name": "NVIDIA H200", "vbios_version": "96.00.A5.00.1A"},
               "kernel_module": {"version": "580.159.04", "flavor": "open"},
               "gpus": [{"pci_bus_id": "00000000:00:06.0", "uuid": "GPU-ee3729f3-f3e0-707b-4478-8312f077d0e1"}]}
    text = provision.proc_gpu_information(profile, profile["gpus"][0], 0)
    assert provision.proc_bus("00000000:1B:00.0") == "0000:1b:00.0"
    # The stand-in differs from the capture only in the IRQ number.
    assert text.replace("IRQ:   \t\t 40", "IRQ:   \t\t 41") == INFORMATION
    assert parsers.parse_gpu_information(text)["uuid"] == profile["gpus"][0]["uuid"]
    assert stat.S_ISREG(os.stat(H200_MACHINE / "proc-driver-nvidia-gpus-0000_00_06.0-information.txt").st_mode)


def test_the_module_finds_the_training_job_and_compares_model_folders_with_their_verified_state(tmp_path: Path) -> None:
    import subprocess
    import sys
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "dflash-test-train-job"])
    folder = tmp_path / "models" / "Qwen3.6-27B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]}))
    (folder / "config.json").chmod(0o640)
    folder.chmod(0o750)
    try:
        result = run_module({"sections": ["training", "models"],
                             "training": {"match": ["dflash-test-train-job"], "protect_match": ["sglang"]},
                             "models": [{"key": "target", "name": "Qwen3.6-27B", "path": str(folder),
                                         "state_file": str(tmp_path / "state" / "Qwen3.6-27B.manifest.json")}]})
    finally:
        job.kill()
        job.wait()
    state = result["ansible_facts"]["host_state_current"]
    assert [p["pid"] for p in state["training"]["roots"]] == [job.pid]
    model = state["models"]["target"]
    assert model["describe"]["present"] and model["describe"]["config"]["architectures"]
    assert model["stamp"]["state_present"] is False and model["stamp"]["matches"] is False
    assert model["modes"] == {"files": ["0640 root:root"], "dirs": ["0750 root:root"]}
