"""A rendered argv read back by the release's parser rebuilt from its flag table (dflash_infra/argv_check.py): a value
that smuggles a flag, a repeated flag or an abbreviation cannot make the engine listen, serve or load what the plan
does not say. tests/test_argv_check_real_parser.py holds the table's reading against the release's real parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dflash_infra import argv_check, engine
from dflash_infra.planner import plan_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TABLE = engine.flag_table("0.5.23")


def planned(gateway: bool = False) -> dict:
    request = yaml.safe_load((EXAMPLES / "pro6000.yml").read_text())
    if gateway:
        request["gateway"] = {}
    result = plan_dict(request, EXAMPLES)
    assert result["errors"] == []
    return result


def want(plan: dict, argv: list[str]) -> dict:
    value = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    return argv_check.expected(value["--model-path"], value.get("--speculative-draft-model-path"),
                               {"host": value["--host"], "port": int(value["--port"]),
                                "served_model_name": value["--served-model-name"]},
                               plan["tp_size"], plan["dp_size"] if not plan["replicas"] and plan["dp_size"] > 1
                               else None)


def test_the_planned_argvs_read_back_as_planned() -> None:
    for plan in (planned(), planned(gateway=True)):
        for argv in [r["args"] for r in plan["replicas"]] or [plan["args"]]:
            assert argv_check.problems(argv, TABLE, want(plan, argv), "argv") == []
    read, refused = argv_check.read(planned()["args"], TABLE)
    assert refused is None and read is not None
    assert (read["host"], read["port"], read["tp_size"], read["dp_size"], read["api_key"]) == ("0.0.0.0", 30000, 2, 4,
                                                                                             None)


@pytest.mark.parametrize(("extra", "dest", "found"), [
    (["--uvicorn-access-log-exclude-prefixes", "--host", "0.0.0.0"], "host", "'0.0.0.0'"),
    (["--uvicorn-access-log-exclude-prefixes", "/x", "--api-key", "k"], "api_key", "set"),
    (["--served-model-n", "other"], "served_model_name", "'other'"),  # an abbreviation argparse expands
    (["--port", "8080"], "port", "8080"),  # a repeated flag: the last one wins
    (["--model", "/srv/other"], "model_path", "'/srv/other'"),  # another spelling of --model-path
    (["--tensor-parallel-size", "8"], "tp_size", "8"),
])
def test_a_smuggled_value_is_a_difference_naming_both(extra: list[str], dest: str, found: str) -> None:
    plan = planned(gateway=True)
    argv = plan["replicas"][0]["args"]
    [problem] = argv_check.problems(argv + extra, TABLE, want(plan, argv), "replica 0's engine argv")
    assert problem.startswith(f"replica 0's engine argv: the engine would read {dest} {found}, the plan says ")
    assert "refusing the deploy" in problem


def test_an_argv_the_parser_refuses_is_named_and_a_spellings_only_table_is_not_read() -> None:
    plan = planned()
    [problem] = argv_check.problems(plan["args"] + ["--tp-size", "two"], TABLE, want(plan, plan["args"]), "argv")
    assert "parser (its flag table) refuses the rendered argv: argument --tp-size/--tensor-parallel-size: invalid " \
           "int value: 'two'" in problem
    from_help = engine.FlagTable.from_options("0.5.23", TABLE.visible)
    assert argv_check.read(plan["args"] + ["--host", "0.0.0.0"], from_help) == (None, None)
