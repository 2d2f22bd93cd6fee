"""The deploy's summary per host (dflash_infra.summary): one line per stage that ran, in stage order."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from dflash_infra import summary
from helpers import HOST_PYTHON, ROOT, tool

PRO6000 = {"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"}
STATE = {"identity": {"source": "nvidia-smi", "gpus": [PRO6000] * 8},
         "kernel_module": {"version": "595.71.05", "flavor": "open"},
         "driver": {"reason": "user space equals the kernel module (595.71.05)"}}
PLAN = {"tp_size": 2, "dp_size": 4, "gpu_ids": [0, 1, 2, 3, 4, 5, 6, 7], "mem_fraction_static": 0.782,
        "max_running_requests": 31, "context_length": 262144}
MODELS = {"target": {"path": "/root/models/Qwen3.6-27B", "manifest_sha256": "0123456789abcdef" * 4},
          "draft": {"path": "/root/models/Qwen3.6-27B-DFlash", "manifest_sha256": None}}
RECORD = {"deployed_at": "2026-12-01T09:00:00+00:00", "gates": {"state": "ready", "detail": "all gates passed"}}


def inputs(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "state": STATE, "plan": PLAN, "proxmox": {"status": None, "node": "pve1", "audit": None, "snapshot": None},
        "training": {"processes": [{"pid": 1}, {"pid": 2}]},
        "training_record_path": "/var/lib/dflash-infra/stopped-training.json", "models": MODELS,
        "model_root": "/root/models", "synced_this_run": True,
        "engine": {"name": "sglang", "version": "0.5.23", "venv": "/opt/sglang/venv", "probed": True,
                   "lock": {"file": "sglang-0.5.23-py3.12-x86_64-manylinux_2_34.txt", "sha256": "0123456789abcdef" * 4,
                            "packages": 207}},
        "record": RECORD, "url": "http://127.0.0.1:30000", "model_name": "Qwen3.6-27B", "unit": "sglang-qwen.service"}
    return base | changes


def test_a_full_deploy_names_every_stage_in_order() -> None:
    lines = summary.lines(host="ct200", groups=["proxmox_containers", "pro6000"], check_mode=False, **inputs())
    assert lines == [
        "ct200 (pro6000):",
        "GPUs: 8 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition, kernel module 595.71.05 (open)",
        "driver: user space equals the kernel module (595.71.05)",
        "plan: tp 2 x dp 4 on GPUs [0, 1, 2, 3, 4, 5, 6, 7], mem_fraction_static 0.782, max_running_requests 31, "
        "context 262144",
        "training: stopped 2 process(es), record /var/lib/dflash-infra/stopped-training.json",
        "models: target manifest 0123456789abcdef, draft manifest not verified synced and verified at /root/models",
        "engine: sglang 0.5.23 at /opt/sglang/venv, locked by sglang-0.5.23-py3.12-x86_64-manylinux_2_34.txt (207 "
        "packages, sha256 0123456789abcdef)",
        "serving: http://127.0.0.1:30000/v1 (Qwen3.6-27B), unit sglang-qwen.service, record deployed_at "
        "2026-12-01T09:00:00+00:00",
        "gates: ready (all gates passed)",
    ]


def test_check_mode_and_stages_that_did_not_run() -> None:
    lines = summary.lines(host="ct200", groups=["pro6000"], check_mode=True,
                          **inputs(training={"processes": [{"pid": 7}]},
                                   engine={"name": "sglang", "version": "0.5.23", "venv": "/v", "probed": False},
                                   record=None, synced_this_run=None))
    assert lines[0] == "ct200 (pro6000) [check mode: nothing was changed]:"
    assert "training: would stop 1 process(es), record /var/lib/dflash-infra/stopped-training.json" in lines
    assert "engine: would install sglang 0.5.23 at /v" in lines
    assert not any(line.startswith(("serving:", "gates:")) for line in lines)


def test_an_offline_plan_and_a_proxmox_guard() -> None:
    proxmox = {"status": "running", "node": "pve1", "audit": {"status": "ok"},
               "snapshot": {"name": "dflash-align-20261201-090000", "stage": "align"}}
    lines = summary.lines(host="ct129", groups=["eval"], check_mode=False,
                          **inputs(state={}, proxmox=proxmox, training=None, models={}, engine=None, record=None))
    assert lines[1] == "GPUs: not probed (offline plan)"
    assert "container: running on pve1, GPU passthrough ok" in lines
    assert ("snapshot: dflash-align-20261201-090000 before align (back to it: playbooks/rollback.yml -e "
            "dflash_rollback=container)") in lines
    assert not any(line.startswith(("training:", "models:")) for line in lines)


def test_no_training_job_is_said_so() -> None:
    lines = summary.lines(host="ct200", groups=["pro6000"], check_mode=False,
                          **inputs(training={}))
    assert "training: none running" in lines


def test_behind_the_gateway_each_replica_is_named_with_its_gpus_what_the_run_did_and_its_gate() -> None:
    ready = {"state": "ready", "detail": "generated 16 tokens"}
    replicas = [
        {"index": 1, "name": "sglang-qwen-r1.service", "url": "http://127.0.0.1:30002", "gpu_ids": [2, 3],
         "action": "roll", "restarted": False, "drained": False, "gates": ready},
        {"index": 0, "name": "sglang-qwen-r0.service", "url": "http://127.0.0.1:30001", "gpu_ids": [0, 1],
         "action": "roll", "restarted": True, "drained": True, "gates": ready},
        {"index": 2, "name": "sglang-qwen-r2.service", "url": "http://127.0.0.1:30003", "gpu_ids": [4, 5],
         "action": "start", "restarted": True, "drained": False, "gates": ready}]
    record = {"smg": "1.13.0", "venv": "/opt/smg/venv",
              "lock": {"file": "smg-1.13.0-py3.12-x86_64-manylinux_2_34.txt", "sha256": "ab" * 32, "packages": 7}}
    lines = summary.lines(host="ct200", groups=["pro6000"], check_mode=False,
                          **inputs(replicas=replicas, gateway_unit="smg-gateway.service", gateway=record))
    assert lines[-5:] == [
        "serving: http://127.0.0.1:30000/v1 (Qwen3.6-27B) through smg-gateway.service, 3 replica(s)",
        "gateway: smg 1.13.0 at /opt/smg/venv, locked by smg-1.13.0-py3.12-x86_64-manylinux_2_34.txt (7 packages, "
        "sha256 abababababababab)",
        "replica 0: sglang-qwen-r0.service on GPUs 0,1 at http://127.0.0.1:30001, drained, restarted and added back; "
        "gates ready (generated 16 tokens)",
        "replica 1: sglang-qwen-r1.service on GPUs 2,3 at http://127.0.0.1:30002, unchanged; gates ready "
        "(generated 16 tokens)",
        "replica 2: sglang-qwen-r2.service on GPUs 4,5 at http://127.0.0.1:30003, started; gates ready "
        "(generated 16 tokens)"]
    assert not any(line.startswith("gates:") for line in lines)  # the single engine's lines are not shown
    # An engine the run did not restart but gated again (not the process its record named) says why: the record's
    # rewrite is the run's change.
    again = [{**replicas[0], "restarted": False, "drained": False,
              "gated_again": "the running engine is invocation inv-2, the record names inv-1 (a rollback or systemd "
                             "started it since)"}]
    regated = summary.lines(host="ct200", groups=["pro6000"], check_mode=False,
                            **inputs(replicas=again, gateway_unit="smg-gateway.service", gateway=record))
    assert regated[-1] == (
        "replica 1: sglang-qwen-r1.service on GPUs 2,3 at http://127.0.0.1:30002, unchanged, gated again and recorded "
        "as the running engine is invocation inv-2, the record names inv-1 (a rollback or systemd started it since); "
        "gates ready (generated 16 tokens)")
    # The load gate's figures through the gateway, under the gateway's line.
    through = {"figures": [{"concurrency": 96, "requests": 128, "failed": 0, "output_tokens_per_s": 30000.5,
                            "requests_per_s": 460.1, "accept_length_mean": 5.7, "verify_ct": 1450}]}
    loaded = summary.lines(host="ct200", groups=["pro6000"], check_mode=False,
                           **inputs(replicas=replicas, gateway_unit="smg-gateway.service", gateway=record,
                                    gateway_load=through))
    assert loaded[-4] == ("  through the gateway, load at concurrency 96: 128 requests, 0 failed, 30000.5 output "
                          "tok/s, 460.1 req/s, acceptance length 5.7 (verify count 1450)")
    assert loaded[-5].startswith("gateway: smg 1.13.0") and loaded[-3].startswith("replica 0:")
    # --check: what a run would do to each replica, one line each, and no gate (none ran).
    would = {0: "roll", 1: "", 2: "start"}
    planned = [{**r, "would": would[int(r["index"])]} for r in replicas]
    dry = summary.lines(host="ct200", groups=["pro6000"], check_mode=True,
                        **inputs(replicas=planned, gateway_unit="smg-gateway.service", gateway=record))
    assert dry[-3:] == [
        "replica 0: sglang-qwen-r0.service on GPUs 0,1 at http://127.0.0.1:30001, would be drained, restarted and "
        "added back (check mode)",
        "replica 1: sglang-qwen-r1.service on GPUs 2,3 at http://127.0.0.1:30002, unchanged (check mode)",
        "replica 2: sglang-qwen-r2.service on GPUs 4,5 at http://127.0.0.1:30003, would start (check mode)"]


def test_load_lines_give_the_figures_of_each_concurrency_with_latencies_when_streamed() -> None:
    figures = [{"concurrency": 4, "requests": 32, "failed": 0, "output_tokens_per_s": 812.5, "requests_per_s": 12.7,
                "accept_length_mean": 4.9, "verify_ct": 420, "ttft_ms_p50": 41.0, "ttft_ms_p99": 88.5,
                "itl_ms_p50": 6.2, "itl_ms_p99": 9.9},
               {"concurrency": 1, "requests": 32, "failed": 1, "output_tokens_per_s": 150.0, "requests_per_s": 2.3,
                "accept_length_mean": None, "ttft_ms_p50": None, "itl_ms_p50": None}]
    assert summary.load_lines({"figures": figures}, "  ") == [
        "  load at concurrency 4: 32 requests, 0 failed, 812.5 output tok/s, 12.7 req/s, acceptance length 4.9 "
        "(verify count 420), TTFT p50/p99 41.0/88.5 ms, ITL p50/p99 6.2/9.9 ms",
        "  load at concurrency 1: 32 requests, 1 failed, 150.0 output tok/s, 2.3 req/s"]
    assert summary.load_lines(None, "") == []


def test_a_failure_is_told_by_its_message_and_a_hidden_ones_by_its_task_name_only() -> None:
    secret = "sk-team-0123456789"
    hidden = {"failed": True, "msg": f"non-zero return code: {secret}", "stderr": secret, "_ansible_no_log": True}
    told = summary.failure_message(hidden, {"name": "Write the environment file with the secrets"}, "gate failed")
    assert told == "the task [Write the environment file with the secrets] failed; its output is hidden (no_log)"
    assert summary.failure_message(hidden, None) == "a task failed; its output is hidden (no_log)"
    assert summary.failure_message({"failed": True, "msg": "timed out after 600 s"}, {"name": "x"}, "?") == \
        "timed out after 600 s"
    assert summary.failure_message({"failed": True}, {"name": "x"}, "gate failed") == "gate failed"
    assert summary.failure_message(None, None, "the planner failed") == "the planner failed"


def test_a_rescue_never_prints_what_a_no_log_task_hid(ansible_env, tmp_path) -> None:
    """Ansible keeps the raw result of a failed no_log task in ansible_failed_result (its stderr, its arguments): the
    filter every rescue of this tree reads it through says the task's name only; a task without no_log keeps its
    message."""
    play = tmp_path / "rescue.yml"
    play.write_text("""\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Fail with a secret, hidden
      block:
        - name: Write the key file
          ansible.builtin.command: sh -c 'echo sk-hidden-0123 >&2; exit 3'
          no_log: true
      rescue:
        - ansible.builtin.debug:
            msg: "hidden: {{ ansible_failed_result | dflash_failure_message(ansible_failed_task, 'gate failed') }}"
    - name: Fail with a message
      block:
        - ansible.builtin.fail:
            msg: the engine did not come up
      rescue:
        - ansible.builtin.debug:
            msg: "told: {{ ansible_failed_result | dflash_failure_message(ansible_failed_task, 'gate failed') }}"
