"""The canary's decisions (dflash_infra.canary): the candidate's shape, one side's figures over its rounds, the
verdict against the baseline and what to write in group_vars to keep a promoted candidate."""

from __future__ import annotations

from typing import Any

import yaml

from dflash_infra import canary


def fig(c: int, tok_s: float, *, failed: int = 0, accept: float | None = 5.0, reported: int = 32) -> dict[str, Any]:
    return {"concurrency": c, "requests": 32, "failed": failed, "output_tokens_per_s": tok_s,
            "requests_per_s": tok_s / 64, "accept_length_mean": accept,
            "accept_length_requests": reported if accept is not None else 0}


def test_a_candidate_is_every_key_and_names_what_it_cannot_be() -> None:
    got = canary.candidate({"environment": {"SGLANG_ENABLE_SPEC_V2": "1"}})
    assert got == {"speculative": {}, "plan_overrides": {}, "environment": {"SGLANG_ENABLE_SPEC_V2": "1"},
                   "problems": []}
    bad = canary.candidate({"enviroment": {}, "environment": {"SGLANG_API_KEY": "x", "SGLANG_STANDIN_STEP_MS": 10},
                            "plan_overrides": "mem_fraction_static=0.7"})
    assert bad["problems"] == [
        "candidate: unknown keys ['enviroment']; expected speculative, plan_overrides, environment",
        "candidate.plan_overrides: expected a mapping, found str",
        "candidate.environment.SGLANG_API_KEY: the deploy owns this variable (keys and credentials come from the "
        "vault, the GPUs from the plan; LD_* and PYTHON* change the code that runs); remove it",
        'candidate.environment.SGLANG_STANDIN_STEP_MS: expected a string, found int (quote it: "10")']
    # One reserved list for every environment input (dflash_infra/serving.py), the admin key and the loader too.
    owned = canary.candidate({"environment": {"SGLANG_ADMIN_API_KEY": "k", "LD_PRELOAD": "/tmp/x.so",
                                              "PYTHONPATH": "/tmp", "CUDA_VISIBLE_DEVICES": "0"}})["problems"]
    assert [p.split(":")[0] for p in owned] == [
        "candidate.environment.SGLANG_ADMIN_API_KEY", "candidate.environment.LD_PRELOAD",
        "candidate.environment.PYTHONPATH", "candidate.environment.CUDA_VISIBLE_DEVICES"]
    assert canary.candidate({})["problems"] == [
        "candidate: nothing to try (speculative, plan_overrides and environment are all empty)"]
    assert canary.candidate(["dflash"])["problems"] == [
        "candidate: expected a mapping with speculative, plan_overrides, environment, found list"]


def test_rounds_take_the_median_throughput_and_weigh_acceptance_by_the_requests_reporting_it() -> None:
    rounds = [[fig(1, 100.0), fig(32, 3000.0, accept=6.0)],
              [fig(1, 300.0), fig(32, 2000.0, failed=2, accept=4.0, reported=16)],
              [fig(1, 200.0), fig(32, 2500.0, accept=None)]]
    got = canary.rounds_figures(rounds)
    assert [f["concurrency"] for f in got] == [1, 32]
    one, peak = got
    assert (one["output_tokens_per_s"], one["rounds"], one["requests"], one["failed"]) == (200.0, 3, 96, 0)
    assert (peak["output_tokens_per_s"], peak["failed"]) == (2500.0, 2)
    assert peak["accept_length_mean"] == round((6.0 * 32 + 4.0 * 16) / 48, 3)
    assert canary.rounds_figures([[fig(4, 10.0, accept=None)]])[0]["accept_length_mean"] is None


def test_the_candidate_wins_only_by_the_margin_at_every_concurrency() -> None:
    baseline = [fig(1, 100.0), fig(32, 2000.0)]
    won = canary.judge(baseline, [fig(1, 110.0), fig(32, 2200.0)], margin=0.05, min_accept_length=1.5,
                       speculative=True)
    assert won["promote"] and won["reasons"] == []
    assert won["lines"] == [
        "concurrency 1: candidate 110.0 tok/s vs baseline 100.0 tok/s (+10.0%, needs +5.0%); acceptance 5.0 vs 5.0; "
        "failed 0 vs 0 of 32",
        "concurrency 32: candidate 2200.0 tok/s vs baseline 2000.0 tok/s (+10.0%, needs +5.0%); acceptance 5.0 vs "
        "5.0; failed 0 vs 0 of 32",
        "promote: the candidate wins at every concurrency"]
    # Faster at one concurrency and within the margin at the other: kept out, naming where.
    close = canary.judge(baseline, [fig(1, 120.0), fig(32, 2040.0)], margin=0.05, min_accept_length=1.5,
                         speculative=True)
    assert not close["promote"]
    assert close["reasons"] == ["concurrency 32: +2.0% tok/s is not the +5.0% the candidate must win by"]
    assert close["lines"][-1] == "keep out: " + close["reasons"][0]


def test_a_faster_candidate_that_fails_requests_or_collapses_acceptance_is_kept_out() -> None:
    baseline = [fig(32, 2000.0)]
    failing = canary.judge(baseline, [fig(32, 4000.0, failed=1)], margin=0.05, min_accept_length=1.5,
                           speculative=True)
    assert failing["reasons"] == ["concurrency 32: 1 of the candidate's 32 requests failed"]
    collapsed = canary.judge(baseline, [fig(32, 4000.0, accept=1.0)], margin=0.05, min_accept_length=1.5,
                             speculative=True)
    assert collapsed["reasons"] == ["concurrency 32: the candidate's mean acceptance length 1.0 is below 1.5"]
    # Without speculation (a candidate turning it off) acceptance is not asked for; speed still is.
    plain = canary.judge(baseline, [fig(32, 2500.0, accept=None)], margin=0.05, min_accept_length=1.5,
                         speculative=False)
    assert plain["promote"] and "acceptance None vs 5.0" in plain["lines"][0]
    unmeasured = canary.judge([], [fig(32, 2500.0)], margin=0.05, min_accept_length=1.5, speculative=True)
    assert unmeasured["reasons"] == ["concurrency 32: the baseline was not measured there"]
    assert canary.judge(baseline, [], margin=0.05, min_accept_length=1.5,
                        speculative=True)["reasons"] == ["the candidate was not measured"]


