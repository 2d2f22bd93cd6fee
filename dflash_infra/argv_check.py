"""A rendered engine argv read back the way the release's own parser reads it, and its security-relevant values
held against the plan's.

The parser is rebuilt from the release's extracted flag table (`data/sglang/<version>.json`: every option's
spellings, action, nargs, type and choices, and the parser's own settings such as prefix matching), so a deploy
checks its argv on any controller, without the engine installed. A value that smuggles a flag (`--x --host
0.0.0.0`), a repeated flag or a prefix the parser expands would make the engine listen, serve or load something the
plan does not say; every such difference is an error naming both values. tests/test_argv_check_real_parser.py holds
the same comparison against the release's real parser.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from dflash_infra import engine

# The values that decide who can reach the engine, what it loads and serves, and on how many GPUs.
SECURITY_DESTS = ("host", "port", "api_key", "admin_api_key", "model_path", "speculative_draft_model_path",
                  "served_model_name", "tp_size", "dp_size")
_TYPES = {"int": int, "float": float}


class _Refused(Exception):
    """argparse refused the argv (its message)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's exit becomes an exception with its message
        raise _Refused(message)


def _add(parser: argparse.ArgumentParser, option: Mapping[str, Any]) -> None:
    """One extracted option as argparse registers it (values kept as text unless int or float)."""
    strings, action = list(option["option_strings"]), str(option.get("action"))
    kwargs: dict[str, Any] = {"dest": option["dest"], "default": None}
    if action == "help":
        return
    if action == "boolean_optional":
        kwargs["action"] = argparse.BooleanOptionalAction
    elif option.get("nargs") == 0:
        kwargs["action"] = "store_const"
        kwargs["const"] = option.get("const", True)
    else:
        kwargs["nargs"] = option.get("nargs")
        kind = _TYPES.get(str(option.get("type")))
        if kind is not None:
            kwargs["type"] = kind
        if option.get("choices") and kind is None:
            kwargs["choices"] = [str(c) for c in option["choices"]]
    parser.add_argument(*strings, **kwargs)


def table_parser(table: engine.FlagTable) -> argparse.ArgumentParser | None:
    """The release's parser rebuilt from its table; None for a table that knows spellings only (the installed
    engine's --help: the deploy's own parse of the argv there is the engine's, sglang_engine's flag check)."""
    return _parser(table.version) if table.options else None


@cache
def _parser(name: str) -> argparse.ArgumentParser:
    raw = engine.table_data(name)
    settings = raw.get("parser") or {}
    parser = _Parser(prog=str(settings.get("prog") or "sglang serve"), add_help=False,
                     allow_abbrev=bool(settings.get("allow_abbrev", True)))
    seen: set[str] = set()
    for option in raw["options"]:
        if option["dest"] in seen and option.get("action") != "boolean_optional":
            continue
        seen.add(option["dest"])
        _add(parser, option)
    return parser


def read(argv: Sequence[str], table: engine.FlagTable) -> tuple[dict[str, Any] | None, str | None]:
    """{dest: value} of the security-relevant options as the release's parser reads the argv, or its refusal (None,
    None for a table without option details)."""
    parser = table_parser(table)
    if parser is None:
        return None, None
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            namespace = parser.parse_args([str(w) for w in argv])
        except _Refused as exc:
            return None, str(exc)
    return {dest: getattr(namespace, dest, None) for dest in SECURITY_DESTS}, None


def expected(model_path: Any, draft_path: Any, serve: Mapping[str, Any], tp: int, dp: int | None) -> dict[str, Any]:
    """What the plan says of each security-relevant value (no key ever on the command line)."""
    return {"host": serve.get("host"), "port": serve.get("port"), "api_key": None, "admin_api_key": None,
            "model_path": model_path, "speculative_draft_model_path": draft_path,
            "served_model_name": serve.get("served_model_name"), "tp_size": tp, "dp_size": dp}


def _same(planned: Any, found: Any) -> bool:
    if planned is None:
        return found is None
    return found is not None and str(found) == str(planned)


def problems(argv: Sequence[str], table: engine.FlagTable, want: Mapping[str, Any], label: str) -> list[str]:
    """Each security-relevant value the release's parser reads differently from the plan, naming both."""
    read_back, refused = read(argv, table)
    if refused is not None:
        return [f"{label}: SGLang {table.version}'s parser (its flag table) refuses the rendered argv: {refused}"]
    if read_back is None:
        return []
    out = []
    for dest in SECURITY_DESTS:
        planned, found = want.get(dest), read_back[dest]
        if not _same(planned, found):
            shown = "set" if dest in ("api_key", "admin_api_key") and found is not None else repr(found)
            out.append(f"{label}: the engine would read {dest} {shown}, the plan says {planned!r}; refusing the "
                       "deploy (an input carries a flag or a value the plan does not hold)")
    return out