""")
    proc = subprocess.run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           f"ansible_python_interpreter={HOST_PYTHON}", str(play)], cwd=ROOT,
                          env=ansible_env, capture_output=True, text=True)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, out[-3000:]
    assert "hidden: the task [Write the key file] failed; its output is hidden (no_log)" in out, out[-3000:]
    assert "sk-hidden-0123" not in proc.stdout + proc.stderr
    assert "told: the engine did not come up" in out, out[-3000:]


def test_every_rescue_reads_the_failed_result_through_the_filter_that_honours_no_log() -> None:
    """ansible_failed_result is read in rescues only through dflash_failure_message (a .msg read straight would print
    what a no_log task hid)."""
    raw = re.compile(r"ansible_failed_result(?!\s*\|\s*dflash_failure_message\(ansible_failed_task\b)")
    uses = {str(path.relative_to(ROOT)): len(re.findall("ansible_failed_result", path.read_text()))
            for folder in ("playbooks", "roles") for path in (ROOT / folder).rglob("*.yml")
            if "ansible_failed_result" in path.read_text()}
    assert len(uses) >= 6, uses  # the rescues of the rollout, the gateway, the engine, the canary and the status view
    assert [f"{p}: {m.group(0)}" for p in uses for m in raw.finditer((ROOT / p).read_text())] == []
