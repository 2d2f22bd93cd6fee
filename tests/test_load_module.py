"""The load gate's client (library/dflash_load.py, run for real with `ansible -m`) against the engine stand-in's HTTP
surface on loopback (lab/engine/sglang/standin/server.py, in this process), and the gate's judgement of what it saw
(dflash_infra.loadgate): the figures where 0.5.23 puts them, the key read from a file, and the failures the gate
exists for (acceptance collapsing at concurrency >= 2, requests failing, a slower engine)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dflash_infra import loadgate
from helpers import ROOT, run_module

sys.path.insert(0, str(ROOT / "lab" / "engine"))
from sglang.standin import server as standin  # the stand-in package, not an engine

PROMPTS = [{"name": "code", "messages": [{"role": "user", "content": "Write a Python function."}]},
           {"name": "math", "messages": [{"role": "user", "content": "What is 180 km in 2.5 hours in km/h?"}]}]
SETTINGS = {"prompts": PROMPTS, "requests": 12, "max_tokens": 48, "thinking": False, "min_accept_length": 1.5,
            "max_regression": 0.10, "accept_regression": False}
KEY = "load-gate-test-key"


def serve(**switches: Any) -> tuple[standin.ThreadingHTTPServer, standin.EngineState]:
    state = standin.EngineState(served_model_name="Qwen3.6-27B", model_path="/models/Qwen3.6-27B",
                                context_length=262144, server_info={}, model_info={}, num_draft_tokens=16,
                                eos_token_id=248044, api_key=KEY, **switches)
    state.ready.set()
    httpd = standin.make_server("127.0.0.1", 0, state)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, state


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "engine.env"
    path.write_text(f"# secrets\nSGLANG_API_KEY={KEY}\n")
    return path


@pytest.fixture
def engine() -> Iterator[standin.ThreadingHTTPServer]:
    httpd, _ = serve()
    yield httpd
    httpd.shutdown()


def load(httpd: standin.ThreadingHTTPServer, key_file: Path, concurrency: list[int], **extra: Any) -> dict[str, Any]:
    host, port = httpd.server_address[:2]
    # The load gate's mapping as the callers pass it: its prompts, requests (12), max_tokens (48) and thinking.
    args = {"url": f"http://{host}:{port}", "model": "Qwen3.6-27B", "workload": SETTINGS, "concurrency": concurrency,
            "api_key_env_file": str(key_file), **extra}
    result = run_module("dflash_load", args)
    assert not result.get("failed"), result
    return result


def test_a_healthy_speculative_engine_passes_with_its_figures_read_where_0523_puts_them(
        engine: standin.ThreadingHTTPServer, key_file: Path) -> None:
    result = load(engine, key_file, [1, 4])
    assert result["changed"] is False
    # Only the spec_* fields travel back (no text, no histograms).
    answer = result["runs"][0]["outcomes"][0]["answer"]
    assert set(answer) == {"choices", "sglext"}
    assert set(answer["choices"][0]["meta_info"]) >= {"spec_accept_length", "spec_verify_ct"}
    assert not any(k.endswith("_histogram") for k in answer["sglext"]["spec_tokens_details"])
    # Every second request streamed: its acceptance from the sglext chunk, its first token between send and end.
    outcomes = result["runs"][0]["outcomes"]
    assert [o["stream"] for o in outcomes] == [False, True] * 6
    assert set(outcomes[1]["answer"]) == {"sglext"} and "first_token" not in outcomes[0]
    assert all(o["started"] < o["first_token"] < o["finished"] for o in outcomes[1::2])
    figures = loadgate.run_figures(result["runs"])
    assert [(f["concurrency"], f["requests"], f["failed"]) for f in figures] == [(1, 12, 0), (4, 12, 0)]
    assert all(f["output_tokens"] == 12 * 48 and f["accept_length_requests"] == 12 for f in figures)
    # Inter-token gaps are read as the chunks arrive: on a busy machine several chunks wait in the socket and are
    # read back to back, so a median gap may round to 0.0 ms; the slowest gaps still show the engine's steps.
    assert all(0 < f["ttft_ms_p50"] <= f["ttft_ms_p99"] and 0 <= f["itl_ms_p50"] <= f["itl_ms_p99"]
               and f["itl_ms_p99"] > 0 for f in figures), figures
    assert all(f["accept_length_mean"] > 3 for f in figures), figures
    verdict = loadgate.verdict(figures, None, SETTINGS, speculative=True)
    assert verdict["passed"], verdict
    assert verdict["load"]["inputs"]["prompts"] == ["code", "math"] and verdict["load"]["figures"] == figures
    # The same figures as the previous deployment's, same inputs: compared, and passing.
    again = loadgate.verdict(figures, verdict["load"], SETTINGS, speculative=True)
    assert again["passed"] and "previous deployment:" in again["lines"][0]
    # Other prompts: recorded without comparing (a regression against other inputs would mean nothing).
    other = loadgate.verdict(figures, {**verdict["load"], "inputs": {"prompts_sha256": "0"}}, SETTINGS, True)
    assert other["passed"] and other["lines"][-1].startswith("the previous deployment ran other load inputs")


def test_acceptance_collapsing_at_concurrency_fails_the_gate(key_file: Path) -> None:
    # Decode steps long enough that the four workers overlap even on a busy machine (a request that starts alone keeps
    # its acceptance and lasts about 11 steps: at 10 ms a step, workers started 0.1 s apart on a loaded machine ran
    # alone and the mean at concurrency 4 stayed near 2; at 30 ms they have a third of a second).
    httpd, _ = serve(accept_collapse=True, step_s=0.03)
    try:
        figures = loadgate.run_figures(load(httpd, key_file, [1, 4])["runs"])
    finally:
        httpd.shutdown()
    one, four = figures
    # Every request that ran beside another accepted nothing (1.0); a worker's first request may have run alone.
    assert one["accept_length_mean"] > 3 and four["accept_length_mean"] < 1.5, figures
    verdict = loadgate.verdict(figures, None, SETTINGS, speculative=True)
    assert not verdict["passed"]
    assert verdict["problems"] == [f"concurrency 4: mean acceptance length {four['accept_length_mean']} is below 1.5: "
                                   "the drafter costs time without saving it"]


def test_failed_requests_and_a_restart_fail_the_gate(engine: standin.ThreadingHTTPServer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-key"
    wrong.write_text("not-the-key\n")
    host, port = engine.server_address[:2]
    # An option given beside the workload wins over the workload's (3 requests, not 12).
    result = run_module("dflash_load", {"url": f"http://{host}:{port}", "model": "Qwen3.6-27B", "workload": SETTINGS,
                                        "requests": 3, "concurrency": [2], "api_key_file": str(wrong)})
    figures = loadgate.run_figures(result["runs"])
    assert figures[0]["failed"] == 3 and figures[0]["errors"] == ['HTTP 401: {"error":"Unauthorized"}']
    # A workload value of the wrong type is refused, naming it (not a traceback).
    wrong_type = run_module("dflash_load", {"url": f"http://{host}:{port}", "model": "Qwen3.6-27B",
                                            "workload": {**SETTINGS, "requests": "many"}, "api_key_file": str(wrong)})
    assert wrong_type["failed"] and wrong_type["msg"] == ("dflash_load: expected the workload's requests of type int, "
                                                          "found 'many'"), wrong_type
    restarted = loadgate.restart_problem({"restarted": True, "before": {"NRestarts": "0"},
                                          "after": {"NRestarts": "1", "ActiveState": "activating"}}, "r0.service")
    verdict = loadgate.verdict(figures, None, SETTINGS, speculative=True, restarted=restarted)
    assert verdict["problems"][0] == ("r0.service restarted during the load run (NRestarts 0 -> 1, now activating): "
                                      "it crashed under load")
    assert verdict["problems"][1].startswith("concurrency 2: 3 of 3 requests failed (HTTP 401")
    assert loadgate.restart_problem({"restarted": False}, "r0.service") == ""


def test_a_slower_engine_fails_against_the_previous_deployment(engine: standin.ThreadingHTTPServer,
                                                               key_file: Path) -> None:
    before = loadgate.verdict(loadgate.run_figures(load(engine, key_file, [4])["runs"]), None, SETTINGS, True)
    slow, _ = serve(step_s=0.002 * 8)
    try:
        after = loadgate.run_figures(load(slow, key_file, [4])["runs"])
    finally:
        slow.shutdown()
    verdict = loadgate.verdict(after, before["load"], SETTINGS, speculative=True)
    assert not verdict["passed"], verdict
    problem = verdict["problems"][0]
    assert "below the previous deployment's" in problem and "(at most 10% allowed)" in problem
    accepted = loadgate.verdict(after, before["load"], {**SETTINGS, "accept_regression": True}, speculative=True)
    assert accepted["passed"] and accepted["lines"][-1].endswith("accepted on purpose")


def test_several_engines_are_watched_for_a_restart_during_one_run(
        engine: standin.ThreadingHTTPServer, key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`units` (the replicas behind a gateway): each unit is read before and after the run (systemctl show; here a
    stand-in systemctl on PATH that reports r1 restarted by its second read) and the gate names each that restarted."""
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n'
                    'calls="$FAKE_SYSTEMCTL_DIR/$2.calls"; echo x >> "$calls"; n=$(wc -l < "$calls")\n'
                    'if [ "$2" = r1.service ] && [ "$n" -gt 1 ]; then echo NRestarts=1; echo InvocationID=b\n'
                    'else echo NRestarts=0; echo InvocationID=a; fi\n'
                    'echo ActiveState=active\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_DIR", str(tmp_path))
    result = load(engine, key_file, [2], requests=2, units=["r0.service", "r1.service"])
    assert sorted(result["units"]) == ["r0.service", "r1.service"] and "unit" not in result
    assert result["units"]["r0.service"]["restarted"] is False
    assert result["units"]["r1.service"]["before"]["NRestarts"] == "0"
    assert result["units"]["r1.service"]["after"]["NRestarts"] == "1"
    assert loadgate.restarts_problem(result["units"]) == ("r1.service restarted during the load run (NRestarts 0 -> 1, "
                                                          "now active): it crashed under load")
    assert (tmp_path / "r0.service.calls").read_text() == "x\nx\n"  # once before and once after the run
