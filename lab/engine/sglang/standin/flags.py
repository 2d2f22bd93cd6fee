"""LAB STAND-IN: SGLang's `sglang serve` argument parser, rebuilt from the flag table of the real wheel.

The table (dflash_infra/data/sglang/<release>.json, written by tools/extract_sglang_flags.py from the
real parser) is copied into this package when the wheel is built. Rebuilding the parser from it, with
the same prog, option strings, order, nargs, choices, defaults and action kinds, makes unknown flags,
removed flags and ambiguous prefixes fail with argparse's own usage + error text and exit 2, exactly
as the real server does. Standard library only: the lab container has nothing but python3.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

logger = logging.getLogger("sglang.srt.arg_groups.argparse_actions")

PACKAGED_TABLES = Path(__file__).resolve().parent / "data"
# Running from the source tree (lab/engine/sglang/standin/): the repository's tables.
SOURCE_TREE_TABLES = Path(__file__).resolve().parents[4] / "dflash_infra" / "data" / "sglang"
TABLE_ENV = "SGLANG_STANDIN_FLAG_TABLE"


class FlagTableMissing(RuntimeError):
    """No flag table for the stand-in's release could be found."""


def table_path(release: str, env: dict[str, str] | None = None) -> Path:
    """The table to load: $SGLANG_STANDIN_FLAG_TABLE, the packaged copy, or the source tree's."""
    env = os.environ if env is None else env
    if env.get(TABLE_ENV):
        return Path(env[TABLE_ENV])
    for folder in (PACKAGED_TABLES, SOURCE_TREE_TABLES):
        candidate = folder / f"{release}.json"
        if candidate.is_file():
            return candidate
    raise FlagTableMissing(
        f"expected the SGLang {release} flag table in {PACKAGED_TABLES} (copied there by "
        f"lab/engine/build_wheel.sh) or {SOURCE_TREE_TABLES}, found neither; rebuild the stand-in wheel"
    )


def load_table(release: str) -> dict[str, Any]:
    """The extracted flag table of `release`; refuse a table of another release."""
    path = table_path(release)
    table = json.loads(path.read_text(encoding="utf-8"))
    if table.get("engine") != "sglang" or table.get("version") != release:
        raise FlagTableMissing(
            f"expected an sglang {release} flag table at {path}, found engine={table.get('engine')!r} "
            f"version={table.get('version')!r}"
        )
    return table


# ------------------------------------------------------------------------------------------------
# type= callables of the real parser, re-implemented with the standard library. argparse names a
# failing type by its __name__ ("invalid human_readable_int value: ..."), so the names match.
# ------------------------------------------------------------------------------------------------

def nullable_str(val: str) -> str | None:
    """sglang.srt.utils.common.nullable_str."""
    if not val or val == "None":
        return None
    return val


def human_readable_int(value: str) -> int:
    """sglang.srt.utils.common.human_readable_int: SI (k, M, G, T) and IEC (Ki, Mi, Gi, Ti) suffixes."""
    value = value.strip()
    si_multiplier = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec_multiplier = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec_multiplier:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec_multiplier[suffix]
        return int(Decimal(number) * si_multiplier[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def json_list_type(value: str) -> Any:
    """sglang.srt.utils.common.json_list_type (orjson there, json here)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def parse_cuda_graph_backend_arg(raw: str) -> str:
    """sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg."""
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw: str) -> dict[str, Any]:
    """The JSON-object part of sglang's --cuda-graph-config parser (per-phase key checks are not modelled)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
        )
    return parsed


def loads(s: str) -> Any:
    """json.loads under the name argparse prints for it ("invalid loads value")."""
    return json.loads(s)


_KNOWN_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "json.loads": loads,
    "sglang.srt.utils.common.nullable_str": nullable_str,
    "sglang.srt.utils.common.human_readable_int": human_readable_int,
    "sglang.srt.utils.common.json_list_type": json_list_type,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


def type_callable(name: str | None) -> Callable[[str], Any] | None:
    """The converter for a table type name; an unknown custom type passes the string through
    under the real function's name, so argparse messages still name it correctly."""
    if name is None:
        return None
    if name in _KNOWN_TYPES:
        return _KNOWN_TYPES[name]
    short = name.rsplit(".", 1)[-1]
    by_short = {k.rsplit(".", 1)[-1]: f for k, f in _KNOWN_TYPES.items() if "." in k}
    if short in by_short:  # the same function re-exported from another module
        return by_short[short]

    def passthrough(value: str) -> str:
        return value

    passthrough.__name__ = passthrough.__qualname__ = short
    return passthrough


# ------------------------------------------------------------------------------------------------
# Custom actions of sglang/srt/arg_groups/argparse_actions.py, same behaviour.
# ------------------------------------------------------------------------------------------------

def print_deprecated_warning(message: str) -> None:
    logger.warning(f"\033[1;33m{message}\033[0m")


class LoRAPathAction(argparse.Action):
    """--lora-paths: plain paths or JSON objects with lora_name and lora_path."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        lora_paths: list[Any] = []
        for lora_path in values or []:
            lora_path = lora_path.strip()
            if lora_path.startswith("{") and lora_path.endswith("}"):
                obj = json.loads(lora_path)
                assert "lora_path" in obj and "lora_name" in obj, (
                    f"{lora_path!r} looks like a JSON str, "
                    "but it does not contain 'lora_name' and 'lora_path' keys."
                )
                lora_paths.append(obj)
            else:
                lora_paths.append(lora_path)
        setattr(namespace, self.dest, lora_paths)


class DeprecatedAction(argparse.Action):
    """A retired flag: stop with `error_message`, or warn and continue."""

    def __init__(self, option_strings, dest, error_message=None, nargs=0, **kwargs):  # type: ignore[no-untyped-def]
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if self.error_message is not None:
            parser.error(self.error_message)
        print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and "
            "will be removed in future versions."
        )


class DeprecatedStoreTrueAction(argparse.Action):
    """Deprecated flag that still stores True and prints a warning."""

    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False,  # type: ignore[no-untyped-def]
                 **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """An old boolean (or one-value flag) whose replacement is one value of a new flag."""

    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None,  # type: ignore[no-untyped-def]
                 **kwargs):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future "
            f"release.{replacement}"
        )
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(argparse.Action):
    """An old valued flag renamed: keep the value, move it to the new dest."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):  # type: ignore[no-untyped-def]
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future "
            f"release.{replacement}"
        )
        setattr(namespace, self.dest, values)


