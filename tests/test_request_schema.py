"""The planner's request schema (dflash_infra/planning/schema.py): every malformed input is an error naming the
field, the value and what is allowed; never an exception, never a traceback from the CLI.

The property tests take the examples' requests and break one field at a time with arbitrary values (wrong types,
out-of-range and huge numbers, floats for integers, control characters, empty and nested containers, bytes).
tests/test_schema_real_parser.py holds the other half: a malformed request that still plans renders an argv the
release's real parser accepts, with the plan's security-relevant values.
"""

from __future__ import annotations

import copy
import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_infra import cli
from dflash_infra.planner import plan_dict
from dflash_infra.planning import schema

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def example(name: str = "pro6000") -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())
    return loaded


# Where a request can be broken: a path of keys (ints index lists).
FIELDS: list[tuple[Any, ...]] = [
    ("gpus",), ("gpus", 0), ("gpus", 0, "name"), ("gpus", 0, "memory_total_mib"), ("gpus", 0, "compute_cap"),
    ("gpus", 0, "index"), ("target",), ("target", "name"), ("target", "path"), ("target", "weights_bytes"),
    ("target", "config"), ("draft",), ("draft", "path"), ("speculative",), ("speculative", "algorithm"),
    ("speculative", "block_size"), ("speculative", "draft_window"), ("speculative", "max_draft_tokens"),
    ("speculative", "tree_budget"), ("sglang_version",), ("serve",), ("serve", "host"), ("serve", "port"),
    ("serve", "served_model_name"), ("capacity",), ("capacity", "min_running_requests"),
    ("capacity", "min_kv_cache_tokens"), ("overrides",), ("overrides", "tp_size"), ("overrides", "dp_size"),
    ("overrides", "mem_fraction_static"), ("overrides", "max_running_requests"), ("overrides", "context_length"),
    ("overrides", "chunked_prefill_size"), ("overrides", "page_size"), ("overrides", "engine_flags"),
    ("overrides", "attention_backend"), ("context_length",), ("gateway",), ("engine_options",), ("model_root",),
]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=31), min_size=1, max_size=5),
    st.binary(max_size=20), st.sampled_from(["", "two", "abc", "0.0.0.0 --api-key x", "7.9", "-1", "1e309",
                                             "/root/models/../../etc", "a\nb", "%n", "--host"]),
)
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=8)


def broken(request: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(request)
    node: Any = out
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    node[path[-1]] = value
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["pro6000", "eval"]), path=st.sampled_from(FIELDS), value=junk)
def test_a_broken_field_is_an_error_naming_it_or_a_plan_never_an_exception(name: str, path: tuple[Any, ...],
                                                                          value: Any) -> None:
    request = broken(example(name), path, value)
    result = plan_dict(request, EXAMPLES)  # must not raise
    assert isinstance(result["errors"], list) and all(isinstance(e, str) and e for e in result["errors"])
    if result["errors"]:
        assert result["args"] == [] and result["replicas"] == []
        return
    # A request that still plans renders one-line words only, none of them a flag carried inside a value.
    for word in result["args"]:
        assert "\n" not in word and "\x00" not in word
    assert result["args"].count("--host") <= 1 and result["args"].count("--port") <= 1


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from([p for p in FIELDS if len(p) >= 2 and isinstance(p[-1], str)]),
       value=st.one_of(st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                             max_size=2), st.binary(max_size=4)))
