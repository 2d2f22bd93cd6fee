"""Properties every plan keeps, over random GPU inventories, models and overrides."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_infra import catalogue
from dflash_infra.models import model_spec
from dflash_infra.planner import plan_dict

TARGETS = ["Qwen3.6-27B", "Qwen3.5-27B", "Qwen3-8B", "Qwen3-Next-80B-A3B-Instruct"]
GPU_KINDS = [("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, "12.0"),
             ("NVIDIA RTX A6000", 49140, "8.6"), ("NVIDIA H200", 143771, "9.0"),
             ("NVIDIA GeForce RTX 4090", 24564, "8.9"), ("NVIDIA H100 80GB HBM3", 81559, "9.0")]


@st.composite
def requests(draw: st.DrawFn) -> dict:
    name, mib, cc = draw(st.sampled_from(GPU_KINDS))
    count = draw(st.integers(min_value=1, max_value=8))
    target = draw(st.sampled_from(TARGETS))
    speculative = target == "Qwen3.6-27B" and draw(st.booleans())
    overrides = draw(st.fixed_dictionaries({}, optional={
        "tp_size": st.sampled_from([1, 2, 3, 4, 6, 8]),
        "dp_size": st.integers(min_value=1, max_value=4),
        "mem_fraction_static": st.floats(min_value=0.3, max_value=0.95).map(lambda f: round(f, 3)),
        "max_running_requests": st.integers(min_value=1, max_value=64),
    }))
    req = {
        "gpus": [{"index": i, "name": name, "memory_total_mib": mib, "compute_cap": cc} for i in range(count)],
        "target": {"name": target},
        "sglang_version": draw(st.sampled_from(["0.5.23", "0.5.19"])),
        "overrides": overrides,
        "speculative": {"algorithm": "none"},
    }
    if speculative:
        block = draw(st.integers(min_value=1, max_value=16))
        req["draft"] = {"name": "Qwen3.6-27B-DFlash"}
        req["speculative"] = {"algorithm": "dflash", "block_size": block,
                              "draft_window": draw(st.integers(min_value=block, max_value=16)),
                              "max_draft_tokens": 16}
        if draw(st.booleans()):  # DDTree (SGLang PR #29907) on a build that has it
            req["sglang_version"] = "0.5.23+ddtree"
            req["speculative"].update(algorithm="ddtree", tree_budget=draw(st.integers(min_value=1, max_value=16)))
    return req


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_plan_invariants(req: dict) -> None:
    result = plan_dict(req)
    overrides = req["overrides"]
    if result["errors"]:
        # A refused plan renders no command line.
        assert result["args"] == []
        return
    tp, dp = result["tp_size"], result["dp_size"]
    target = model_spec(catalogue.config(req["target"]["name"]))
    # TP divides the heads of every model it splits.
    assert target.tp_problems(tp) == []
    if "draft" in req:
        assert model_spec(catalogue.config("Qwen3.6-27B-DFlash")).tp_problems(tp) == []
    assert tp * dp <= len(req["gpus"])
    assert 0 < result["mem_fraction_static"] < 1
    # A plan never exceeds GPU memory: weights + pools fit the static pool, plus the reserve.
    per_gpu = result["per_gpu"]
    used = per_gpu["weights_gib"] + per_gpu["kv_pool_gib"] + per_gpu["mamba_pool_gib"] + per_gpu["reserved_gib"]
    assert used <= per_gpu["gpu_gib"] + 0.05
    assert result["max_running_requests"] >= 1 and result["kv_cache_tokens"] >= 1
    assert result["context_length"] <= result["kv_cache_tokens"]
    # Overrides are never silently ignored: an accepted override is in the plan and in the argv.
    if "tp_size" in overrides:
        assert tp == overrides["tp_size"]
    if "dp_size" in overrides:
        assert dp == overrides["dp_size"]
    if "mem_fraction_static" in overrides:
        assert result["mem_fraction_static"] == overrides["mem_fraction_static"]
    if "max_running_requests" in overrides:
        assert result["max_running_requests"] == overrides["max_running_requests"]
    args = result["args"]
    assert args[args.index("--tp-size") + 1] == str(tp)
    # DDTree runs as PR #29907 defines it: its algorithm and budget, page size 1, no overlap scheduling,
    # and the verify width budget + 1 is what the memory model priced.
    if req["speculative"]["algorithm"] == "ddtree":
        budget = req["speculative"]["tree_budget"]
        assert args[args.index("--speculative-algorithm") + 1] == "DDTREE"
        assert args[args.index("--speculative-ddtree-budget") + 1] == str(budget)
        assert args[args.index("--page-size") + 1] == "1" and "--disable-overlap-schedule" in args
        assert result["speculative"]["verify_tokens"] == budget + 1
    elif "draft" in req:
        assert args[args.index("--speculative-algorithm") + 1] == "DFLASH"
        assert "--speculative-ddtree-budget" not in args and "--page-size" not in args
    assert args[args.index("--mem-fraction-static") + 1] == f"{result['mem_fraction_static']:g}"
