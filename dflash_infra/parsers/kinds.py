"""The input kinds `dflash-infra parse KIND` and the filter plugins name, and parsing by kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dflash_infra.parsers.common import ParseError
from dflash_infra.parsers.dpkg import parse_dpkg_list, parse_dpkg_query
from dflash_infra.parsers.nvml import parse_nvml
from dflash_infra.parsers.proc import parse_driver, parse_gpu_information, parse_proc_devices
from dflash_infra.parsers.smi_query import parse_apps, parse_gpus
from dflash_infra.parsers.smi_table import parse_smi_table, parse_smi_version


def _as_json(value: Any) -> Any:
    """A parser's result as JSON-safe data: records through their to_dict(), dicts as they are."""
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        return value
    return value.to_dict()


def _no_fields(kind: str, fields: Sequence[str] | None, source: str) -> None:
    if fields:
        raise ParseError(source, f"a field list only applies to CSV input (gpus, apps), not to {kind}")


def _parse_gpus_kind(text: str, source: str, fields: Sequence[str] | None) -> Any:
    return parse_gpus(text, source, fields)


def _parse_apps_kind(text: str, source: str, fields: Sequence[str] | None) -> Any:
    return parse_apps(text, source, fields)


def _plain(parser: Callable[[str, str], Any], kind: str) -> Callable[[str, str, Sequence[str] | None], Any]:
    def run(text: str, source: str, fields: Sequence[str] | None) -> Any:
        _no_fields(kind, fields, source)
        return parser(text, source)

    return run


PARSERS: dict[str, Callable[[str, str, Sequence[str] | None], Any]] = {
    "gpus": _parse_gpus_kind,
    "apps": _parse_apps_kind,
    "driver": _plain(parse_driver, "driver"),
    "nvml": _plain(parse_nvml, "nvml"),
    "smi": _plain(parse_smi_table, "smi"),
    "smi-version": _plain(parse_smi_version, "smi-version"),
    "devices": _plain(parse_proc_devices, "devices"),
    "gpu-info": _plain(parse_gpu_information, "gpu-info"),
    "dpkg-query": _plain(parse_dpkg_query, "dpkg-query"),
    "dpkg-list": _plain(parse_dpkg_list, "dpkg-list"),
}


def parse_text(kind: str, text: str, source: str, fields: Sequence[str] | None = None) -> Any:
    """Run the parser for `kind` (a key of PARSERS) and return JSON-safe data."""
    if kind not in PARSERS:
        raise ParseError(source, f"unknown input kind {kind!r}; expected one of {', '.join(PARSERS)}")
    return _as_json(PARSERS[kind](text, source, fields))


def parse_file(kind: str, path: str | Path, fields: Sequence[str] | None = None) -> Any:
    """parse_text on a file; an unreadable file is a ParseError naming it."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ParseError(source, f"cannot read the file: {exc.strerror or exc}") from None
    return parse_text(kind, text, source, fields)