def test_a_field_of_the_wrong_kind_is_named_in_the_error(path: tuple[Any, ...], value: Any) -> None:
    """A list, an object or bytes where the schema wants a scalar (or the reverse): the error starts with the
    field's dotted name, so the operator knows which input to fix."""
    if path[-1] in ("config", "engine_flags") and isinstance(value, dict):
        return  # those take objects
    request = broken(example(), path, value)
    errors = plan_dict(request, EXAMPLES)["errors"]
    dotted = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[")
    assert any(e.startswith(dotted) for e in errors), (dotted, errors)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("speculative", "block_size"), "abc", "speculative.block_size: expected an integer from 1 to 64, found 'abc'"),
    (("speculative", "block_size"), 7.9, "speculative.block_size: expected an integer from 1 to 64, found 7.9"),
    (("speculative", "draft_window"), "wide", "speculative.draft_window: expected an integer from 1 to"),
    (("overrides", "tp_size"), "two", "overrides.tp_size: expected an integer from 1 to 64, found 'two'"),
    (("overrides", "tp_size"), -1, "overrides.tp_size: expected an integer from 1 to 64, found -1"),
    (("overrides", "context_length"), -5, "overrides.context_length: expected an integer from 1 to"),
    (("gpus", 0, "memory_total_mib"), 10**30, "gpus[0].memory_total_mib: expected an integer from 1 to 16777216"),
    (("capacity",), [1, 2], "capacity: expected an object with min_running_requests, min_kv_cache_tokens"),
    (("overrides",), ["tp_size"], "overrides: expected an object with tp_size"),
    (("speculative",), "dflash", "speculative: expected an object with algorithm"),
    (("serve", "port"), -1, "serve.port: expected an integer from 1 to 65535, found -1"),
    (("serve", "port"), "abc", "serve.port: expected an integer from 1 to 65535, found 'abc'"),
    (("serve", "host"), "0.0.0.0 --api-key x", "serve.host: expected an IP address or a DNS name, found "
                                               "'0.0.0.0 --api-key x'"),
    (("serve", "served_model_name"), "Qwen\n[Service]\nExecStartPre=/bin/sh",
     "serve.served_model_name: expected 1-128 of letters, digits and . _ : / @ + - (starting with a letter or "
     "digit), found 'Qwen\\n[Service]\\nExecStartPre=/bin/sh'"),
    (("serve", "served_model_name"), "Qwen%n", "serve.served_model_name: expected 1-128 of letters"),
    (("target", "path"), "/root/models/../../etc", "target.path: expected an absolute, normalised path"),
    (("draft", "path"), "models/Qwen3.6-27B-DFlash", "draft.path: expected an absolute, normalised path"),
    (("target", "path"), "/root/models//Qwen3.6-27B", "target.path: expected an absolute, normalised path"),
])
def test_each_reviewed_input_gets_an_error_naming_the_field_and_what_is_allowed(path: tuple[Any, ...], value: Any,
                                                                               message: str) -> None:
    result = plan_dict(broken(example(), path, value), EXAMPLES)
    assert any(e.startswith(message) for e in result["errors"]), result["errors"]
    assert result["args"] == []


def test_model_paths_must_lie_under_the_model_root_when_the_request_names_it() -> None:
    request = example()
    request["model_root"] = "/root/models"
    assert plan_dict(request, EXAMPLES)["errors"] == []
    request["draft"]["path"] = "/srv/elsewhere/Qwen3.6-27B-DFlash"
    assert plan_dict(request, EXAMPLES)["errors"] == [
        "draft.path: expected a folder under the model root /root/models, found '/srv/elsewhere/Qwen3.6-27B-DFlash'"]
    request["draft"]["path"] = "/root/models"  # one level too high: the root itself
    assert plan_dict(request, EXAMPLES)["errors"] == [
        "draft.path: expected a folder under the model root /root/models, found '/root/models'"]


@pytest.mark.parametrize("value", [["--host", "0.0.0.0"], "--host", "-1", ["a", "--api-key"], "x\ny"])
def test_an_engine_flag_value_cannot_carry_another_flag_or_a_line(value: Any) -> None:
    """`--uvicorn-access-log-exclude-prefixes ["--host", "0.0.0.0"]` would make the real parser read host 0.0.0.0
    while the plan says loopback: a value word beginning with '-' is refused, naming it."""
    request = example()
    request["overrides"] = {"engine_flags": {"--uvicorn-access-log-exclude-prefixes": value}}
    errors = plan_dict(request, EXAMPLES)["errors"]
    assert any(e.startswith("overrides.engine_flags.--uvicorn-access-log-exclude-prefixes: the value") for e in errors)


def test_negative_numbers_as_numbers_are_values_not_flags() -> None:
    words = schema_words({"--watchdog-timeout": 300.5})
    assert words == ["--watchdog-timeout", "300.5"]


def schema_words(flags: dict[str, Any]) -> list[str]:
    request = example()
    request["overrides"] = {"engine_flags": flags}
    result = plan_dict(request, EXAMPLES)
    assert result["errors"] == [], result["errors"]
    args: list[str] = result["args"]
    first = next(iter(flags))
    at = args.index(first)
    return args[at:at + 2]


@pytest.mark.parametrize("data", [b"\xff\xfe\x00garbage", b"gpus: [\n", b"- 1\n- 2\n", b"{" * 5000 + b"}" * 5000,
                                  b"\x00\x01\x02", b"gpus: !!python/object:os.system {}\n", b""])
def test_the_cli_answers_bad_input_with_rc_2_and_one_line(data: bytes, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert cli.main(["plan", "-"]) == 2
    out, err = capsys.readouterr()
    if err:
        assert err.startswith("dflash-infra: ") and err.count("\n") == 1
    else:
        assert '"errors": [' in out


def test_check_request_keeps_the_values_of_a_good_request() -> None:
    request = example()
    checked, errors = schema.check_request(request)
    assert errors == [] and checked == request
