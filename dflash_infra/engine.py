"""SGLang releases: their real flag tables and the version-aware rendering of the engine command line.

Two data files are the single source: `data/sglang/<version>.json` (every option of that release's
real argument parser, extracted from the wheel) and `data/sglang_settings.yml` (which flag spells
each planner setting). The planner, the deploy-time capability check and the lab's engine stand-in
all read them.

A build of a release with unreleased changes has its own table, `data/sglang/<release>+<build>.json`
(e.g. `0.5.23+ddtree.json`), selected by an engine version with that local part (`0.5.23+ddtree`,
`0.5.23+ddtree.<commit>`). Such a table may be derived by hand from its release's table, in which case
it says so in `provenance` until it is extracted from the real build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent / "data"

# Oldest release with each capability the planner relies on (SGLang release notes; the flag tables prove them).
DFLASH_SINCE = (0, 5, 11)
DRAFT_SLIDING_WINDOW_SINCE = (0, 5, 15)


def parse_version(text: str) -> tuple[int, ...]:
    """(0, 5, 23) from '0.5.23', '0.5.23+lab' or 'v0.5.23.post1'; local and post parts are ignored."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", str(text).strip())
    if not match:
        raise ValueError(f"engine version: expected something like 0.5.23, found {text!r}")
    return tuple(int(p) for p in match.group(1).split("."))


def release_of(version: str) -> str:
    """The public release a version belongs to: '0.5.23+lab' -> '0.5.23'."""
    return ".".join(str(p) for p in parse_version(version)[:3])


def table_name(version: str) -> str:
    """The flag table a version is checked against: '0.5.23+ddtree.g1a2b3c' -> '0.5.23+ddtree' when that
    build's table exists, else the public release ('0.5.23+lab' -> '0.5.23')."""
    release = release_of(version)
    build = str(version).strip().partition("+")[2].split(".")[0]
    if build and (DATA / "sglang" / f"{release}+{build}.json").is_file():
        return f"{release}+{build}"
    return release


@cache
def derived_tables() -> tuple[str, ...]:
    """Tables of builds (`<release>+<build>.json`) whose release is supported, newest release first."""
    releases = set(supported_releases())
    names = [p.stem for p in (DATA / "sglang").glob("*+*.json") if release_of(p.stem) in releases]
    return tuple(sorted(names, key=lambda n: (parse_version(n), n), reverse=True))


@cache
def supported_releases() -> tuple[str, ...]:
    """Releases with both an extracted flag table and a settings entry, newest first."""
    settings = _settings()
    tables = {p.stem for p in (DATA / "sglang").glob("*.json")}
    return tuple(sorted(set(settings["versions"]) & tables, key=parse_version, reverse=True))


@dataclass(frozen=True)
class FlagTable:
    """The options one SGLang release's parser accepts; hidden (deprecated) aliases are tracked apart."""

    version: str
    visible: frozenset[str]
    hidden: frozenset[str]
    provenance: str | None = None  # set when the table was not extracted from the engine's own parser
    # option string -> its option as extracted (action, nargs, choices, type, dest, option_strings); empty for a
    # table made from a --help text, which knows the spellings only.
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def accepts(self, flag: str) -> bool:
        return flag in self.visible

    def option(self, flag: str) -> Mapping[str, Any] | None:
        """The extracted option `flag` spells (any of its spellings), or None when the table has no details."""
        return self.options.get(flag)

    @classmethod
    def from_options(cls, version: str, options: Iterable[str]) -> FlagTable:
        """A table from a plain list of option strings, e.g. the installed engine's own --help."""
        return cls(version, frozenset(options), frozenset())


@cache
def table_data(version: str) -> dict[str, Any]:
    """The extracted table of a release as stored (options, the parser's own settings); KeyError when unknown."""
    name = table_name(version)
    path = DATA / "sglang" / f"{name}.json"
    if not path.is_file():
        raise KeyError(name)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@cache
def flag_table(version: str) -> FlagTable:
    """The table of a supported release, or of a build of it that has its own table (see table_name)."""
    name = table_name(version)
    data = table_data(version)
    visible: set[str] = set()
    hidden: set[str] = set()
    options: dict[str, Mapping[str, Any]] = {}
    for option in data["options"]:
        (hidden if option.get("help_suppressed") else visible).update(option["option_strings"])
        options.update(dict.fromkeys(option["option_strings"], option))
    provenance = data.get("provenance")
    return FlagTable(name, frozenset(visible), frozenset(hidden - visible),
                     None if provenance is None else str(provenance), options)


@cache
def _settings() -> dict[str, Any]:
    settings: dict[str, Any] = yaml.safe_load((DATA / "sglang_settings.yml").read_text())
    return settings


def setting_flags(version: str) -> dict[str, str]:
    """setting -> flag for one release, in command-line order."""
    settings = _settings()
    flags = dict(settings["flags"])
    flags.update(settings["versions"].get(release_of(version)) or {})
    return flags


def format_value(value: Any) -> str:
    """A value as the engine's command line spells it (floats without trailing zeros)."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_argv(values: Mapping[str, Any], version: str,
                table: FlagTable | None = None) -> tuple[list[str], list[str]]:
    """The engine argv for `values` (setting -> value; None means 'leave to the engine') and the errors.

    A setting whose flag the release does not accept is an error naming the flag and the version,
    never a silent omission.
    """
    table = table or flag_table(version)
    flags = setting_flags(version)
    unknown = sorted(set(values) - set(flags))
    errors = [f"planner setting '{name}' has no flag mapping in sglang_settings.yml" for name in unknown]
    argv: list[str] = []
    for name, flag in flags.items():
        value = values.get(name)
        if value is None or value is False:
            continue
        if not table.accepts(flag):
            state = "only as a hidden deprecated alias" if flag in table.hidden else "not at all"
            errors.append(f"{name} needs {flag}, which SGLang {table.version} accepts {state}")
            continue
        argv.append(flag)
        if value is not True:
            argv.append(format_value(value))
    return argv, errors
