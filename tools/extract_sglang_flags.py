#!/usr/bin/env python3
"""Extract SGLang's real command-line option table into dflash_infra/data/sglang/<version>.json.

The table is read from the parser that `sglang serve` itself builds
(`argparse.ArgumentParser(prog=...)` + `ServerArgs.add_cli_args`), loaded from the cached parser
environment that tools/sglang_parser_env.sh builds. It is the single source for version-aware argv
rendering and for the lab engine stand-in's parser.

Usage (any Python; the extraction itself runs in .cache/sglang-parser/bin/python-<version>):
  tools/extract_sglang_flags.py                    write every table in dflash_infra/data/sglang/
  tools/extract_sglang_flags.py --version 0.5.23   write one table
  tools/extract_sglang_flags.py --check            exit 1 with a unified diff when a table drifted
Inside the parser environment (what the outer call runs):
  python-<version> tools/extract_sglang_flags.py --emit <version> --wheel <path>
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "sglang-parser"
TABLE_DIR = REPO / "dflash_infra" / "data" / "sglang"
VERSIONS = ("0.5.19", "0.5.23")
FORMAT_VERSION = 1
ENV_SCRIPT = "tools/sglang_parser_env.sh"

# argparse's own action classes, by the name `add_argument(action=...)` accepts.
_ARGPARSE_ACTION_NAMES = {
    "_StoreAction": "store",
    "_StoreConstAction": "store_const",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_ExtendAction": "extend",
    "_HelpAction": "help",
    "_VersionAction": "version",
    "BooleanOptionalAction": "boolean_optional",
}
# Attributes every argparse.Action has; anything else on a custom action is its own setting.
_STANDARD_ACTION_ATTRS = {
    "option_strings", "dest", "nargs", "const", "default", "type", "choices",
    "required", "help", "metavar", "container", "deprecated",
}


@dataclass(frozen=True)
class WheelInfo:
    """The sglang wheel a table was extracted from."""

    filename: str
    sha256: str


# --------------------------------------------------------------------------------------------
# Inside the parser environment: read the real parser.
# --------------------------------------------------------------------------------------------


def json_safe(value: Any, where: str) -> Any:
    """Return `value` as JSON data; sets become sorted lists so output is byte-stable."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_safe(v, where) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v, where) for v in value), key=lambda v: json.dumps(v))
    if isinstance(value, dict):
        return {str(k): json_safe(v, where) for k, v in value.items()}
    raise TypeError(
        f"{where}: expected JSON-representable data, found {type(value).__name__} {value!r}; "
        "teach json_safe() this type before extracting"
    )


def type_name(func: Any) -> str | None:
    """Name an argparse `type=` callable: int/float/str for builtins, module.qualname otherwise."""
    if func is None:
        return None
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if qualname is None:
        raise TypeError(f"expected a named type= callable, found {func!r}")
    return qualname if module == "builtins" else f"{module}.{qualname}"


def action_kind(action: argparse.Action) -> str:
    """argparse's action name, or the custom action's class name."""
    cls = type(action)
    if cls.__module__ == "argparse" and cls.__name__ in _ARGPARSE_ACTION_NAMES:
        return _ARGPARSE_ACTION_NAMES[cls.__name__]
    return cls.__name__


def describe_action(action: argparse.Action, fallbacks: dict[str, Any]) -> dict[str, Any]:
    """One option as JSON: everything needed to register an equivalent argparse option.

    `resolution_fallback` is the value SGLang's config resolution uses when the option is unset
    (argparse default None); null where the version declares none.
    """
    where = "/".join(action.option_strings) or action.dest
    extra = {k: v for k, v in vars(action).items() if k not in _STANDARD_ACTION_ATTRS}
    cls = type(action)
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "action": action_kind(action),
        "action_class": f"{cls.__module__}.{cls.__qualname__}",
        "action_kwargs": json_safe(dict(sorted(extra.items())), where),
        "nargs": action.nargs,
        "const": json_safe(action.const, where),
        "choices": None if action.choices is None else json_safe(action.choices, where),
        "type": type_name(action.type),
        "default": json_safe(action.default, where),
        "required": bool(action.required),
        "help_suppressed": action.help == argparse.SUPPRESS,
        "metavar": json_safe(action.metavar, where),
        "resolution_fallback": json_safe(fallbacks.get(action.dest), where),
    }