def test_keeping_a_promoted_candidate_writes_the_merged_settings_it_changed() -> None:
    cand = canary.candidate({"speculative": {"block_size": 8, "draft_window": 8},
                             "environment": {"SGLANG_ENABLE_SPEC_V2": "1"}})
    class Tagged(str):  # Ansible's strings reach a filter as str subclasses
        pass

    lines = canary.keep_lines(cand, {"algorithm": Tagged("dflash"), "block_size": 16, "draft_window": 16},
                              {"mem_fraction_static": 0.8}, {Tagged("DFLASH_LAB_MARKER"): Tagged("x")})
    assert yaml.safe_load("\n".join(lines)) == {
        "dflash_speculative": {"algorithm": "dflash", "block_size": 8, "draft_window": 8},
        "sglang_service_extra_environment": {"DFLASH_LAB_MARKER": "x", "SGLANG_ENABLE_SPEC_V2": "1"}}


def plan(block: int, gpus: tuple[tuple[int, int], ...] = ((0, 1), (2, 3))) -> dict[str, Any]:
    return {"replicas": [{"index": i, "gpu_ids": list(g), "url": f"http://127.0.0.1:{30001 + i}",
                          "args": ["--model-path", "/m", "--speculative-num-draft-tokens", str(block),
                                   "--port", str(30001 + i), *(["--enable-x"] if block == 8 else [])]}
                         for i, g in enumerate(gpus)]}


def test_a_candidate_given_as_a_string_is_read_as_yaml() -> None:
    assert canary.candidate('{"speculative": {"block_size": 8}}')["speculative"] == {"block_size": 8}
    assert canary.candidate("{unclosed")["problems"][0].startswith("candidate: not YAML or JSON (")


def test_the_changes_on_the_canary_replica_are_its_flags_and_environment_old_to_new() -> None:
    got = canary.changes(plan(16), plan(8), 1, {"STEP": "20"}, {"STEP": "40", "SPEC_V2": "1"})
    assert got == {"problems": [], "lines": ["--enable-x: (absent) -> (on)", "--speculative-num-draft-tokens: 16 -> 8",
                                             "SPEC_V2=(unset) -> 1", "STEP=20 -> 40"]}
    same = canary.changes(plan(16), plan(16), 1, {"STEP": "20"}, {"STEP": "20"})
    assert same["problems"] == ["the candidate plans the same engine and environment as the baseline: nothing to try"]
    moved = canary.changes(plan(16), plan(16, ((0, 1, 2, 3),)), 0, {}, {"STEP": "1"})
    assert moved["lines"] == [] and moved["problems"] == [
        "the candidate's plan changes the replicas (r0 GPUs 0,1,2,3 at http://127.0.0.1:30001; the baseline's: r0 GPUs "
        "0,1 at http://127.0.0.1:30001, r1 GPUs 2,3 at http://127.0.0.1:30002): a canary changes one replica's "
        "settings, not the topology; deploy a new topology with deploy_dflash.yml"]


def test_a_restart_under_load_keeps_a_faster_candidate_out() -> None:
    got = canary.judge([fig(32, 2000.0)], [fig(32, 4000.0)], margin=0.05, min_accept_length=1.5, speculative=True,
                       problems=["r1 restarted during the load run", ""])
    assert not got["promote"] and got["reasons"] == ["r1 restarted during the load run"]


def test_a_candidates_engine_flags_merge_flag_by_flag_over_the_inventorys() -> None:
    inventory = {"mem_fraction_static": 0.8,
                 "engine_flags": {"--disable-overlap-schedule": True, "--max-total-tokens": "64k"}}
    cand = canary.candidate({"plan_overrides": {"engine_flags": {"--mamba-radix-cache-strategy": "extra_buffer",
                                                                  "--disable-overlap-schedule": None}}})
    assert canary.merged(inventory, cand["plan_overrides"]) == {
        "mem_fraction_static": 0.8,
        "engine_flags": {"--max-total-tokens": "64k", "--mamba-radix-cache-strategy": "extra_buffer"}}
    # Without engine flags on either side a part is a plain merge; the inventory's mapping is not changed.
    assert canary.merged({"block_size": 16, "draft_window": 16}, {"block_size": 8}) == {"block_size": 8,
                                                                                        "draft_window": 16}
    assert inventory["engine_flags"]["--disable-overlap-schedule"] is True
    lines = canary.keep_lines(cand, {"algorithm": "dflash"}, inventory, {})
    kept = canary.merged(inventory, cand["plan_overrides"])
    assert yaml.safe_load("\n".join(lines)) == {"dflash_plan_overrides": kept}


def test_a_candidate_engine_flag_shows_as_a_change_of_the_replica() -> None:
    base = plan(16)
    cand = plan(16)
    for replica in cand["replicas"]:
        replica["args"] += ["--mamba-radix-cache-strategy", "extra_buffer"]
    assert canary.changes(base, cand, 1, {}, {}) == {
        "lines": ["--mamba-radix-cache-strategy: (absent) -> extra_buffer"], "problems": []}
