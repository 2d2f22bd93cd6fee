"""SGLang's start-up memory lines (real captures in tests/fixtures/sglang-logs) and the comparison with the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_infra.parsers import engine_log

LOGS = Path(__file__).resolve().parent / "fixtures" / "sglang-logs"

# What the 0.5.23 formats look like for a hybrid target with a DFlash drafter at TP2 x DP2
# (model_runner.py, memory_pool.py, kv_cache_configurator.py), behind the journal's own prefix.
HYBRID_DFLASH = """\
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] Load weight end. elapsed=41.20 s, type=Qwen3_5ForConditionalGeneration, avail mem=68.51 GB, mem usage=25.60 GB.
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] Load weight end. elapsed=0.41 s, type=DFlashDraftModel, avail mem=66.57 GB, mem usage=1.94 GB.
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] Mamba Cache is allocated. max_mamba_cache_size: 94, conv_state size: 0.13GB, ssm_state size: 3.34GB intermediate_ssm_state_cache size: 18.00GB intermediate_conv_window_cache size: 0.70GB 
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 625533, K size: 9.54 GB, V size: 9.54 GB
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] Memory pool end. avail mem=26.80 GB
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 625533, K size: 2.98 GB, V size: 2.98 GB
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP0 TP0] Memory pool end. avail mem=20.84 GB
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP1 TP1] Mamba Cache is allocated. max_mamba_cache_size: 90, conv_state size: 0.12GB, ssm_state size: 3.20GB 
Nov 29 11:16:59 ct200 sglang-qwen[812]: [2026-11-29 11:16:59 DP1 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 600000, KV size: 18.00 GB
"""  # noqa: E501, W291 - verbatim log lines; SGLang ends the Mamba line with a space

PLAN = {"kv_cache_tokens": 626530, "per_gpu": {"weights_gib": 27.48, "kv_pool_gib": 25.1, "mamba_pool_gib": 22.17}}


def read(name: str) -> str:
    return (LOGS / f"{name}.log").read_text()


def test_club3090_two_ranks_target_and_drafter_pools() -> None:
    ranks = engine_log.parse_startup(read("club3090-1261"))
    assert list(ranks) == [" TP0", " TP1"]
    tp0 = ranks[" TP0"]
    assert [p.tokens for p in tp0.kv_pools] == [454112, 454112]
    assert [p.size_gib for p in tp0.kv_pools] == [6.92, 2.16]
    assert tp0.kv_pools[0].dtype == "torch.float8_e4m3fn"
    assert tp0.pool_end_avail_gib == [8.40, 6.23]
    assert ranks[" TP1"].pool_end_avail_gib == [7.63, 5.46]
    summary = engine_log.engine_memory(read("club3090-1261"))
    assert summary["rank"] == "TP0" and summary["kv_cache_tokens"] == 454112 and summary["kv_pool_gib"] == 9.08
    assert summary["avail_after_pool_gib"] == 6.23 and summary["weights_gib"] is None


def test_benwilson_lines_without_prefix_or_figures() -> None:
    summary = engine_log.engine_memory(read("sglang-pr36556-benwilson"))
    assert summary["found"] and summary["rank"] is None
    assert summary["kv_cache_tokens"] == 262144 and summary["kv_pool_gib"] == 6.0
    # "Load weight end. elapsed=1324.77 s" carries no mem usage: recorded as unknown, never as 0.
    assert summary["weight_loads"] == [{"model_type": None, "mem_usage_gib": None, "avail_gib": None}]
    assert summary["weights_gib"] is None


def test_xinference_older_format_without_dtype() -> None:
    summary = engine_log.engine_memory(read("xinference-3481"))
    assert summary["weights_gib"] == 27.57
    assert summary["weight_loads"][0]["model_type"] == "Qwen3ForCausalLM"
    assert summary["weight_loads"][0]["avail_gib"] == 19.67
    assert summary["kv_pools"] == [{"tokens": 91749, "size_gib": 14.0, "dtype": None, "label": None}]
    assert summary["avail_after_pool_gib"] == 5.27


def test_hybrid_dflash_weights_mamba_and_both_kv_pools_behind_journal_prefix() -> None:
    summary = engine_log.engine_memory(HYBRID_DFLASH)
    assert summary["rank"] == "DP0 TP0"
    assert summary["weights_gib"] == pytest.approx(27.54)
    assert summary["mamba"]["slots"] == 94
    assert summary["mamba_pool_gib"] == pytest.approx(0.13 + 3.34 + 18.00 + 0.70)
    assert summary["kv_cache_tokens"] == 625533
    assert summary["kv_pool_gib"] == pytest.approx(9.54 * 2 + 2.98 * 2)
    other = summary["ranks"][1]
    assert other["rank"] == "DP1 TP1" and other["mamba_pool_gib"] == pytest.approx(3.32)
    assert other["kv_pool_gib"] == 18.0  # the single "KV size:" form


def test_comparison_within_tolerance_and_warning_outside() -> None:
    measured = engine_log.measure(HYBRID_DFLASH, PLAN)
    rows = {r["figure"]: r for r in measured["comparison"]}
    assert rows["kv_cache_tokens"]["within_tolerance"] and rows["weights_gib"]["within_tolerance"]
    assert rows["mamba_pool_gib"]["within_tolerance"]
    assert measured["warnings"] == []
    off = engine_log.measure(HYBRID_DFLASH, {**PLAN, "kv_cache_tokens": 400000})
    assert len(off["warnings"]) == 1
    assert off["warnings"][0].startswith(
        "kv_cache_tokens: the planner predicted 400000, the engine logged 625533 (+56.4%")


def test_tolerance_boundary_is_inclusive() -> None:
    rows, warnings = engine_log.compare({"kv_cache_tokens": 115}, {"kv_cache_tokens": 100}, tolerance=0.15)
    assert rows[0]["within_tolerance"] and not warnings
    rows, warnings = engine_log.compare({"kv_cache_tokens": 116}, {"kv_cache_tokens": 100}, tolerance=0.15)
    assert not rows[0]["within_tolerance"] and len(warnings) == 1


def test_no_memory_lines_is_reported_not_invented() -> None:
    measured = engine_log.measure("[2026-01-01 00:00:00] The server is fired up and ready to roll!\n", PLAN)
    assert measured["found"] is False and measured["comparison"] == []
    assert "not found" in measured["warnings"][0]
