"""The committed SGLang flag tables against the real SGLang argument parsers (0.5.23 pin, 0.5.19).

Needs the cached parser environment (tools/sglang_parser_env.sh); without it these tests fail
with the command that builds it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_real import EXTRACT, REPO, check_argvs, load_table, option_by_string, option_strings

pytestmark = pytest.mark.sglang_parser

PIN = "0.5.23"
OLD = "0.5.19"

# A production-shaped DFLASH launch for Qwen3.6-27B at TP2.
DFLASH_ARGV = [
    "--model-path", "/root/models/Qwen3.6-27B",
    "--served-model-name", "qwen3.6-27b",
    "--tp-size", "2",
    "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash",
    "--speculative-dflash-block-size", "16",
    "--speculative-draft-window-size", "16",
    "--speculative-draft-attention-backend", "flashinfer",
    "--mem-fraction-static", "0.85",
    "--mamba-full-memory-ratio", "0.9",
    "--mamba-ssm-dtype", "bfloat16",
    "--mamba-radix-cache-strategy", "auto",
    "--cuda-graph-max-bs-decode", "32",
    "--max-running-requests", "48",
    "--context-length", "32768",
    "--host", "127.0.0.1",
    "--port", "30000",
]

# Flags the project relies on in 0.5.23, read from sglang/srt/arg_groups/fields/.
PIN_FLAGS = {
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-dflash-block-size",
    "--speculative-num-draft-tokens", "--speculative-draft-window-size",
    "--speculative-draft-attention-backend", "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc", "--mamba-full-memory-ratio", "--mamba-ssm-dtype",
    "--max-mamba-cache-size", "--enable-linear-replayssm-spec", "--cuda-graph-max-bs-decode",
    "--mamba-radix-cache-strategy", "--mem-fraction-static", "--enable-dp-lm-head",
}
# Gone in 0.5.23, still deprecated aliases in 0.5.19.
REMOVED_IN_PIN = {"--speculative-dflash-draft-window-size", "--mamba-scheduler-strategy", "--cuda-graph-max-bs"}


def with_flag(flag: str, value: str) -> list[str]:
    """DFLASH_ARGV plus one more option."""
    return [*DFLASH_ARGV, flag, value]


def without(flag: str) -> list[str]:
    """DFLASH_ARGV without `flag` and its value."""
    at = DFLASH_ARGV.index(flag)
    return DFLASH_ARGV[:at] + DFLASH_ARGV[at + 2:]


# Every command line the tests parse, by name; one parser process per version parses them all.
CASES: dict[str, list[str]] = {
    "dflash": DFLASH_ARGV,
    "dflash_window_alias": [
        *without("--speculative-draft-window-size"), "--speculative-dflash-draft-window-size", "16",
    ],
    "cuda_graph_max_bs": with_flag("--cuda-graph-max-bs", "16"),
    "mamba_scheduler_strategy": with_flag("--mamba-scheduler-strategy", "extra_buffer"),
    "bad_int": with_flag("--tp-size", "two"),
    "bad_choice": with_flag("--mamba-ssm-dtype", "int8"),
    "no_model": ["--tp-size", "2"],
    "window_below_block": [*without("--speculative-draft-window-size"), "--speculative-draft-window-size", "8"],
    "pipeline_parallel": with_flag("--pp-size", "2"),
    "block_vs_draft_tokens": with_flag("--speculative-num-draft-tokens", "8"),
    "no_max_running": without("--max-running-requests"),
}


def parse_all(version: str) -> dict[str, dict]:
    """Results of the real `version` parser, and its DFLASH startup rules, for every case."""
    names = list(CASES)
    results = check_argvs(version, [CASES[n] for n in names], dflash_checks=True)
    return dict(zip(names, results, strict=True))


@pytest.fixture(scope="module")
def pin() -> dict[str, dict]:
    """What the real 0.5.23 parser made of each case."""
    return parse_all(PIN)


@pytest.fixture(scope="module")
def old() -> dict[str, dict]:
    """What the real 0.5.19 parser made of each case."""
    return parse_all(OLD)


def test_pin_accepts_realistic_dflash_argv(pin: dict[str, dict]) -> None:
    """The real 0.5.23 parser takes the production DFLASH command line and stores what it says."""
    result = pin["dflash"]
    assert result["ok"], result["stderr"]
    assert result["warnings"] == []
    ns = result["namespace"]
    assert ns["speculative_algorithm"] == "DFLASH"
    assert ns["speculative_dflash_block_size"] == 16
    assert ns["speculative_draft_window_size"] == 16
    assert ns["tp_size"] == 2
    assert ns["mem_fraction_static"] == pytest.approx(0.85)
    assert ns["cuda_graph_max_bs_decode"] == 32
    assert ns["port"] == 30000


def test_pin_rejects_removed_and_ambiguous_flags(pin: dict[str, dict]) -> None:
    """0.5.23 refuses the retired draft-window alias and treats --cuda-graph-max-bs as ambiguous."""
    window, graph, mamba = pin["dflash_window_alias"], pin["cuda_graph_max_bs"], pin["mamba_scheduler_strategy"]
    assert not window["ok"]
    assert window["error"] == "unrecognized arguments: --speculative-dflash-draft-window-size 16"
    assert not graph["ok"]
    assert graph["error"] == (
        "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )
    assert not mamba["ok"]
    assert mamba["error"] == "unrecognized arguments: --mamba-scheduler-strategy extra_buffer"


@pytest.mark.parametrize("version", [PIN, OLD])
def test_argparse_messages_for_bad_values(version: str, pin: dict[str, dict], old: dict[str, dict]) -> None:
    """Type, choice and required-option errors come back as argparse's own messages."""
    results = pin if version == PIN else old
    assert results["bad_int"]["error"] == "argument --tp-size/--tensor-parallel-size: invalid int value: 'two'"
    assert results["bad_choice"]["error"].startswith("argument --mamba-ssm-dtype: invalid choice: 'int8'")
    assert results["no_model"]["error"] == "the following arguments are required: --model-path/--model"


