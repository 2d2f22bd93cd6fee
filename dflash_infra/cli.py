"""`dflash-infra`: plan a deployment, parse what a GPU host printed, or set two deployments' load figures side by side.

Exit codes: 0 success, 2 a plan with errors or input that could not be parsed (one line naming the
problem on stderr). JSON goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from dflash_infra import loadgate, parsers
from dflash_infra.planner import plan_dict, plan_table


def _read(path: str) -> tuple[str, str]:
    """(text, label) of a file or of stdin for '-'."""
    label = "<stdin>" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise parsers.ParseError(path, f"cannot read ({exc.strerror})") from exc
    try:
        return data.decode("utf-8"), label
    except UnicodeDecodeError as exc:
        raise parsers.ParseError(label, f"expected UTF-8 text, found a byte {data[exc.start]:#04x} that is not "
                                        f"(at offset {exc.start})") from exc


def _fields(value: str | None) -> list[str] | None:
    return [f.strip() for f in value.split(",") if f.strip()] if value else None


def _cmd_plan(args: argparse.Namespace) -> int:
    text, label = _read(args.file)
    try:
        request = yaml.safe_load(text)
    except RecursionError as exc:
        raise parsers.ParseError(label, "expected a JSON or YAML request, found one nested too deeply") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid syntax"
        raise parsers.ParseError(label, f"expected a JSON or YAML request, found {problem}{where}") from exc
    base = Path(args.file).resolve().parent if args.file != "-" else Path.cwd()
    result = plan_dict(request if request is not None else {}, base)
    if args.format == "table":
        print(plan_table(result))
    else:
        print(json.dumps(result, indent=2))
    return 2 if result["errors"] else 0


# Kinds whose files each describe one item, so several files parse into a list (one GPU per file).
_PER_FILE_KINDS = ("gpu-info",)


def _cmd_parse(args: argparse.Namespace) -> int:
    fields = _fields(args.fields)
    if args.kind in _PER_FILE_KINDS:
        results = [parsers.parse_text(args.kind, *_read(path), fields) for path in args.files]
        print(json.dumps(results, indent=2))
        return 0
    if len(args.files) != 1:
        raise parsers.ParseError(f"parse {args.kind}", f"expected one input file, found {len(args.files)} "
                                 f"(only {', '.join(_PER_FILE_KINDS)} reads several)")
    text, label = _read(args.files[0])
    print(json.dumps(parsers.parse_text(args.kind, text, label, fields), indent=2))
    return 0


def _load_figures(path: str) -> list[dict[str, object]]:
    """The load figures of a deployment record (`load.figures`, as the load gate records them) or of a file holding
    that list."""
    text, label = _read(path)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise parsers.ParseError(label, f"expected a deployment record or a list of load figures (JSON): {exc}") \
            from exc
    rows = data.get("load") if isinstance(data, dict) else data
    if isinstance(rows, dict):
        rows = rows.get("figures")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "concurrency" in r for r in rows):
        raise parsers.ParseError(label, "expected a deployment record with `load` figures (one per concurrency), "
                                        "or a list of them; found none")
    return rows


def _cmd_bench_compare(args: argparse.Namespace) -> int:
    a, b = _load_figures(args.a), _load_figures(args.b)
    print("\n".join(loadgate.compare(a, b, (Path(args.a).name, Path(args.b).name))))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-infra", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_plan = sub.add_parser("plan", help="plan a deployment from a request (JSON or YAML)")
    p_plan.add_argument("file", nargs="?", default="-", help="request file, or - for stdin (default)")
    p_plan.add_argument("--format", choices=("json", "table"), default="json")
    p_plan.set_defaults(func=_cmd_plan)
    p_parse = sub.add_parser("parse", help="parse nvidia-smi / driver output into JSON")
    p_parse.add_argument("kind", choices=list(parsers.PARSERS))
    p_parse.add_argument("files", nargs="+", metavar="FILE",
                         help="captured output, or - for stdin; gpu-info takes one information file per GPU "
                              "(/proc/driver/nvidia/gpus/*/information) and prints a list")
    p_parse.add_argument("--fields", help="column names of header-less CSV input, comma separated")
    p_parse.set_defaults(func=_cmd_parse)
    p_bench = sub.add_parser("bench", help="load figures of deployments")
    bench = p_bench.add_subparsers(dest="bench_command", required=True)
    p_compare = bench.add_parser("compare", help="two deployments' load figures side by side, per concurrency")
    p_compare.add_argument("a", help="deployment record (deployment.json) or a JSON list of load figures")
    p_compare.add_argument("b", help="the other one")
    p_compare.set_defaults(func=_cmd_bench_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except parsers.ParseError as exc:
        print(f"dflash-infra: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
