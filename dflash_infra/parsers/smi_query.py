"""nvidia-smi --query-gpu / --query-compute-apps CSV, in any field order, with or without header and units."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflash_infra.parsers.common import Json, ParseError, is_version, one_line
from dflash_infra.parsers.nvml import raise_on_smi_failure


@dataclass(frozen=True)
class _Column:
    """How one nvidia-smi query field becomes a key and a typed value."""

    key: str
    convert: Callable[[str, str], Any]  # (value, what) -> typed value; raises ValueError


def _to_int(value: str, what: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{what} must be a whole number, found {value!r}")
    return int(value)


def _to_mib(value: str, what: str) -> int:
    number = value[: -len("MiB")].strip() if value.endswith("MiB") else value
    if not number.isdigit():
        raise ValueError(f"{what} must be a number of MiB like '49140 MiB', found {value!r}")
    return int(number)


def _to_text(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} is empty")
    return value


def _to_version(value: str, what: str) -> str:
    if not is_version(value):
        raise ValueError(f"{what} must be a version like 580.126.09, found {value!r}")
    return value


def _to_compute_cap(value: str, what: str) -> str:
    if re.fullmatch(r"\d+\.\d+", value) is None:
        raise ValueError(f"{what} must look like '12.0', found {value!r}")
    return value


def _to_number(value: str, what: str) -> int | float:
    number = value.split(" ")[0]
    try:
        return int(number)
    except ValueError:
        pass
    try:
        return float(number)
    except ValueError:
        raise ValueError(f"{what} must be a number, found {value!r}") from None


_GPU_COLUMNS: dict[str, _Column] = {
    "index": _Column("index", _to_int),
    "name": _Column("name", _to_text),
    "memory.total": _Column("memory_total_mib", _to_mib),
    "memory.used": _Column("memory_used_mib", _to_mib),
    "memory.free": _Column("memory_free_mib", _to_mib),
    "memory.reserved": _Column("memory_reserved_mib", _to_mib),
    "compute_cap": _Column("compute_cap", _to_compute_cap),
    "driver_version": _Column("driver_version", _to_version),
    "uuid": _Column("uuid", _to_text),
    "pci.bus_id": _Column("pci_bus_id", _to_text),
    "serial": _Column("serial", _to_text),
}
# nvidia-smi --help-query-gpu lists these as other spellings of the same field; the CSV
# header always prints the canonical name.
_GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "gpu_serial": "serial"}

_APP_COLUMNS: dict[str, _Column] = {
    "pid": _Column("pid", _to_int),
    "process_name": _Column("process_name", _to_text),
    "used_gpu_memory": _Column("used_memory_mib", _to_mib),
    "gpu_uuid": _Column("gpu_uuid", _to_text),
    "gpu_name": _Column("gpu_name", _to_text),
    "gpu_bus_id": _Column("gpu_bus_id", _to_text),
    "gpu_serial": _Column("gpu_serial", _to_text),
    "timestamp": _Column("timestamp", _to_text),
}
# In --query-compute-apps, `name` is the process name (nvidia-smi prints it as process_name).
_APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}

_HEADER_CELL = re.compile(r"(?P<field>[a-z][a-z0-9_.]*)(?: \[(?P<unit>[^\]]+)\])?")


@dataclass(frozen=True)
class _QueryKind:
    what: str  # "GPU" / "compute app", for messages
    query_flag: str
    columns: dict[str, _Column]
    aliases: dict[str, str]

    def canonical(self, name: str) -> str:
        name = name.strip().lower()
        return self.aliases.get(name, name)

    def column(self, name: str, unit: str | None) -> _Column:
        """The column for a field; unknown fields keep their snake_case name (plus unit)."""
        if name in self.columns:
            return self.columns[name]
        key = name.replace(".", "_")
        if unit:
            key += "_" + unit.lower().replace("%", "pct")
            return _Column(key, _to_number)
        return _Column(key, _to_text)


_GPU_QUERY = _QueryKind("GPU", "--query-gpu", _GPU_COLUMNS, _GPU_ALIASES)
_APP_QUERY = _QueryKind("compute app", "--query-compute-apps", _APP_COLUMNS, _APP_ALIASES)


def _is_missing(value: str) -> bool:
    """nvidia-smi prints '[N/A]', '[Not Supported]' and similar where it has no value."""
    return value.startswith("[") and value.endswith("]")


def _header_fields(cells: Sequence[str], kind: _QueryKind) -> list[tuple[str, str | None]] | None:
    """(field, unit) per cell when the line is a CSV header of `kind`, else None."""
    parsed = [_HEADER_CELL.fullmatch(cell) for cell in cells]
    if not all(parsed):
        return None
    fields = [(kind.canonical(m["field"]), m["unit"]) for m in parsed if m]
    if not any(name in kind.columns for name, _ in fields):
        return None
    return fields


def _parse_query_csv(
    text: str,
    source: str,
    kind: _QueryKind,
    fields: Sequence[str] | None,
    require: Sequence[str],
    allow_empty: bool,
) -> list[dict[str, Any]]:
    """Rows of an nvidia-smi --format=csv query as {key: typed value}, present columns only."""
    raise_on_smi_failure(text, source, f"{kind.query_flag} CSV")
    lines = [(n, line.rstrip("\r")) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line.strip()]

    if not lines:
        if allow_empty:  # e.g. --query-compute-apps with noheader and no processes prints nothing
            return []
        raise ParseError(source, f"no {kind.what} rows: expected nvidia-smi {kind.query_flag} CSV output")
    first_number, first_line = lines[0]
    header = _header_fields([c.strip() for c in first_line.split(",")], kind)
    given: list[tuple[str, str | None]] | None = [(kind.canonical(f), None) for f in fields] if fields else None
    if header is not None:
        lines = lines[1:]
        if given is not None and [f for f, _ in header] != [f for f, _ in given]:
            raise ParseError(
                source,
                f"the header names {', '.join(f for f, _ in header)} but the field list says "
                f"{', '.join(f for f, _ in given)}; drop the field list or fix it",
                line=first_number,
            )
    elif given is not None:
        header = given
    else:
        raise ParseError(
            source,
            f"no CSV header and no field list: expected a header like 'index, name, memory.total [MiB]' "
            f"or the {kind.query_flag} field names (--fields a,b,c), found {one_line(first_line)!r}",
            line=first_number,
        )

    columns = [kind.column(name, unit) for name, unit in header]
    names = [name for name, _ in header]
    missing = [name for name in require if name not in names]
    if missing:
        raise ParseError(
            source,
            f"expected the {kind.what} fields {', '.join(require)}; missing {', '.join(missing)} "
            f"(columns: {', '.join(names) or 'none'}); query them with {kind.query_flag}={','.join(require)}",
        )

    rows: list[dict[str, Any]] = []
    for number, line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(columns):
            raise ParseError(
                source,
                f"expected {len(columns)} fields ({', '.join(names)}), "
                f"found {len(cells)}: {one_line(line)!r}",
                line=number,
            )
        row: dict[str, Any] = {}
        for name, column, cell in zip(names, columns, cells, strict=True):
            if _is_missing(cell):
                row[column.key] = None
                continue
            try:
                row[column.key] = column.convert(cell, name)
            except ValueError as exc:
                raise ParseError(source, str(exc), line=number) from None
        rows.append(row)
    if not rows and not allow_empty:
        raise ParseError(source, f"no {kind.what} rows: expected nvidia-smi {kind.query_flag} CSV output")
    return rows


@dataclass
class GpuRecord:
    """One GPU from nvidia-smi --query-gpu; fields that were not queried are None."""

    name: str | None
    memory_total_mib: int | None
    index: int | None = None
    compute_cap: str | None = None
    driver_version: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _OPTIONAL = ("compute_cap", "driver_version", "uuid", "pci_bus_id")

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> GpuRecord:
        known = {"name", "memory_total_mib", "index", *cls._OPTIONAL}
        return cls(
            name=row.get("name"),
            memory_total_mib=row.get("memory_total_mib"),
            index=row.get("index"),
            compute_cap=row.get("compute_cap"),
            driver_version=row.get("driver_version"),
            uuid=row.get("uuid"),
            pci_bus_id=row.get("pci_bus_id"),
            extra={k: v for k, v in row.items() if k not in known},
        )

    def to_dict(self) -> Json:
        out: Json = {} if self.index is None else {"index": self.index}
        out["name"] = self.name
        out["memory_total_mib"] = self.memory_total_mib
        out.update({k: getattr(self, k) for k in self._OPTIONAL if getattr(self, k) is not None})
        out.update(self.extra)
        return out


@dataclass
class ComputeApp:
    """One process from nvidia-smi --query-compute-apps; used memory is None where nvidia-smi says [N/A]."""

    pid: int | None
    process_name: str | None
    used_memory_mib: int | None
    gpu_uuid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ComputeApp:
        known = {"pid", "process_name", "used_memory_mib", "gpu_uuid"}
        return cls(
            pid=row.get("pid"),
            process_name=row.get("process_name"),
            used_memory_mib=row.get("used_memory_mib"),
            gpu_uuid=row.get("gpu_uuid"),
            extra={k: v for k, v in row.items() if k not in known},
        )

    def to_dict(self) -> Json:
        out: Json = {
            "pid": self.pid,
            "process_name": self.process_name,
            "used_memory_mib": self.used_memory_mib,
        }
        if self.gpu_uuid is not None:
            out["gpu_uuid"] = self.gpu_uuid
        out.update(self.extra)
        return out


def parse_gpus(
    text: str,
    source: str = "nvidia-smi --query-gpu",
    fields: Sequence[str] | None = None,
    require: Sequence[str] = ("name", "memory.total"),
) -> list[GpuRecord]:
    """GPUs from `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`, any field order.

    `fields` names the columns of header-less output; `require` lists the query fields the
    caller needs (the planner needs name and memory.total).
    """
    rows = _parse_query_csv(
        text, source, _GPU_QUERY, fields, [_GPU_QUERY.canonical(r) for r in require], False
    )
    return [GpuRecord.from_row(row) for row in rows]


def parse_apps(
    text: str,
    source: str = "nvidia-smi --query-compute-apps",
    fields: Sequence[str] | None = None,
    require: Sequence[str] = ("pid", "process_name", "used_gpu_memory"),
) -> list[ComputeApp]:
    """Processes from `nvidia-smi --query-compute-apps=... --format=csv`; no rows means no processes."""
    rows = _parse_query_csv(
        text, source, _APP_QUERY, fields, [_APP_QUERY.canonical(r) for r in require], True
    )
    return [ComputeApp.from_row(row) for row in rows]
