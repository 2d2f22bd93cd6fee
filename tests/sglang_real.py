"""Test access to SGLang's real argument parser and to the committed flag tables.

The parser runs in the cached environment built by tools/sglang_parser_env.sh; a missing
environment is an error that names the command to build it, never a skip.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "sglang-parser"
TABLE_DIR = REPO / "dflash_infra" / "data" / "sglang"
ARGCHECK = REPO / "tools" / "sglang_argcheck.py"
EXTRACT = REPO / "tools" / "extract_sglang_flags.py"
ENV_SCRIPT = REPO / "tools" / "sglang_parser_env.sh"


class ParserEnvMissing(RuntimeError):
    """The cached SGLang parser environment has not been built."""


def launcher(version: str) -> Path:
    """Path of the parser environment's python for `version`; raise when it is not built."""
    path = CACHE / "bin" / f"python-{version}"
    if not path.is_file():
        raise ParserEnvMissing(
            f"expected the SGLang {version} parser environment at {path}, found nothing; "
            f"build it with {ENV_SCRIPT.relative_to(REPO)} (make sglang-parser-env)"
        )
    return path


def check_argvs(version: str, argvs: list[list[str]], dflash_checks: bool = False) -> list[dict[str, Any]]:
    """Parse every argv with the real sglang `version` parser (one process for all of them).

    Each result is {"ok", "error", "stderr", "warnings", "namespace", "dflash"} as printed by
    tools/sglang_argcheck.py; `dflash_checks` also runs SGLang's DFLASH startup rules.
    """
    proc = subprocess.run(
        [str(launcher(version)), str(ARGCHECK)],
        input=json.dumps({"version": version, "argvs": argvs, "dflash_checks": dflash_checks}),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"expected {ARGCHECK.name} to exit 0 for sglang {version}; it exited {proc.returncode}:\n"
            f"{proc.stderr[-4000:]}"
        )
    results = json.loads(proc.stdout)
    if len(results) != len(argvs):
        raise RuntimeError(f"expected {len(argvs)} results from {ARGCHECK.name}, found {len(results)}")
    return results


@cache
def load_table(version: str) -> dict[str, Any]:
    """The committed flag table for `version` (dflash_infra/data/sglang/<version>.json)."""
    path = TABLE_DIR / f"{version}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"expected the committed table {path.relative_to(REPO)}, found nothing; "
            f"write it with tools/extract_sglang_flags.py --version {version}"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def option_strings(version: str) -> set[str]:
    """Every option string the committed `version` table registers."""
    return {s for option in load_table(version)["options"] for s in option["option_strings"]}


def option_by_string(version: str, flag: str) -> dict[str, Any]:
    """The committed table's entry that registers `flag`."""
    for option in load_table(version)["options"]:
        if flag in option["option_strings"]:
            return option
    raise KeyError(f"expected {flag} in the sglang {version} table, found no such option string")
