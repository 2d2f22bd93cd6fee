#!/usr/bin/env python3
"""Parse command lines with SGLang's real argument parser and report, as JSON, what it made of them.

Runs inside the parser environment (tools/sglang_parser_env.sh), with the wanted version importable:
  echo '{"version": "0.5.23", "argvs": [["--model-path", "/m"]]}' \
    | .cache/sglang-parser/bin/python-0.5.23 tools/sglang_argcheck.py
  .cache/sglang-parser/bin/python-0.5.23 tools/sglang_argcheck.py --serve   # one request per line, kept open
Prints one result per argv, in order:
  {"ok": bool, "error": str|null, "stderr": str, "warnings": [str], "namespace": {dest: value},
   "dflash": null | {"ok": bool|null, "error": str|null, "warnings": [str], "resolved": {field: value}}}
`namespace` holds only the options the argv gave; `error` is argparse's message without the
"usage:" block and the "<prog>: error: " prefix; `warnings` are the deprecation warnings the real
actions log. The parser is the one `sglang serve` builds; only `--config` file merging (done by
prepare_server_args before parsing) is not applied.

With "dflash_checks": true in the request, every argv that parsed and asks for
`--speculative-algorithm DFLASH` also goes through SGLang's own DFLASH startup rules
(`speculative_hook._handle_dflash`: pp_size 1, draft model path, block size vs
num-draft-tokens, draft window >= block size, dp-attention needs --enable-dp-lm-head,
max_running_requests 48 when unset, draft attention backend). The hook runs on this CPU
host as if on a non-SM100 CUDA device (`--device cuda` unless the argv sets one). Without a
block size the hook infers it from the drafter and imports model code this environment does
not carry; that case reports "ok": null with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import logging
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from extract_sglang_flags import build_real_parser, imported_sglang_version, scrub_sglang_environment

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class ParseResult:
    """What the real parser made of one argv."""

    ok: bool
    error: str | None = None
    stderr: str = ""
    warnings: list[str] = field(default_factory=list)
    namespace: dict[str, Any] = field(default_factory=dict)
    dflash: dict[str, Any] | None = None


# Fields _handle_dflash decides; reported after the hook ran.
_DFLASH_RESOLVED = (
    "speculative_num_draft_tokens",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_draft_window_size",
    "speculative_draft_attention_backend",
    "max_running_requests",
)


class _Collect(logging.Handler):
    """Keep the messages sglang's deprecated-flag actions log while parsing."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(_ANSI.sub("", record.getMessage()))


def given_only(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A copy of `parser` whose defaults are suppressed, so parsing yields only given options."""
    quiet = copy.deepcopy(parser)
    for action in quiet._actions:  # argparse keeps actions private
        action.default = argparse.SUPPRESS
    return quiet


def to_json(value: Any) -> Any:
    """JSON form of a parsed value; anything exotic becomes its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return repr(value)


def error_message(stderr: str) -> str:
    """argparse's message from its stderr: the text after the last '<prog>: error: '."""
    marker = ": error: "
    at = stderr.rfind(marker)
    return stderr[at + len(marker):].strip() if at >= 0 else stderr.strip()


def parse_one(parser: argparse.ArgumentParser, quiet: argparse.ArgumentParser, argv: list[str]) -> ParseResult:
    """Parse one argv with the real parser, catching argparse's exit and messages."""
    collect = _Collect()
    root = logging.getLogger()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stderr):
        root.addHandler(collect)
        try:
            full = parser.parse_args(argv)
        except SystemExit as exc:
            text = stderr.getvalue()
            message = error_message(text) if exc.code else f"exited with status {exc.code} before parsing finished"
            return ParseResult(ok=False, error=message, stderr=text, warnings=collect.messages)
        finally:
            root.removeHandler(collect)
        # Second pass, same argv: it already parsed, so this only lists what was given.
        given = vars(quiet.parse_args(argv))
    namespace = {dest: to_json(getattr(full, dest)) for dest in sorted(given)}
    return ParseResult(ok=True, stderr=stderr.getvalue(), warnings=collect.messages, namespace=namespace)


def record_field_names(cls: type) -> list[str]:
    """ServerArgs field names: msgspec Struct fields in 0.5.23, dataclass fields in 0.5.19."""
    try:
        from sglang.srt.arg_groups.arg_utils import record_fields
    except ImportError:
        return [f.name for f in dataclasses.fields(cls)]
    return [f.name for f in record_fields(cls)]


