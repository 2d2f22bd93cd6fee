"""DDTree as SGLang PR #29907 defines it: DDTREE argv, the PR's rules, verify width budget + 1 in the memory model,
and the derived flag table of a 0.5.23 build with the PR."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra import engine, memory
from dflash_infra.planner import plan_dict
from dflash_infra.planning.request import Speculative

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TABLES = ROOT / "dflash_infra" / "data" / "sglang"
BUILD = "0.5.23+ddtree"


def ddtree(budget: Any = 16, version: str = BUILD, **overrides: Any) -> dict[str, Any]:
    request = yaml.safe_load((EXAMPLES / "pro6000.yml").read_text())
    request["speculative"].update(algorithm="ddtree", tree_budget=budget)
    request["sglang_version"] = version
    request["overrides"] = {**(request.get("overrides") or {}), **overrides}
    return request


def run(request: dict[str, Any]) -> dict[str, Any]:
    return plan_dict(request, EXAMPLES)


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture()
def standin_parser() -> Iterator[Any]:
    """The lab stand-in's rebuild of `sglang serve`'s parser (standard library argparse), for any table."""
    sys.path.insert(0, str(ROOT / "lab" / "engine"))
    try:
        from sglang.standin import flags  # type: ignore[import-not-found]
        yield flags.build_parser
    finally:
        sys.path.remove(str(ROOT / "lab" / "engine"))


# --- argv ----------------------------------------------------------------------------------------------

def test_ddtree_renders_the_ddtree_algorithm_and_its_budget() -> None:
    result = run(ddtree(16))
    assert result["errors"] == []
    argv = result["args"]
    assert value(argv, "--speculative-algorithm") == "DDTREE"
    assert value(argv, "--speculative-ddtree-budget") == "16"
    assert value(argv, "--speculative-dflash-block-size") == "16"
    assert value(argv, "--speculative-draft-model-path") == "/root/models/Qwen3.6-27B-DFlash"
    assert value(argv, "--page-size") == "1"
    assert "--disable-overlap-schedule" in argv
    assert "--speculative-use-rejection-sampling" not in argv
    assert result["engine"] == {"name": "sglang", "version": BUILD, "flag_table": BUILD}
    assert result["speculative"]["verify_tokens"] == 17 and result["speculative"]["tree_depth_cap"] == 15


def test_the_ddtree_argv_parses_with_a_parser_built_from_the_derived_table(standin_parser: Any) -> None:
    argv = run(ddtree(16))["args"]
    table = json.loads((TABLES / f"{BUILD}.json").read_text())
    args = standin_parser(table).parse_args(argv)
    assert args.speculative_algorithm == "DDTREE" and args.speculative_ddtree_budget == 16
    assert args.page_size == 1 and args.disable_overlap_schedule is True
    # The same argv is refused by the 0.5.23 table: upstream has no --speculative-ddtree-budget.
    upstream = json.loads((TABLES / "0.5.23.json").read_text())
    with pytest.raises(SystemExit):
        standin_parser(upstream).parse_args(argv)


def test_linear_dflash_renders_neither_ddtree_flags_nor_its_rules() -> None:
    request = ddtree(None)
    request["speculative"]["algorithm"] = "dflash"
    result = run(request)
    assert result["errors"] == []
    argv = result["args"]
    assert value(argv, "--speculative-algorithm") == "DFLASH"
    assert not {"--speculative-ddtree-budget", "--page-size", "--disable-overlap-schedule"} & set(argv)
    assert result["speculative"]["verify_tokens"] == 16


def test_ddtree_on_upstream_0523_is_refused_naming_the_flag_and_the_pr() -> None:
    result = run(ddtree(16, version="0.5.23"))
    assert result["args"] == []
    assert any("--speculative-ddtree-budget" in e and "0.5.23" in e and "PR #29907" in e and "silently" in e
               for e in result["errors"])


def test_ddtree_behind_a_gateway_carries_the_rules_in_every_replica() -> None:
    request = ddtree(16)
    request["gateway"] = {}
    result = run(request)
    assert result["errors"] == [] and result["replicas"]
    for replica in result["replicas"]:
        assert value(replica["args"], "--page-size") == "1" and "--disable-overlap-schedule" in replica["args"]


# --- PR #29907's rules ----------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", [0, -3, "8", 2.5, True])
def test_budget_must_be_an_integer_of_at_least_one(budget: Any) -> None:
    result = run(ddtree(budget))
    assert result["args"] == []
    assert any(e.startswith("speculative.tree_budget: expected an integer from 1 to 1024") for e in result["errors"])


def test_a_missing_budget_is_an_error_never_the_silent_linear_chain() -> None:
    result = run(ddtree(None))
    assert result["args"] == []
    assert any("explicit tree budget" in e and "block_size - 1 = 15" in e and "linear chain" in e
               for e in result["errors"])


def test_budget_of_block_minus_one_plans_but_warns_that_it_is_the_plain_chain() -> None:
    result = run(ddtree(15))
    assert result["errors"] == []
    assert value(result["args"], "--speculative-ddtree-budget") == "15"
    assert any("tree_budget 15 = block_size - 1" in w and "plain linear chain" in w for w in result["warnings"])
    assert not any("plain linear chain" in w for w in run(ddtree(16))["warnings"])


def test_reasons_state_the_depth_cap_and_the_verify_width() -> None:
    reason = run(ddtree(12))["reasons"]["speculative"]
    assert "tree depth at most block_size - 1 = 15" in reason
    assert "verify width budget + 1 = 13 tokens per request" in reason


def test_a_page_size_other_than_one_is_refused() -> None:
    result = run(ddtree(16, page_size=16))
    assert result["args"] == []
    assert any(e.startswith("overrides.page_size: ddtree needs page size 1") and "found 16" in e
               for e in result["errors"])
    ok = run(ddtree(16, page_size=1))
    assert ok["errors"] == [] and value(ok["args"], "--page-size") == "1"


def test_rejection_sampling_is_refused_as_the_pr_does() -> None:
    result = run(ddtree(16, speculative_use_rejection_sampling=True))
    assert result["args"] == []
    assert any("PR #29907 refuses --speculative-use-rejection-sampling" in e for e in result["errors"])


def test_the_overrides_still_render_for_linear_dflash() -> None:
    request = ddtree(None, version="0.5.23", page_size=16, speculative_use_rejection_sampling=True)
    request["speculative"]["algorithm"] = "dflash"
    result = run(request)
    assert result["errors"] == []
    assert value(result["args"], "--page-size") == "16" and "--speculative-use-rejection-sampling" in result["args"]


def test_a_budget_given_to_linear_dflash_is_not_dropped_silently() -> None:
    request = ddtree(12, version="0.5.23")
    request["speculative"]["algorithm"] = "dflash"
    result = run(request)
    assert "--speculative-ddtree-budget" not in result["args"]
    assert any("tree_budget 12 is ignored" in w for w in result["warnings"])


def test_a_plan_on_the_derived_table_says_it_is_derived() -> None:
    result = run(ddtree(16))
    assert any(w.startswith(f"flag table {BUILD}: derived:") and "make sglang-flags" in w for w in result["warnings"])
    assert "derived" in result["reasons"]["args"]


# --- verify width in the memory model -------------------------------------------------------------------

def test_verify_tokens_is_the_block_for_dflash_and_budget_plus_one_for_ddtree() -> None:
    assert Speculative("dflash", {"block_size": 16, "tree_budget": 40}).verify_tokens == 16
    assert Speculative("ddtree", {"block_size": 16, "tree_budget": 8}).verify_tokens == 9
    assert Speculative("ddtree", {"block_size": 16, "tree_budget": 32}).verify_tokens == 33
    assert Speculative("none", {}).verify_tokens == 0


def test_a_larger_budget_runs_fewer_requests_at_the_same_tp() -> None:
    small, large = run(ddtree(8, tp_size=2)), run(ddtree(16, tp_size=2))
    assert small["errors"] == [] and large["errors"] == []
    assert large["max_running_requests"] < small["max_running_requests"]
    # The speculative SSM scratch grows with the verify width: budget + 1 states per running request.
    assert "with 17 speculative scratch states each" in large["reasons"]["max_running_requests"]
    assert "with 9 speculative scratch states each" in small["reasons"]["max_running_requests"]


def test_the_kv_reserve_of_a_decode_step_scales_with_the_verify_width() -> None:
    assert memory.decode_kv_reserve_tokens(4, 17) == 4 * 2 * 17
    assert memory.decode_kv_reserve_tokens(4, 0) == 8  # no speculative decoding: one token per step
    result = run(ddtree(16, tp_size=2))
    running = result["max_running_requests"]
    assert f"decode reserve of {running * 2 * 17} (2 x 17 per running request)" in result["reasons"]["context_length"]


def test_verify_graphs_beyond_the_engine_activation_reserve_grow_the_draft_allowance() -> None:
    # 256 graphs x 33 tokens = 8448 tokens; the engine's reserve covers max(chunked 8192, 2048) of them.
    assert memory.verify_activation_mib(256, 33, 8192) == (8448 - 8192) * 1.5
    assert memory.verify_activation_mib(256, 17, 8192) == 0
    narrow = run(ddtree(16, tp_size=2))
    wide = ddtree(32, tp_size=2)
    wide["speculative"].update(max_draft_tokens=32)
    wide_plan = run(wide)
    assert wide_plan["errors"] == []
    assert wide_plan["mem_fraction_static"] < narrow["mem_fraction_static"]
    assert wide_plan["max_running_requests"] < narrow["max_running_requests"]


# --- the derived flag table -----------------------------------------------------------------------------

def test_derived_table_is_the_0523_table_plus_the_options_of_the_pr() -> None:
    upstream = json.loads((TABLES / "0.5.23.json").read_text())
    derived = json.loads((TABLES / f"{BUILD}.json").read_text())
    assert derived["version"] == BUILD and derived["derived_from"] == "0.5.23"
    assert derived["provenance"].startswith("derived: 0.5.23 table + options of SGLang PR #29907")
    assert "not extracted from a wheel" in derived["provenance"] and "make sglang-flags" in derived["provenance"]
    assert derived["wheel"] is None and derived["wheel_sha256"] is None
    assert derived["parser"] == upstream["parser"]
    # Every upstream option, unchanged and in order; the only additions are the PR's.
    added = [o for o in derived["options"] if o not in upstream["options"]]
    assert [o["option_strings"] for o in added] == [[f] for f in derived["added_options"]]
    assert derived["added_options"] == ["--speculative-ddtree-budget"]
    assert [o for o in derived["options"] if o not in added] == upstream["options"]
    assert added[0]["type"] == "int" and added[0]["dest"] == "speculative_ddtree_budget"


def test_engine_selects_the_derived_table_only_for_the_ddtree_build() -> None:
    assert engine.table_name("0.5.23") == "0.5.23"
    assert engine.table_name("0.5.23+lab") == "0.5.23"
    assert engine.table_name("0.5.19") == "0.5.19"
    assert engine.table_name(BUILD) == BUILD
    assert engine.table_name("0.5.23+ddtree.g1a2b3c4") == BUILD  # the build's commit in the local version
    assert engine.table_name("0.5.19+ddtree") == "0.5.19"  # no such build table: the release's
    assert engine.supported_releases() == ("0.5.23", "0.5.19")
    assert engine.derived_tables() == (BUILD,)
    derived, upstream = engine.flag_table(BUILD), engine.flag_table("0.5.23")
    assert derived.visible > upstream.visible and derived.visible - upstream.visible == {"--speculative-ddtree-budget"}
    assert derived.hidden == upstream.hidden
    assert derived.provenance and upstream.provenance is None
    assert engine.setting_flags(BUILD) == engine.setting_flags("0.5.23")


def test_an_unknown_version_lists_the_build_tables_too() -> None:
    result = run(ddtree(16, version="0.4.9"))
    assert any(e.startswith("sglang_version: expected one of 0.5.23, 0.5.19, 0.5.23+ddtree") for e in result["errors"])