def test_old_release_accepts_realistic_dflash_argv(pin: dict[str, dict], old: dict[str, dict]) -> None:
    """0.5.19 takes the same production command line and stores the same values as 0.5.23."""
    assert old["dflash"]["ok"], old["dflash"]["stderr"]
    assert old["dflash"]["namespace"] == pin["dflash"]["namespace"]


def test_old_release_accepts_dflash_draft_window_alias(old: dict[str, dict]) -> None:
    """0.5.19 still takes --speculative-dflash-draft-window-size, storing the new field with a warning."""
    result = old["dflash_window_alias"]
    assert result["ok"], result["stderr"]
    assert result["namespace"]["speculative_draft_window_size"] == 16
    assert result["warnings"] == [
        "'--speculative-dflash-draft-window-size' is deprecated and will be removed in a future release. "
        "Use '--speculative-draft-window-size' instead."
    ]


def test_old_release_takes_flags_the_pin_dropped(old: dict[str, dict]) -> None:
    """In 0.5.19 --cuda-graph-max-bs and --mamba-scheduler-strategy are deprecated aliases, not errors."""
    assert old["cuda_graph_max_bs"]["ok"], old["cuda_graph_max_bs"]["stderr"]
    assert old["cuda_graph_max_bs"]["namespace"]["cuda_graph_max_bs_decode"] == 16
    assert old["mamba_scheduler_strategy"]["ok"], old["mamba_scheduler_strategy"]["stderr"]
    assert old["mamba_scheduler_strategy"]["namespace"]["mamba_radix_cache_strategy"] == "extra_buffer"


@pytest.mark.parametrize("version", [PIN, OLD])
def test_dflash_startup_rules_accept_the_production_argv(
    version: str, pin: dict[str, dict], old: dict[str, dict]
) -> None:
    """SGLang's own DFLASH hook accepts the production argv and settles block 16, one step, topk 1."""
    dflash = (pin if version == PIN else old)["dflash"]["dflash"]
    assert dflash["ok"], dflash["error"]
    assert dflash["resolved"] == {
        "speculative_num_draft_tokens": 16,
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 1,
        "speculative_draft_window_size": 16,
        "speculative_draft_attention_backend": "flashinfer",
        "max_running_requests": 48,
    }