def run_dflash_hook(namespace: argparse.Namespace) -> dict[str, Any]:
    """Run SGLang's DFLASH startup rules on a parsed namespace, the way resolution starts them."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash
    from sglang.srt.server_args import ServerArgs

    if getattr(namespace, "device", None) is None:
        namespace = copy.copy(namespace)
        namespace.device = "cuda"
    server_args = ServerArgs.from_cli_args(namespace)
    # What run_resolution_pipeline sets up before its handlers run.
    server_args._raw_input = {n: getattr(server_args, n) for n in record_field_names(type(server_args))}
    server_args._resolved_overrides = []
    server_args._input_frozen = True
    collect = _Collect()
    logging.getLogger().addHandler(collect)
    try:
        _handle_dflash(server_args)
    except (ValueError, AssertionError) as exc:
        return {"ok": False, "error": str(exc), "warnings": collect.messages, "resolved": {}}
    except ImportError as exc:
        # Inferring the block size from the drafter imports model code this venv does not carry.
        return {
            "ok": None,
            "error": f"not checkable in the parser environment: an import inside the hook failed ({exc}); "
            "give --speculative-dflash-block-size to check the remaining rules",
            "warnings": collect.messages,
            "resolved": {},
        }
    finally:
        logging.getLogger().removeHandler(collect)
    cfg = resolving_view(server_args)
    resolved = {name: to_json(getattr(cfg, name)) for name in _DFLASH_RESOLVED}
    return {"ok": True, "error": None, "warnings": collect.messages, "resolved": resolved}


def with_dflash_checks(parser: argparse.ArgumentParser, argv: list[str], result: ParseResult) -> ParseResult:
    """Add the DFLASH hook's verdict to a successful parse that asks for DFLASH."""
    if not result.ok or str(result.namespace.get("speculative_algorithm", "")).upper() != "DFLASH":
        return result
    with contextlib.redirect_stdout(sys.stderr):
        result.dflash = run_dflash_hook(parser.parse_args(argv))
    return result


def check_request(request: Any) -> tuple[str, list[list[str]], bool]:
    """Check {"version": str, "argvs": [[str, ...], ...], "dflash_checks"?: bool} and return its parts."""
    version, argvs = request.get("version"), request.get("argvs")
    if not isinstance(version, str) or not isinstance(argvs, list) or not all(
        isinstance(a, list) and all(isinstance(s, str) for s in a) for a in argvs
    ):
        raise SystemExit(
            'expected {"version": "<x.y.z>", "argvs": [["--flag", "value", ...], ...]} on stdin; '
            f"found {json.dumps(request)[:200]}"
        )
    return version, argvs, bool(request.get("dflash_checks", False))


class Checker:
    """The real parser of the importable sglang, built once; answers requests for that version."""

    def __init__(self, version: str) -> None:
        scrub_sglang_environment()
        with contextlib.redirect_stdout(sys.stderr):
            imported_sglang_version(version)
            self.parser = build_real_parser()
        self.version = version
        self.quiet = given_only(self.parser)

    def answer(self, version: str, argvs: list[list[str]], dflash_checks: bool) -> list[dict[str, Any]]:
        if version != self.version:
            raise SystemExit(f"expected requests for sglang {self.version} in this process, found {version}")
        results = []
        for argv in argvs:
            result = parse_one(self.parser, self.quiet, argv)
            if dflash_checks:
                result = with_dflash_checks(self.parser, argv, result)
            results.append(asdict(result))
        return results


def main(argv: list[str]) -> int:
    """Read the request, parse every argv, print the results as a JSON list. With --serve: one request per
    line on stdin, one JSON line of results per request on stdout, the parser built once (tests keep one such
    process per version for a whole session)."""
    if argv[1:] == ["--serve"]:
        checker: Checker | None = None
        for line in sys.stdin:
            version, argvs, dflash_checks = check_request(json.loads(line))
            checker = checker or Checker(version)
            sys.stdout.write(json.dumps(checker.answer(version, argvs, dflash_checks), sort_keys=True) + "\n")
            sys.stdout.flush()
        return 0
    version, argvs, dflash_checks = check_request(json.load(sys.stdin))
    json.dump(Checker(version).answer(version, argvs, dflash_checks), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
