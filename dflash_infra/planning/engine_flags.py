"""`overrides.engine_flags`: engine flags the planner has no setting for, checked against the release's table.

For what the team wants to try or keep that the planner does not decide (`--mamba-radix-cache-strategy
extra_buffer`, CUDA-graph limits, `--disable-overlap-schedule`, ...), as a mapping `--flag: value`:
`true` renders the bare flag (an on/off flag), a string or number `--flag value`, a list `--flag v1 v2` (a flag
that takes several), `null` or `false` leaves the flag out (a canary candidate drops one the inventory sets).

Refused up front, each naming the flag and what to do: a flag the release does not accept, or accepts only as a
hidden deprecated alias; a flag (any spelling of it) the planner renders itself (use its override or the
speculative section instead); a secret (`--api-key`: secrets stay out of the unit file and `ps`); a value the
flag cannot take (on/off flags take `true`; the release's choices; int and float types; one value or several).
The rendered argv is checked again by the installed engine's own parser at deploy time, as every plan is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_infra import engine

OVERRIDE = "engine_flags"
# Options whose value is a secret: never on a command line (the engine's key comes from its environment file).
SECRET_DESTS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"})
# Planner settings a request changes through the speculative section rather than an override.
SPECULATIVE_SETTINGS = frozenset({"speculative_algorithm", "draft_model_path", "block_size", "draft_window",
                                  "draft_attention_backend", "tree_budget"})
# What a flag rendered only for DDTree (overlap scheduling off) is owned by.
DDTREE_OWNED = "ddtree"
_SCALAR = (str, int, float)
# sglang.srt.utils.common.human_readable_int's accepted text.
HUMAN_INT = re.compile(r"\d+(?:\.\d+)?(?:Ki|Mi|Gi|Ti|k|M|G|T)?")


def shape_problems(value: Any) -> list[str]:
    """What is wrong with the override's shape, before any table is read."""
    where = f"overrides.{OVERRIDE}"
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [f"{where}: expected a mapping of engine flag -> value (e.g. "
                f"{{'--mamba-radix-cache-strategy': 'extra_buffer'}}), found {type(value).__name__}"]
    problems = []
    for flag, setting in value.items():
        if not isinstance(flag, str) or not flag.startswith("--"):
            problems.append(f"{where}: expected flags spelled as the engine's --help does (--name), found {flag!r}")
        elif isinstance(setting, list | tuple):
            if not setting or not all(isinstance(v, _SCALAR) and not isinstance(v, bool) for v in setting):
                problems.append(f"{where}.{flag}: expected a non-empty list of strings or numbers, found {setting!r}")
            else:
                problems += _word_problems(f"{where}.{flag}", setting)
        elif setting is not None and not isinstance(setting, _SCALAR):
            problems.append(f"{where}.{flag}: expected true, a string, a number or a list, found "
                            f"{type(setting).__name__}")
        elif isinstance(setting, str):
            problems += _word_problems(f"{where}.{flag}", [setting])
    return problems


def _word_problems(where: str, values: Sequence[Any]) -> list[str]:
    """A value word that the engine's parser would read as another flag (`--host 0.0.0.0` inside a value opens the
    endpoint), or that carries a control character (a newline ends the unit's line), is refused naming it; numbers
    are given as numbers (a negative one renders as its digits)."""
    problems = []
    for value in values:
        if isinstance(value, str) and value.startswith("-"):
            problems.append(f"{where}: the value {value!r} begins with '-', so the engine would read it as a flag "
                            "of its own; a value cannot carry flags (give numbers as numbers)")
        elif isinstance(value, str) and re.search(r"[\x00-\x1f\x7f]", value):
            problems.append(f"{where}: the value {value!r} holds a control character (a newline, a tab, ...); "
                            "expected one line of text")
    return problems


