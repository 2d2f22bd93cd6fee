"""The planner on the real deployments (pro6000, eval, a single H200) and on the mistakes it must refuse."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dflash_infra import catalogue, engine, memory
from dflash_infra.models import model_spec
from dflash_infra.planner import plan_dict, plan_table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def request(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())


def run(req: dict) -> dict:
    return plan_dict(req, EXAMPLES)


def gpus(n: int, name: str, mib: int, cc: str) -> list[dict]:
    return [{"index": i, "name": name, "memory_total_mib": mib, "compute_cap": cc} for i in range(n)]


@pytest.fixture()
def pro6000() -> dict:
    return request("pro6000")


@pytest.fixture()
def eval_req() -> dict:
    return request("eval")


def test_pro6000_uses_all_gpus_without_errors(pro6000: dict) -> None:
    result = run(pro6000)
    assert result["errors"] == []
    assert result["tp_size"] * result["dp_size"] <= 8
    assert result["tp_size"] == 2 and result["dp_size"] == 4
    assert result["gpu_ids"] == list(range(8))
    assert all(result["reasons"][k] for k in ("tp_size", "dp_size", "mem_fraction_static", "max_running_requests"))
    # TP1 is rejected for capacity, and the reason says so with its numbers.
    assert "tp 1: only" in result["reasons"]["tp_size"]


def test_pro6000_fraction_follows_the_engine_heuristic(pro6000: dict) -> None:
    result = run(pro6000)
    # SGLang 0.5.23 on a 97887 MiB GPU at TP2 reserves 14032 MiB (its memory_hook heuristic: about 0.857 unset);
    # the planner adds 1024 MiB for the draft worker and the engine's own VLM factor for this VL model.
    engine_only = (97887 - 14032) / 97887
    assert round(engine_only, 3) == 0.857
    expected = memory.round_down((97887 - 14032 - 1024) / 97887 * memory.vlm_fraction_factor(
        model_spec(catalogue.config("Qwen3.6-27B"))))
    assert result["mem_fraction_static"] == expected


def test_eval_is_tp2_never_tp1(eval_req: dict) -> None:
    result = run(eval_req)
    assert result["errors"] == []
    assert result["tp_size"] == 2 and result["dp_size"] == 1
    tp1 = next(c for c in result["candidates"] if c["tp"] == 1)
    assert not tp1["fits"] and "weights need" in tp1["problems"][0]


def test_a6000_engine_reserve_matches_the_known_fraction() -> None:
    caps = memory.capacity_defaults(49140, 2)
    reserved = memory.engine_reserved_mib(49140, 2, caps.chunked_prefill_size, caps.cuda_graph_max_bs)
    assert reserved == 7376
    assert round((49140 - reserved) / 49140, 3) == 0.850


def test_single_h200_is_tp1(pro6000: dict) -> None:
    pro6000["gpus"] = gpus(1, "NVIDIA H200", 143771, "9.0")
    result = run(pro6000)
    assert result["errors"] == []
    assert result["tp_size"] == 1 and result["dp_size"] == 1 and result["gpu_ids"] == [0]
    # Hopper is not sm_120: no triton/flashinfer split, no bf16 SSM override.
    assert "--prefill-attention-backend" not in result["args"]


def test_single_24gb_card_is_refused(pro6000: dict) -> None:
    pro6000["gpus"] = gpus(1, "NVIDIA GeForce RTX 4090", 24564, "8.9")
    result = run(pro6000)
    assert result["tp_size"] is None and result["args"] == []
    assert any("does not fit" in e and "24564 MiB" in e for e in result["errors"])


H100 = gpus(1, "NVIDIA H100 80GB HBM3", 81559, "9.0")  # the device machine's card (tests/fixtures/nvidia)


def test_a_plan_that_does_not_fit_says_what_would_and_each_suggestion_plans(pro6000: dict) -> None:
    """1x H100: the drafter's block of 16 leaves the linear-attention pool no request at tp 1. The refusal names the
    largest block that fits at tp 1, the plan without speculative decoding, and the smallest TP that fits the request
    as given; each suggestion, planned, gives the figures the refusal quoted."""
    pro6000["gpus"] = H100
    [error] = run(pro6000)["errors"]
    assert error.startswith("Qwen3.6-27B does not fit on 1x NVIDIA H100 80GB HBM3 (81559 MiB): tp 1: the "
                            "linear-attention state pool holds no request")
    _, _, fits = error.partition(". What would fit: ")
    block, plain, wider = fits.split("; ")
    assert block.startswith("at tp 1: speculative.block_size 6 (draft_window >= 6) fits: ")
    assert plain.startswith("at tp 1: speculative.algorithm none fits: ")
    assert wider.startswith("the request as given fits at tp 2 (on 2 GPUs of 81559 MiB, the host has 1): ")

    def holds(result: dict) -> str:
        return f"{result['max_running_requests']} running request(s), context up to {result['context_length']} tokens"

    smaller = run(dict(pro6000, speculative=dict(pro6000["speculative"], block_size=6)))
    assert smaller["errors"] == [] and smaller["tp_size"] == 1 and block.endswith(holds(smaller))
    assert run(dict(pro6000, speculative=dict(pro6000["speculative"], block_size=7)))["errors"]  # 6 is the largest
    off = dict(pro6000, speculative={"algorithm": "none"})
    off.pop("draft")
    assert plain.endswith(holds(run(off)))
    two = run(dict(pro6000, gpus=gpus(2, "NVIDIA H100 80GB HBM3", 81559, "9.0")))
    assert two["errors"] == [] and two["tp_size"] == 2 and wider.endswith(holds(two))


def test_a_single_a6000_is_told_the_tp_that_fits(eval_req: dict) -> None:
    # The field failure: TP1 on a 48 GB card. The weights alone do not fit; only more GPUs help.
    eval_req["gpus"] = gpus(1, "NVIDIA RTX A6000", 49140, "8.6")
    [error] = run(eval_req)["errors"]
    assert "tp 1: weights need 55.0 GiB per GPU" in error
    assert error.endswith("What would fit: the request as given fits at tp 2 (on 2 GPUs of 49140 MiB, the host has 1): "
                          "2 running request(s), context up to 141312 tokens")


def test_an_override_tp_that_does_not_fit_says_what_would(eval_req: dict) -> None:
    eval_req["overrides"] = {"tp_size": 1}
    [error] = run(eval_req)["errors"]
    assert error.startswith("tp 1: weights need") and error.endswith(
        "What would fit: the request as given fits at tp 2 (on this host): 2 running request(s), context up to 141312 "
        "tokens")


def test_tp_override_3_names_the_head_counts(pro6000: dict) -> None:
    pro6000["overrides"] = {"tp_size": 3}
    result = run(pro6000)
    message = " ".join(result["errors"])
    assert "overrides.tp_size 3" in message
    assert "4 KV heads" in message and "16 linear-attention key heads" in message


def test_draft_window_over_the_cap_is_an_error(pro6000: dict) -> None:
    pro6000["speculative"]["draft_window"] = 32
    result = run(pro6000)
    assert any("draft_window 32 exceeds the deployment's max_draft_tokens 16" in e for e in result["errors"])


def test_window_smaller_than_block_is_an_error(pro6000: dict) -> None:
    pro6000["speculative"].update(block_size=16, draft_window=8)
    assert any("smaller than block_size" in e for e in run(pro6000)["errors"])


def test_unknown_override_is_never_ignored(pro6000: dict) -> None:
    pro6000["overrides"] = {"tensor_parallel": 2}
    assert any("overrides.tensor_parallel: unknown override" in e for e in run(pro6000)["errors"])


def test_fraction_override_that_leaves_no_cache_is_an_error(eval_req: dict) -> None:
    eval_req["overrides"] = {"mem_fraction_static": 0.5}
    result = run(eval_req)
    assert result["errors"], result
    assert "mem_fraction_static" in " ".join(result["errors"]) or "static pool" in " ".join(result["errors"])


def test_fraction_override_above_the_reserve_warns(pro6000: dict) -> None:
    pro6000["overrides"] = {"mem_fraction_static": 0.9}
    result = run(pro6000)
    assert result["errors"] == [] and result["mem_fraction_static"] == 0.9
    assert any("expect OOM" in w for w in result["warnings"])


def test_dp_and_tp_overrides_are_honoured(pro6000: dict) -> None:
    pro6000["overrides"] = {"tp_size": 4, "dp_size": 1}
    result = run(pro6000)
    assert (result["tp_size"], result["dp_size"], result["gpu_ids"]) == (4, 1, [0, 1, 2, 3])
    assert "--dp-size" not in result["args"]


def test_max_running_override_beyond_the_pool_is_an_error(eval_req: dict) -> None:
    eval_req["overrides"] = {"max_running_requests": 40}
    assert any("holds only" in e for e in run(eval_req)["errors"])


def test_context_length_beyond_the_model_is_an_error(pro6000: dict) -> None:
    pro6000["context_length"] = 1_000_000
    assert any("max_position_embeddings 262144" in e for e in run(pro6000)["errors"])


def test_dflash_checks_catch_a_drafter_for_another_target(pro6000: dict) -> None:
    draft = copy.deepcopy(catalogue.config("Qwen3.6-27B-DFlash"))
    draft["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 70]
    draft["dflash_config"]["mask_token_id"] = 300000
    draft["architectures"] = ["LlamaForCausalLM"]
    pro6000["draft"] = {"name": "bad-drafter", "config": draft, "weights_bytes": 3_460_426_240}
    message = " ".join(run(pro6000)["errors"])
    assert "target_layer_ids [70]" in message
    assert "mask_token_id 300000" in message
    assert "not a DFlash drafter" in message


def test_drafter_for_qwen3_8b_does_not_fit_qwen36() -> None:
    req = request("pro6000")
    req["target"] = {"name": "Qwen3-8B"}
    message = " ".join(run(req)["errors"])
    assert "trained for a 64-layer target" in message or "hidden size" in message


def test_speculative_needs_a_drafter(pro6000: dict) -> None:
    del pro6000["draft"]
    assert any("needs a drafter" in e for e in run(pro6000)["errors"])


def test_no_speculative_plan_has_no_draft_flags(pro6000: dict) -> None:
    pro6000["speculative"] = {"algorithm": "none"}
    del pro6000["draft"]
    result = run(pro6000)
    assert result["errors"] == []
    assert not any(a.startswith("--speculative") for a in result["args"])


def test_ddtree_on_upstream_0523_names_the_missing_flag(pro6000: dict) -> None:
    pro6000["speculative"].update(algorithm="ddtree", tree_budget=15)
    result = run(pro6000)
    assert result["args"] == []
    assert any("--speculative-ddtree-budget" in e and "0.5.23" in e and "silently" in e for e in result["errors"])


def test_ddtree_on_an_engine_with_the_flag(pro6000: dict) -> None:
    options = sorted(engine.flag_table("0.5.23").visible | {"--speculative-ddtree-budget"})
    pro6000["speculative"].update(algorithm="ddtree", tree_budget=15)
    pro6000["engine_options"] = options
    result = run(pro6000)
    assert result["errors"] == []
    i = result["args"].index("--speculative-ddtree-budget")
    assert result["args"][i + 1] == "15"
    assert result["args"][result["args"].index("--speculative-algorithm") + 1] == "DDTREE"
    assert result["args"][result["args"].index("--page-size") + 1] == "1"
    assert "--disable-overlap-schedule" in result["args"]
    # Budget 15 with block 16 is PR #29907's default: the plain linear chain, said, not hidden.
    assert any("plain linear chain" in w for w in result["warnings"])


def test_unsupported_engine_version(pro6000: dict) -> None:
    pro6000["sglang_version"] = "0.4.9"
    assert any("sglang_version" in e and "0.5.23" in e for e in run(pro6000)["errors"])


def test_lab_local_version_uses_the_release_table(pro6000: dict) -> None:
    pro6000["sglang_version"] = "0.5.23+lab"
    result = run(pro6000)
    assert result["errors"] == [] and result["engine"]["flag_table"] == "0.5.23"


def test_0519_argv_uses_no_flag_hidden_in_0519(pro6000: dict) -> None:
    pro6000["sglang_version"] = "0.5.19"
    result = run(pro6000)
    assert result["errors"] == []
    table = engine.flag_table("0.5.19")
    flags = [a for a in result["args"] if a.startswith("--")]
    assert flags and all(table.accepts(f) for f in flags)


def test_catalogue_weights_come_from_the_published_manifest() -> None:
    assert catalogue.weights_bytes("Qwen3.6-27B") == 55562855904
    assert catalogue.weights_bytes("Qwen3.6-27B-DFlash") == 1730213120 * 2


def test_shape_estimates_are_close_to_the_published_sizes() -> None:
    target = model_spec(catalogue.config("Qwen3.6-27B"))
    draft = model_spec(catalogue.config("Qwen3.6-27B-DFlash"))
    assert abs(draft.estimated_parameters() - 1730213120) / 1730213120 < 0.01
    assert abs(target.estimated_weight_bytes() - 55562855904) / 55562855904 < 0.08


def test_kv_and_state_sizes_match_the_model_facts() -> None:
    target = model_spec(catalogue.config("Qwen3.6-27B"))
    draft = model_spec(catalogue.config("Qwen3.6-27B-DFlash"))
    assert target.kv_bytes_per_token(2) == 32 * 1024  # ~32 KiB at TP2, bf16
    assert draft.kv_bytes_per_token(2) == 10 * 1024   # ~10 KiB
    # About 1.15 GiB speculative SSM scratch per running request per GPU at TP2, block 16.
    scratch = target.mamba_state_bytes_per_request(2) * 16 / 1024**3
    assert 1.0 < scratch < 1.2


def test_table_has_one_row_per_setting_with_reasons(pro6000: dict) -> None:
    text = plan_table(run(pro6000))
    for key in ("tp_size", "dp_size", "mem_fraction_static", "per_gpu.kv_pool_gib", "engine argv:"):
        assert key in text
    assert "smallest TP" in text


def test_engine_flags_are_rendered_in_name_order_with_their_reason(pro6000: dict) -> None:
    pro6000["overrides"] = {"engine_flags": {"--mamba-radix-cache-strategy": "extra_buffer",
                                             "--disable-overlap-schedule": True,
                                             "--cuda-graph-bs-decode": [1, 2, 4, 8],
                                             "--max-total-tokens": "64k",
                                             "--enable-two-batch-overlap": None}}
    result = run(pro6000)
    assert result["errors"] == []
    args = result["args"]
    tail = args[args.index("--cuda-graph-bs-decode"):]
    assert tail == ["--cuda-graph-bs-decode", "1", "2", "4", "8", "--disable-overlap-schedule",
                    "--mamba-radix-cache-strategy", "extra_buffer", "--max-total-tokens", "64k"]
    assert "--enable-two-batch-overlap" not in args  # null leaves a flag out
    assert "checked against the SGLang 0.5.23 table" in result["reasons"]["engine_flags"]
    # Behind the gateway every replica's argv carries them too.
    replicas = run({**pro6000, "gateway": {}})["replicas"]
    assert len(replicas) == 4
    for replica in replicas:
        assert replica["args"][-10:] == tail


@pytest.mark.parametrize(("flags", "expected"), [
    ({"--tensor-parallel-size": 4},
     "--tensor-parallel-size is rendered by the planner (tp_size); use overrides.tp_size"),
    ({"--page-size": 4}, "use overrides.page_size"),
    ({"--speculative-dflash-block-size": 8}, "set it in the speculative section"),
    ({"--cuda-graph-max-bs-decode": 4}, "the planner derives it"),
    ({"--api-key": "sk-1"}, "--api-key is a secret; it never goes on the command line"),
    ({"--admin-api-key": "sk-1"}, "is a secret"),
    ({"--mamba-radix-cache-strategy": "bogus"},
     "--mamba-radix-cache-strategy: expected one of auto, no_buffer, extra_buffer, extra_buffer_lazy, found 'bogus'"),
    ({"--cuda-graph-max-bs": 8}, "--cuda-graph-max-bs is not accepted by SGLang 0.5.23"),
    ({"--disable-overlap-schedule": "yes"}, "an on/off flag: expected true"),
    ({"--page-size-typo": 1}, "is not accepted by SGLang 0.5.23"),
    ({"--max-running-requests": 3}, "use overrides.max_running_requests"),
    ({"--max-total-tokens": "lots"}, "expected an integer, optionally with a k/M/G/T"),
    ({"--chunked-prefill-size": "big"}, "use overrides.chunked_prefill_size"),
    ({"--mamba-track-interval": "often"}, "--mamba-track-interval: expected an integer, found 'often'"),
    ({"--mamba-track-interval": [1, 2]}, "takes one value, found a list"),
    ({"--mamba-track-interval": True}, "takes a value"),
    ({"--help": True}, "prints help and exits"),
    ({"tp": 1}, "expected flags spelled as the engine's --help does (--name), found 'tp'"),
    ({"--json-model-override-args": {"a": 1}}, "expected true, a string, a number or a list, found dict"),
    ("--disable-overlap-schedule", "expected a mapping of engine flag -> value"),
])
def test_engine_flags_the_engine_or_the_deploy_would_refuse_are_refused_up_front(pro6000: dict, flags: object,
                                                                                 expected: str) -> None:
    pro6000["overrides"] = {"engine_flags": flags}
    result = run(pro6000)
    assert result["args"] == []
    assert any(expected in e for e in result["errors"]), result["errors"]


def test_engine_flags_cannot_undo_what_ddtree_runs_with(pro6000: dict) -> None:
    pro6000["speculative"].update(algorithm="ddtree", tree_budget=15)
    pro6000["engine_options"] = sorted(engine.flag_table("0.5.23").visible | {"--speculative-ddtree-budget"})
    pro6000["overrides"] = {"engine_flags": {"--disable-overlap-schedule": True}}
    assert any("--disable-overlap-schedule is rendered by the planner" in e and "DDTree" in e
               for e in run(pro6000)["errors"])


def test_engine_flags_on_a_table_from_help_text_are_checked_for_their_spelling_only(pro6000: dict) -> None:
    pro6000["engine_options"] = sorted(engine.flag_table("0.5.23").visible)
    pro6000["overrides"] = {"engine_flags": {"--mamba-radix-cache-strategy": "extra_buffer"}}
    result = run(pro6000)
    assert result["errors"] == [] and result["args"][-2:] == ["--mamba-radix-cache-strategy", "extra_buffer"]
    pro6000["overrides"] = {"engine_flags": {"--no-such-flag": True}}
    assert any("--no-such-flag is not accepted" in e for e in run(pro6000)["errors"])
