"""The flag table's reading of an argv (dflash_infra/argv_check.py, what a deploy checks) against the release's REAL
parser: every example's and replica's argv gives the plan's security-relevant values (host, port, no key, model and
draft paths, served name, TP/DP) to the real parser too, and the smuggling argvs the deploy refuses are read the same
way by both, so the check refuses what the engine would really do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra import argv_check, engine
from dflash_infra.planner import plan_dict
from sglang_real import check_argvs

pytestmark = pytest.mark.sglang_parser

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TABLE = engine.flag_table("0.5.23")
SMUGGLED = [["--uvicorn-access-log-exclude-prefixes", "--host", "0.0.0.0"],
            ["--uvicorn-access-log-exclude-prefixes", "/x", "--api-key", "k"], ["--served-model-n", "other"],
            ["--port", "8080"], ["--model", "/srv/other"], ["--tensor-parallel-size", "8"]]


def argvs() -> dict[str, tuple[list[str], dict[str, Any]]]:
    out = {}
    for name in ("pro6000", "eval"):
        for gateway in (False, True):
            request = yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())
            if gateway:
                request["gateway"] = {}
            plan = plan_dict(request, EXAMPLES)
            assert plan["errors"] == [], plan["errors"]
            for i, argv in enumerate([r["args"] for r in plan["replicas"]] or [plan["args"]]):
                out[f"{name}{' gateway replica ' + str(i) if gateway else ''}"] = (argv, plan)
    return out


def test_the_real_parser_reads_every_planned_argv_as_the_plan_holds_it() -> None:
    cases = argvs()
    results = check_argvs("0.5.23", [argv for argv, _ in cases.values()])
    for (name, (argv, plan)), result in zip(cases.items(), results, strict=True):
        assert result["ok"], (name, result["error"])
        real = {dest: result["namespace"].get(dest) for dest in argv_check.SECURITY_DESTS}
        table, refused = argv_check.read(argv, TABLE)
        assert refused is None and table == real, name
        assert real["api_key"] is None and real["admin_api_key"] is None, name
        assert real["tp_size"] == plan["tp_size"], name
        assert real["port"] == int(argv[argv.index("--port") + 1]) and real["host"] == argv[argv.index("--host") + 1]


def test_the_real_parser_reads_each_smuggled_argv_as_the_deploy_check_does() -> None:
    base = argvs()["pro6000 gateway replica 0"][0]
    results = check_argvs("0.5.23", [base + extra for extra in SMUGGLED])
    for extra, result in zip(SMUGGLED, results, strict=True):
        assert result["ok"], (extra, result["error"])
        real = {dest: result["namespace"].get(dest, None) for dest in argv_check.SECURITY_DESTS}
        table, refused = argv_check.read(base + extra, TABLE)
        assert refused is None
        # The real parser lists only what the argv gave; unset keys read None in both.
        assert {k: v for k, v in table.items() if v is not None} == {k: v for k, v in real.items() if v is not None}, \
            extra


def test_a_malformed_request_that_still_plans_renders_an_argv_the_real_parser_reads_as_planned() -> None:
    """The schema's property test (tests/test_request_schema.py) with the release's real parser as the judge: every
    broken request either is an error naming a field, or plans an argv that SGLang 0.5.23's own parser accepts and
    reads with the plan's security-relevant values."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from test_request_schema import FIELDS, broken, example, junk

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(name=st.sampled_from(["pro6000", "eval"]), path=st.sampled_from(FIELDS), value=junk)
    def check(name: str, path: tuple[Any, ...], value: Any) -> None:
        result = plan_dict(broken(example(name), path, value), EXAMPLES)
        if result["errors"]:
            assert result["args"] == []
            return
        argvs = [r["args"] for r in result["replicas"]] or [result["args"]]
        for argv, real in zip(argvs, check_argvs("0.5.23", argvs), strict=True):
            assert real["ok"], (path, value, real["error"])
            table, refused = argv_check.read(argv, TABLE)
            assert refused is None
            ns = real["namespace"]
            assert {k: v for k, v in table.items() if v is not None} == \
                {k: ns[k] for k in argv_check.SECURITY_DESTS if ns.get(k) is not None}

    check()