def server_parser_kwargs() -> dict[str, Any]:
    """The keyword arguments `prepare_server_args` passes to argparse.ArgumentParser."""
    from sglang.srt import server_args

    tree = ast.parse(inspect.getsource(server_args.prepare_server_args))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser":
            return {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    raise RuntimeError(
        "expected prepare_server_args() to call argparse.ArgumentParser(...); found no such call. "
        "Read sglang/srt/server_args.py and update server_parser_kwargs()."
    )


def build_real_parser() -> argparse.ArgumentParser:
    """Build the parser exactly as `sglang serve` does (without parsing anything)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(**server_parser_kwargs())
    ServerArgs.add_cli_args(parser)
    return parser


def resolution_fallbacks() -> dict[str, Any]:
    """{dest: fallback} declared with Arg(fallback=...); releases before 0.5.23 have none."""
    from sglang.srt.server_args import ServerArgs

    try:
        from sglang.srt.arg_groups.arg_utils import fallbacks_of
    except ImportError:
        return {}
    return dict(fallbacks_of(ServerArgs))


def scrub_sglang_environment() -> None:
    """Drop SGLANG_*/SGL_* variables: some choices depend on them, tables must not."""
    for name in list(os.environ):
        if name.startswith(("SGLANG_", "SGL_")):
            del os.environ[name]


def imported_sglang_version(expected: str) -> str:
    """The sglang version on sys.path; refuse a mismatch (a wrong PYTHONPATH)."""
    import sglang
    from sglang.version import __version__

    if __version__ != expected:
        raise SystemExit(
            f"expected sglang {expected} on sys.path, imported {__version__} from "
            f"{Path(sglang.__file__).parent}; run through .cache/sglang-parser/bin/python-{expected}"
        )
    return __version__


def extract_table(version: str, wheel: WheelInfo) -> dict[str, Any]:
    """The full JSON table for the sglang version importable in this process."""
    scrub_sglang_environment()
    imported_sglang_version(version)
    parser = build_real_parser()
    fallbacks = resolution_fallbacks()
    if parser._mutually_exclusive_groups:  # argparse keeps them private
        groups = [
            {"required": g.required, "dests": [a.dest for a in g._group_actions]}
            for g in parser._mutually_exclusive_groups
        ]
    else:
        groups = []
    return {
        "format_version": FORMAT_VERSION,
        "engine": "sglang",
        "version": version,
        "wheel": wheel.filename,
        "wheel_sha256": wheel.sha256,
        "extracted_by": "tools/extract_sglang_flags.py",
        "parser": {
            "prog": parser.prog,
            "prefix_chars": parser.prefix_chars,
            "allow_abbrev": parser.allow_abbrev,
            "add_help": parser.add_help,
            "exit_on_error": parser.exit_on_error,
            "fromfile_prefix_chars": parser.fromfile_prefix_chars,
            "argument_default": json_safe(parser.argument_default, "argument_default"),
            "conflict_handler": parser.conflict_handler,
        },
        "mutually_exclusive_groups": groups,
        # Registration order: argparse's ambiguity and usage messages follow it.
        "options": [describe_action(a, fallbacks) for a in parser._actions],
    }


# Private-range IPv4 literals must not enter the repository (upstream help texts have some,
# which is one reason help texts are left out of the tables).
_PRIVATE_IPV4 = re.compile(
    r"(?<![\d.])(?:10(?:\.\d{1,3}){3}|192\.168(?:\.\d{1,3}){2}|172\.(?:1[6-9]|2\d|3[01])(?:\.\d{1,3}){2})(?!\.?\d)"
)


def render(table: dict[str, Any]) -> str:
    """Serialise a table deterministically (sorted keys, fixed indent, trailing newline)."""
    text = json.dumps(table, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    found = _PRIVATE_IPV4.search(text)
    if found:
        raise SystemExit(
            f"expected no private-range IPv4 literal in the table, found {found.group(0)!r}; "
            "leave out or rewrite the field it came from in describe_action()"
        )
    return text


# --------------------------------------------------------------------------------------------
# Outside: run the extraction in the parser environment, write or compare tables.
# --------------------------------------------------------------------------------------------


def wheel_info(version: str) -> tuple[Path, WheelInfo]:
    """Locate the cached wheel for `version` and hash it."""
    wheels = sorted((CACHE / "wheels").glob(f"sglang-{version}-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(
            f"expected one sglang {version} wheel in {CACHE / 'wheels'}, found {len(wheels)}; "
            f"run {ENV_SCRIPT}"
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    return wheels[0], WheelInfo(filename=wheels[0].name, sha256=digest)


def launcher(version: str) -> Path:
    """The parser environment's python for `version`; a clear error when it is not built."""
    path = CACHE / "bin" / f"python-{version}"
    if not path.is_file():
        raise SystemExit(f"expected the SGLang parser environment at {path}, found nothing; run {ENV_SCRIPT}")
    return path


def extract_via_launcher(version: str) -> str:
    """Run this script with --emit inside the parser environment and return the table text."""
    wheel_path, _ = wheel_info(version)
    proc = subprocess.run(
        [str(launcher(version)), str(Path(__file__).resolve()), "--emit", version, "--wheel", str(wheel_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"extracting the sglang {version} table failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


def check_table(version: str, fresh: str) -> bool:
    """Compare the committed table with a fresh extraction; print a unified diff on drift."""
    committed_path = TABLE_DIR / f"{version}.json"
    committed = committed_path.read_text(encoding="utf-8") if committed_path.is_file() else ""
    if committed == fresh:
        print(f"sglang {version}: {committed_path.relative_to(REPO)} matches the real parser")
        return True
    with tempfile.NamedTemporaryFile("w", suffix=f"-{version}.json", delete=False, encoding="utf-8") as tmp:
        tmp.write(fresh)
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        fresh.splitlines(keepends=True),
        fromfile=str(committed_path.relative_to(REPO)),
        tofile=f"{tmp.name} (fresh extraction)",
    )
    sys.stdout.writelines(diff)
    print(
        f"sglang {version}: committed table drifted from the real parser; "
        f"regenerate with tools/extract_sglang_flags.py --version {version}"
    )
    return False


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="append", choices=VERSIONS, help="table to handle (default: all)")
    ap.add_argument("--check", action="store_true", help="compare with the committed tables, do not write")
    ap.add_argument("--emit", metavar="VERSION", help=argparse.SUPPRESS)
    ap.add_argument("--wheel", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.emit:
        if args.wheel is None:
            ap.error("--emit needs --wheel")
        info = WheelInfo(args.wheel.name, hashlib.sha256(args.wheel.read_bytes()).hexdigest())
        sys.stdout.write(render(extract_table(args.emit, info)))
        return 0

    ok = True
    for version in args.version or VERSIONS:
        fresh = extract_via_launcher(version)
        if args.check:
            ok = check_table(version, fresh) and ok
        else:
            TABLE_DIR.mkdir(parents=True, exist_ok=True)
            target = TABLE_DIR / f"{version}.json"
            target.write_text(fresh, encoding="utf-8")
            print(f"sglang {version}: wrote {target.relative_to(REPO)} ({len(json.loads(fresh)['options'])} options)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
