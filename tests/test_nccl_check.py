"""The NCCL check's own logic (runs on GPU hosts): unit environment parsing and the wrong-environment refusal.

The JSON reports of the real H200 run (one GPU: a one-rank group, and two refusals) are fixtures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "device"))
import nccl_check  # noqa: E402

RUN = ROOT / "tests" / "fixtures" / "nvidia" / "h200-device-run"
UNIT = """[Service]
Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"
Environment="CUDA_VISIBLE_DEVICES=0,1"
Environment="NCCL_DEBUG=WARN"
ExecStart=/opt/sglang/venv/bin/python /usr/local/lib/dflash-infra/sglang-launch sglang.launch_server \\
    --model-path /root/models/Qwen3.6-27B \\
    --tp-size 2 \\
    --mem-fraction-static 0.775
"""


def report(name: str) -> dict:
    text = (RUN / name).read_text()
    return json.loads(text[text.index("{"):])


def test_unit_environment_and_tp_come_from_the_rendered_unit() -> None:
    env, tp = nccl_check.unit_environment(UNIT)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "WARN"}
    assert tp == 2
    assert nccl_check.environment_problems(env, tp, host_gpus=2) == []


def test_two_ranks_on_one_visible_gpu_are_refused() -> None:
    problems = nccl_check.environment_problems({"CUDA_VISIBLE_DEVICES": "0"}, 2, host_gpus=1)
    assert problems == ["2 ranks need 2 GPUs, but CUDA_VISIBLE_DEVICES=0 exposes 1; render the unit from a plan "
                        "whose gpu_ids cover tp x dp"]
    assert "lacks" in nccl_check.environment_problems({"CUDA_VISIBLE_DEVICES": "0,3"}, 2, host_gpus=2)[0]


def test_the_h200_run() -> None:
    ok = report("nccl-tp1.txt")
    assert ok["status"] == "ok" and ok["allreduce"]["sum_ok"] and ok["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert ok["environment"]["NCCL_NVLS_ENABLE"] == "0"
    for name in ("nccl-tp2-refused.txt", "nccl-tp2-one-visible.txt"):
        refused = report(name)
        assert refused["status"] == "refused" and refused["ranks"] == 2
        assert "2 ranks need 2 GPUs" in refused["problems"][0]
