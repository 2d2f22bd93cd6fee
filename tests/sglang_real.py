"""Test access to SGLang's real argument parser and to the committed flag tables.

The parser runs in the cached environment built by tools/sglang_parser_env.sh; a missing
environment is an error that names the command to build it, never a skip.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "sglang-parser"
TABLE_DIR = REPO / "dflash_infra" / "data" / "sglang"
ARGCHECK = REPO / "tools" / "sglang_argcheck.py"
RESOLVE = REPO / "tools" / "sglang_resolve.py"
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
            f"build it with {ENV_SCRIPT.relative_to(REPO)} (make sglang-env)"
        )
    return path


class _Server:
    """tools/sglang_argcheck.py --serve for one version: sglang is imported and its parser built once for the whole
    test session (about 7 s each time otherwise)."""

    def __init__(self, version: str) -> None:
        # Lives as long as the process (closed by close()); a pipe could fill up and stall the parser.
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen([str(launcher(version)), str(ARGCHECK), "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        atexit.register(self.close)

    def ask(self, request: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = ""
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.stderr.seek(0)
            raise RuntimeError(f"expected {ARGCHECK.name} --serve to answer for sglang {request['version']}; it "
                               f"exited {self.proc.returncode}:\n{self.stderr.read()[-4000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.stderr.close()


_servers: dict[str, _Server] = {}


def check_argvs(version: str, argvs: list[list[str]], dflash_checks: bool = False) -> list[dict[str, Any]]:
    """Parse every argv with the real sglang `version` parser (one process per version for the session).

    Each result is {"ok", "error", "stderr", "warnings", "namespace", "dflash"} as printed by
    tools/sglang_argcheck.py; `dflash_checks` also runs SGLang's DFLASH startup rules.
    """
    server = _servers.get(version)
    if server is None or server.proc.poll() is not None:
        server = _servers[version] = _Server(version)
    results = server.ask({"version": version, "argvs": argvs, "dflash_checks": dflash_checks})
    if len(results) != len(argvs):
        raise RuntimeError(f"expected {len(argvs)} results from {ARGCHECK.name}, found {len(results)}")
    return list(results)


def resolve(version: str, checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SGLang `version`'s own resolution of each check ({argv, gpu, models?, fake?}) by tools/sglang_resolve.py, one
    process for the batch (each check in its own forked child); results as that tool prints them."""
    proc = subprocess.run([str(launcher(version)), str(RESOLVE)], input=json.dumps({"version": version,
                          "checks": checks}), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"expected {RESOLVE.name} to answer; it exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    if len(results) != len(checks):
        raise RuntimeError(f"expected {len(checks)} results from {RESOLVE.name}, found {len(results)}")
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