class RecordedAction(argparse.Action):
    """An action class this stand-in does not know: consumes the recorded nargs and stores the value."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


CUSTOM_ACTIONS: dict[str, type[argparse.Action]] = {
    "LoRAPathAction": LoRAPathAction,
    "DeprecatedAction": DeprecatedAction,
    "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
    "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
    "DeprecatedAliasStoreAction": DeprecatedAliasStoreAction,
}
_VALUE_ACTIONS = {"store", "append", "extend"}
_CONST_ACTIONS = {"store_const", "append_const"}
_FLAG_ACTIONS = {"store_true", "store_false"}


def _common(option: dict[str, Any]) -> dict[str, Any]:
    help_text = argparse.SUPPRESS if option.get("help_suppressed") else option.get("help")
    kwargs: dict[str, Any] = {"dest": option["dest"], "help": help_text}
    if option.get("required"):
        kwargs["required"] = True
    return kwargs


def option_kwargs(option: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """add_argument(*names, **kwargs) that registers the same option as the real parser."""
    kind = option["action"]
    names = list(option["option_strings"])
    kwargs = _common(option)
    if kind in _VALUE_ACTIONS:
        kwargs.update(action=kind, nargs=option.get("nargs"), const=option.get("const"),
                      default=option.get("default"), type=type_callable(option.get("type")),
                      choices=option.get("choices"), metavar=_metavar(option.get("metavar")))
    elif kind in _FLAG_ACTIONS:
        kwargs.update(action=kind, default=option.get("default"))
    elif kind in _CONST_ACTIONS:
        kwargs.update(action=kind, const=option.get("const"), default=option.get("default"),
                      metavar=_metavar(option.get("metavar")))
    elif kind == "count":
        kwargs.update(action="count", default=option.get("default"))
    elif kind == "boolean_optional":
        # BooleanOptionalAction derives the --no-X spellings itself: pass only the positive ones.
        positives = [n for n in names if not (n.startswith("--no-") and "--" + n[5:] in names)]
        names = positives
        kwargs.update(action=argparse.BooleanOptionalAction, default=option.get("default"),
                      type=type_callable(option.get("type")), choices=option.get("choices"),
                      metavar=_metavar(option.get("metavar")))
    elif kind == "version":
        kwargs.update(action="version", version=(option.get("action_kwargs") or {}).get("version"))
        kwargs.pop("dest")
    elif kind in CUSTOM_ACTIONS:
        extra = dict(option.get("action_kwargs") or {})
        kwargs.update(action=CUSTOM_ACTIONS[kind], default=option.get("default"), **extra)
        _custom_standard_kwargs(kind, option, kwargs)
    else:
        kwargs.update(action=RecordedAction, nargs=option.get("nargs"), const=option.get("const"),
                      default=option.get("default"), type=type_callable(option.get("type")),
                      choices=option.get("choices"), metavar=_metavar(option.get("metavar")))
    return names, kwargs


def _custom_standard_kwargs(kind: str, option: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Pass the standard argparse attributes a custom action was created with."""
    kwargs["nargs"] = option.get("nargs")
    if option.get("type") is not None:
        kwargs["type"] = type_callable(option.get("type"))
    if option.get("choices") is not None:
        kwargs["choices"] = option.get("choices")
    if option.get("metavar") is not None:
        kwargs["metavar"] = _metavar(option.get("metavar"))
    if kind == "DeprecatedStoreTrueAction":
        kwargs["const"] = option.get("const", True)
    elif kind in {"LoRAPathAction", "DeprecatedAliasStoreAction"} and option.get("const") is not None:
        kwargs["const"] = option.get("const")


def _metavar(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def build_parser(table: dict[str, Any]) -> argparse.ArgumentParser:
    """argparse.ArgumentParser(...) + every option of the table, in registration order."""
    settings = table.get("parser") or {}
    parser = argparse.ArgumentParser(
        prog=settings.get("prog", "sglang serve"),
        prefix_chars=settings.get("prefix_chars", "-"),
        allow_abbrev=settings.get("allow_abbrev", True),
        add_help=settings.get("add_help", True),
        exit_on_error=settings.get("exit_on_error", True),
        fromfile_prefix_chars=settings.get("fromfile_prefix_chars"),
        argument_default=settings.get("argument_default"),
        conflict_handler=settings.get("conflict_handler", "error"),
    )
    groups: dict[str, Any] = {}
    for spec in table.get("mutually_exclusive_groups") or []:
        group = parser.add_mutually_exclusive_group(required=spec["required"])
        groups.update({dest: group for dest in spec["dests"]})
    for option in table["options"]:
        if option["action"] == "help":
            if not settings.get("add_help", True):
                parser.add_argument(*option["option_strings"], action="help", help=option.get("help"))
            continue
        names, kwargs = option_kwargs(option)
        target = groups.get(option["dest"], parser)
        # None is meaningful for default and nargs (a custom action's own nargs default is often 0).
        target.add_argument(*names, **{k: v for k, v in kwargs.items() if v is not None or k in ("default", "nargs")})
    return parser