@pytest.mark.parametrize("version", [PIN, OLD])
def test_dflash_startup_rules_reject_what_sglang_rejects(
    version: str, pin: dict[str, dict], old: dict[str, dict]
) -> None:
    """Arguments that parse but that SGLang refuses at DFLASH startup come back with its message."""
    results = pin if version == PIN else old
    for case in ("window_below_block", "pipeline_parallel", "block_vs_draft_tokens"):
        assert results[case]["ok"], results[case]["stderr"]
        assert results[case]["dflash"]["ok"] is False, case
    assert results["window_below_block"]["dflash"]["error"] == (
        "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
        "window_size=8, block_size=16."
    )
    assert "only supports pp_size == 1" in results["pipeline_parallel"]["dflash"]["error"]
    assert "they must match" in results["block_vs_draft_tokens"]["dflash"]["error"]
    no_max = results["no_max_running"]["dflash"]
    assert no_max["ok"] and no_max["resolved"]["max_running_requests"] == 48
    assert any("reset to 48" in w for w in no_max["warnings"])


@pytest.mark.parametrize("version", [PIN, OLD])
def test_committed_table_equals_fresh_extraction(version: str) -> None:
    """The committed table is byte-identical to one extracted now from the real parser."""
    proc = subprocess.run(
        [sys.executable, str(EXTRACT), "--check", "--version", version],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("version", [PIN, OLD])
def test_table_identifies_its_wheel(version: str) -> None:
    """Each table names the PyPI wheel it came from and the parser `sglang serve` builds."""
    table = load_table(version)
    assert table["engine"] == "sglang"
    assert table["version"] == version
    assert table["wheel"] == f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert len(table["wheel_sha256"]) == 64
    assert table["parser"]["prog"] == "sglang serve"
    assert table["parser"]["allow_abbrev"] is True


def test_pin_table_has_the_documented_flags_and_not_the_removed_ones() -> None:
    """0.5.23 registers the DFLASH/mamba flags the planner uses and none of the retired ones."""
    flags = option_strings(PIN)
    assert flags >= PIN_FLAGS, sorted(PIN_FLAGS - flags)
    assert not REMOVED_IN_PIN & flags
    assert "--speculative-ddtree-budget" not in flags
    assert option_by_string(PIN, "--model-path")["required"] is True
    assert option_by_string(PIN, "--mamba-full-memory-ratio")["resolution_fallback"] == 0.9
    assert option_by_string(PIN, "--mamba-ssm-dtype")["choices"] == ["float32", "bfloat16", "float16"]


def test_old_table_has_removed_flags_as_deprecated_aliases() -> None:
    """0.5.19 registers the flags 0.5.23 dropped, as deprecated aliases of their replacements."""
    assert option_strings(OLD) >= PIN_FLAGS
    expected = {
        "--speculative-dflash-draft-window-size": ("speculative_draft_window_size", True),
        "--mamba-scheduler-strategy": ("mamba_radix_cache_strategy", False),
        "--cuda-graph-max-bs": ("cuda_graph_max_bs_decode", False),
    }
    for flag, (dest, hidden) in expected.items():
        option = option_by_string(OLD, flag)
        assert option["action"] == "DeprecatedAliasStoreAction"
        assert option["dest"] == dest
        assert option["help_suppressed"] is hidden


def test_real_0523_parser_takes_the_ddtree_argv_but_the_budget_of_pr_29907() -> None:
    """A DDTREE plan on the derived 0.5.23+ddtree table: the real 0.5.23 parser accepts every flag of its argv
    but --speculative-ddtree-budget, the one option the derived table adds for SGLang PR #29907."""
    import yaml

    from dflash_infra.planner import plan_dict

    request = yaml.safe_load((REPO / "examples" / "pro6000.yml").read_text())
    request["speculative"].update(algorithm="ddtree", tree_budget=16)
    request["sglang_version"] = "0.5.23+ddtree"
    argv = plan_dict(request, REPO / "examples")["args"]
    i = argv.index("--speculative-ddtree-budget")
    with_budget, without_budget = check_argvs(PIN, [argv, argv[:i] + argv[i + 2:]])
    assert not with_budget["ok"] and "--speculative-ddtree-budget" in with_budget["stderr"]
    assert without_budget["ok"], without_budget["stderr"]
    namespace = without_budget["namespace"]
    assert namespace["speculative_algorithm"] == "DDTREE"
    assert namespace["page_size"] == 1 and namespace["disable_overlap_schedule"] is True
