"""Load figures and the load gate (dflash_infra.loadgate): where the speculative figures are read from (a chat
answer serialized by SGLang 0.5.23's own response models, tools/sglang_response_shapes.py), the definitions of
z-lab's client (dflash 0.1.0, benchmark.py _run_openai), percentiles, and what passes and what fails."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from dflash_infra import loadgate
from dflash_infra.loadgate import Outcome

CHAT = json.loads((Path(__file__).parent / "fixtures" / "sglang" / "chat-completion-0.5.23-meta-info.json").read_text())


def test_the_figures_are_read_where_0523_puts_them() -> None:
    assert loadgate.spec_figures(CHAT) == {"spec_accept_length": 4.923, "spec_verify_ct": 13}
    # Only sglext (return_spec_tokens_details without return_meta_info), only choices[0].meta_info, /generate's
    # top-level meta_info: each is found; an answer without them (not speculative, or not asked) gives none.
    only_sglext = {**CHAT, "choices": [{k: v for k, v in CHAT["choices"][0].items() if k != "meta_info"}]}
    assert loadgate.spec_figures(only_sglext) == {"spec_accept_length": 4.923, "spec_verify_ct": 13}
    only_meta = {k: v for k, v in CHAT.items() if k != "sglext"}
    assert loadgate.spec_figures(only_meta)["spec_verify_ct"] == 13
    generate = {"text": "...", "meta_info": CHAT["choices"][0]["meta_info"]}
    assert loadgate.spec_figures(generate)["spec_accept_length"] == 4.923
    plain = {**only_meta, "choices": only_sglext["choices"]}
    assert loadgate.spec_figures(plain) == {}
    # What z-lab's client 0.1.0 reads, out.get("meta_info"): 0.5.23's chat answer has none at the top.
    assert "meta_info" not in CHAT


def test_the_figures_follow_z_labs_definitions() -> None:
    # Three requests at concurrency 2 over 2.0 s of wall time; one failed.
    runs = [Outcome(started=10.0, finished=11.0, ok=True, completion_tokens=64, first_token=10.2,
                    spec={"spec_accept_length": 4.0, "spec_verify_ct": 16}),
            Outcome(started=10.0, finished=12.0, ok=True, completion_tokens=32, first_token=10.5,
                    spec={"spec_accept_length": 2.0, "spec_verify_ct": 16}),
            Outcome(started=11.0, finished=11.5, ok=False, error="HTTP 500")]
    got = loadgate.figures(runs, concurrency=2)
    # z-lab: total completion tokens / wall; mean of per-request spec_accept_length; sum of spec_verify_ct.
    assert got["output_tokens_per_s"] == (64 + 32) / 2.0 == 48.0
    assert got["accept_length_mean"] == statistics.mean([4.0, 2.0]) == 3.0
    assert got["verify_ct"] == 32
    assert (got["requests"], got["failed"], got["errors"], got["requests_per_s"]) == (3, 1, ["HTTP 500"], 1.0)
    assert (got["ttft_ms_p50"], got["ttft_ms_p99"]) == (200.0, 500.0)
    # Inter-token latency per request: (last token - first token) / (tokens - 1).
    assert got["itl_ms_p50"] == round(0.8 / 63 * 1000, 1) and got["itl_ms_p99"] == round(1.5 / 31 * 1000, 1)
    with pytest.raises(ValueError, match="at least one request"):
        loadgate.figures([], 1)


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert loadgate.percentile(values, 50) == 50.0 and loadgate.percentile(values, 99) == 99.0
    assert loadgate.percentile([7.0], 99) == 7.0 and loadgate.percentile([], 50) is None


def row(c: int, tok_s: float, accept: float | None = 4.5, failed: int = 0) -> dict:
    return {"concurrency": c, "requests": 32, "failed": failed, "errors": ["HTTP 503"] if failed else [],
            "output_tokens_per_s": tok_s, "requests_per_s": 2.0, "accept_length_mean": accept,
            "accept_length_requests": 32 if accept is not None else 0}


def test_the_gate_passes_a_first_deployment_and_one_as_fast_as_before() -> None:
    first = loadgate.gate([row(1, 100.0), row(4, 300.0)], None, speculative=True, min_accept_length=2.0,
                          max_regression=0.1)
    assert first.passed and first.lines[-1] == "first deployment with load figures: recorded, nothing to compare with"
    again = loadgate.gate([row(4, 290.0)], [row(4, 300.0)], speculative=True, min_accept_length=2.0,
                          max_regression=0.1)
    assert again.passed, again.problems
    assert again.lines == ["concurrency 4: 32 requests, 0 failed, 290.0 tok/s, 2.0 req/s, acceptance 4.5 over 32 "
                           "requests (previous deployment: 300.0 tok/s, acceptance 4.5)"]


def test_the_gate_fails_on_errors_a_collapsed_acceptance_and_a_regression_side_by_side() -> None:
    verdict = loadgate.gate([row(4, 200.0, accept=1.02, failed=2)], [row(4, 300.0)], speculative=True,
                            min_accept_length=2.0, max_regression=0.1)
    assert not verdict.passed
    assert verdict.problems == [
        "concurrency 4: 2 of 32 requests failed (HTTP 503)",
        "concurrency 4: mean acceptance length 1.02 is below 2.0: the drafter costs time without saving it",
        "concurrency 4: 200.0 tok/s is 33% below the previous deployment's 300.0 (at most 10% allowed)"]
    missing = loadgate.gate([row(1, 100.0, accept=None)], None, speculative=True, min_accept_length=2.0,
                            max_regression=0.1)
    assert "no request reported spec_accept_length" in missing.problems[0]
    assert loadgate.gate([row(1, 100.0, accept=None)], None, speculative=False, min_accept_length=2.0,
                         max_regression=0.1).passed  # no drafter, no acceptance to judge


def test_a_regression_can_be_accepted_on_purpose_and_says_so() -> None:
    verdict = loadgate.gate([row(4, 200.0)], [row(4, 300.0)], speculative=True, min_accept_length=2.0,
                            max_regression=0.1, accept_regression=True)
    assert verdict.passed and verdict.lines[-1].endswith("(at most 10% allowed); accepted on purpose")


def test_two_deployments_side_by_side() -> None:
    lines = loadgate.compare([row(4, 300.0)], [row(4, 240.0), row(8, 400.0)], ("before", "after"))
    assert lines[0].split() == ["before", "after", "ratio"]
    assert "concurrency 4" in lines and "concurrency 8" in lines
    tok = [line for line in lines if line.strip().startswith("output tok/s")]
    assert tok[0].split()[-3:] == ["300.0", "240.0", "0.80"] and tok[1].split()[-2:] == ["-", "400.0"]


def test_the_benchmark_runs_one_four_and_the_endpoints_maximum() -> None:
    gateway = {"max_running_requests": 32, "replicas": [{}, {}, {}, {}]}
    assert loadgate.endpoint_concurrency(gateway) == [1, 4, 128]
    assert loadgate.endpoint_concurrency({"max_running_requests": 4}) == [1, 4]  # the maximum once
    assert loadgate.endpoint_concurrency({"max_running_requests": 2}, (1, 4, 8)) == [1, 2]  # none beyond it


def test_through_the_gateway_the_endpoints_capacity_runs_at_once() -> None:
    plan = {"max_running_requests": 24, "replicas": [{}, {}, {}, {}]}
    settings = {"requests": 32, "gateway_concurrency": []}
    # Every replica's share at once, each replica about as many requests as its own gate sent.
    assert loadgate.gateway_run(settings, plan) == {"concurrency": [96], "requests": 128}
    # Concurrencies given: at least as many requests as the largest, so that every level runs full.
    assert loadgate.gateway_run({**settings, "gateway_concurrency": [8, 200]}, plan) == {"concurrency": [8, 200],
                                                                                         "requests": 200}
    assert loadgate.gateway_run({"requests": 32}, {"max_running_requests": 48, "replicas": [{}]}) == {
        "concurrency": [48], "requests": 48}


def test_each_replica_that_restarted_under_the_gateways_load_is_named() -> None:
    quiet = {"restarted": False, "before": {"NRestarts": "0"}, "after": {"NRestarts": "0", "ActiveState": "active"}}
    died = {"restarted": True, "before": {"NRestarts": "0"}, "after": {"NRestarts": "2", "ActiveState": "activating"}}
    assert loadgate.restarts_problem({"r0.service": quiet, "r1.service": died, "r3.service": died}) == (
        "r1.service restarted during the load run (NRestarts 0 -> 2, now activating): it crashed under load; "
        "r3.service restarted during the load run (NRestarts 0 -> 2, now activating): it crashed under load")
    assert loadgate.restarts_problem({"r0.service": quiet}) == "" and loadgate.restarts_problem(None) == ""


def test_figures_over_https_are_not_held_against_figures_over_http() -> None:
    """A TLS handshake per connection weighs on a short run: turning TLS on records without comparing, and two runs
    over the same transport compare as before (a record made before TLS existed is plain HTTP's)."""
    settings = {"prompts": [{"name": "p", "messages": []}], "max_tokens": 8, "requests": 4, "min_accept_length": 1.0,
                "max_regression": 0.5}
    fast = [row(4, 1000.0)]
    slow = [row(4, 100.0)]
    plain = loadgate.verdict(fast, None, settings, speculative=True)["load"]
    assert "transport" not in plain["inputs"]
    tls = loadgate.verdict(slow, plain, settings, speculative=True, transport="https")
    assert tls["passed"] and any("recorded without comparing" in line for line in tls["lines"])
    again = loadgate.verdict(slow, {"inputs": tls["load"]["inputs"], "figures": fast}, settings, speculative=True,
                             transport="https")
    assert not again["passed"]  # over the same transport a tenth of the throughput is a regression