def _typed(value: Any, option: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """One value as the option's type and choices take it: (its text, None) or (None, the error)."""
    kind, choices = str(option.get("type")), option.get("choices")
    if kind.endswith("human_readable_int") and not HUMAN_INT.fullmatch(engine.format_value(value)):
        return None, f"expected an integer, optionally with a k/M/G/T or Ki/Mi/Gi/Ti suffix, found {value!r}"
    integer = isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())
    if kind == "int" and not integer:
        return None, f"expected an integer, found {value!r}"
    if kind == "float":
        try:
            float(value)
        except (TypeError, ValueError):
            return None, f"expected a number, found {value!r}"
    text = engine.format_value(value)
    if choices and text not in [str(c) for c in choices]:
        return None, f"expected one of {', '.join(map(str, choices))}, found {text!r}"
    return text, None


def _value_argv(flag: str, value: Any, option: Mapping[str, Any] | None) -> tuple[list[str], str | None]:
    """The words after `flag` for `value` (a value render has not left out), or the error."""
    nargs = None if option is None else option.get("nargs")
    values = list(value) if isinstance(value, list | tuple) else [value]
    if option is None:  # a table from --help: spellings only
        return ([] if value is True else [engine.format_value(v) for v in values]), None
    if nargs == 0:
        if value is True:
            return [], None
        return [], f"an on/off flag: expected true (or null to leave it out), found {value!r}"
    if value is True:
        return [], "takes a value: expected a string or a number, found true"
    if nargs in (None, "?") and isinstance(value, list | tuple):
        return [], f"takes one value, found a list {list(value)!r}"
    words = []
    for item in values:
        text, error = _typed(item, option)
        if error:
            return [], error
        words.append(str(text))
    return words, None


def owned_flags(version: str, table: engine.FlagTable, planner_flags: Mapping[str, str]) -> dict[str, str]:
    """Every spelling of a flag the planner renders -> the setting or override that controls it (`planner_flags`:
    flag -> setting, beside the settings table)."""
    owned: dict[str, str] = {}
    rendered = {flag: setting for setting, flag in engine.setting_flags(version).items()}
    for flag, setting in {**rendered, **planner_flags}.items():
        option = table.option(flag)
        for spelling in (option or {}).get("option_strings") or [flag]:
            owned[spelling] = setting
    return owned


def _owner_hint(setting: str, known_overrides: Sequence[str]) -> str:
    if setting == DDTREE_OWNED:
        return "DDTree (SGLang PR #29907) always runs with it; nothing to set"
    if setting in known_overrides:
        return f"use overrides.{setting}"
    if setting in SPECULATIVE_SETTINGS:
        return "set it in the speculative section (dflash_speculative)"
    return ("the planner derives it from the plan (models, GPUs and their memory, the service's address); no "
            "override sets it directly")


def render(flags: Mapping[str, Any] | None, table: engine.FlagTable, owned: Mapping[str, str],
           known_overrides: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """argv (flags in name order, so the unit does not depend on the mapping's order), errors and one reason line
    per rendered flag."""
    argv: list[str] = []
    errors: list[str] = []
    lines: list[str] = []
    where = f"overrides.{OVERRIDE}"
    for flag in sorted(flags or {}):
        value = (flags or {})[flag]
        if value is None or value is False:
            continue
        option = table.option(flag)
        if flag in owned:
            errors.append(f"{where}: {flag} is rendered by the planner ({owned[flag]}); "
                          f"{_owner_hint(owned[flag], known_overrides)}")
            continue
        if option is not None and option.get("dest") in SECRET_DESTS:
            errors.append(f"{where}: {flag} is a secret; it never goes on the command line (the unit file, ps): "
                          "the engine's key comes from its environment file (dflash_service_api_key)")
            continue
        if not table.accepts(flag):
            if flag in table.hidden:
                new = ((option or {}).get("action_kwargs") or {}).get("new_flag")
                errors.append(f"{where}: {flag} is deprecated in SGLang {table.version} (hidden from its --help)"
                              + (f"; it names {new} instead" if new else "; use the flag that replaced it"))
            else:
                errors.append(f"{where}: {flag} is not accepted by SGLang {table.version}; drop it or plan for "
                              "an engine that has it")
            continue
        if option is not None and option.get("action") == "help":
            errors.append(f"{where}: {flag} prints help and exits; it cannot serve")
            continue
        words, error = _value_argv(flag, value, option)
        if error:
            errors.append(f"{where}.{flag}: {error}")
            continue
        argv += [flag, *words]
        lines.append(" ".join([flag, *words]))
    return argv, errors, lines
