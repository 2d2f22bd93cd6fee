"""Parsers for what a GPU host prints: nvidia-smi (query CSV, default table, --version, NVML
errors), /proc/driver/nvidia/version, /proc/devices and dpkg.

Every parser takes the text plus a `source` label (a file name, or a phrase such as
"ct129: nvidia-smi") and returns dataclasses with `to_dict()` (JSON-safe). Input of the
wrong shape raises ParseError, whose one-line message names the source, the line and what
was expected, so callers can print it as is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ParseError",
    "GpuRecord",
    "ComputeApp",
    "KernelModule",
    "NvmlStatus",
    "SmiGpu",
    "SmiProcess",
    "SmiTable",
    "SmiVersion",
    "ProcDevices",
    "DpkgPackage",
    "parse_gpus",
    "parse_apps",
    "parse_driver",
    "parse_nvml",
    "parse_smi_table",
    "parse_smi_version",
    "parse_proc_devices",
    "parse_dpkg_query",
    "parse_dpkg_list",
    "debian_upstream",
    "nvidia_branch",
    "embedded_upstream",
    "library_version_from_path",
    "parse_text",
    "parse_file",
    "PARSERS",
]

Json = dict[str, Any]

# A driver or library version as NVIDIA prints it: two or three dot-separated numbers.
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")


class ParseError(ValueError):
    """Input of the wrong shape; the message names the input, the line and what was expected."""

    def __init__(self, source: str, problem: str, line: int | None = None) -> None:
        where = f"{source} line {line}" if line is not None else source
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


def _one_line(text: str, limit: int = 120) -> str:
    """Quote a piece of input inside an error message: one line, bounded length."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_version(text: str) -> bool:
    return _VERSION.fullmatch(text) is not None


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# ---------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu / --query-compute-apps CSV
# ---------------------------------------------------------------------------------------------


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
    if not _is_version(value):
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
    _raise_on_smi_failure(text, source, f"{kind.query_flag} CSV")
    lines = [(n, line.rstrip("\r")) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line.strip()]

    if not lines:
        if allow_empty:  # e.g. --query-compute-apps with noheader and no processes prints nothing
            return []
        raise ParseError(source, f"no {kind.what} rows: expected nvidia-smi {kind.query_flag} CSV output")
    first_number, first_line = lines[0]
    header = _header_fields([c.strip() for c in first_line.split(",")], kind)
    given = [(kind.canonical(f), None) for f in fields] if fields else None
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
            f"or the {kind.query_flag} field names (--fields a,b,c), found {_one_line(first_line)!r}",
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
                f"found {len(cells)}: {_one_line(line)!r}",
                line=number,
            )
        row: dict[str, Any] = {}
        for name, column, cell in zip(names, columns, cells):
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


# ---------------------------------------------------------------------------------------------
# NVML failures (nvidia-smi that could not start)
# ---------------------------------------------------------------------------------------------

_FAILURE_PREFIXES = (
    "Failed to initialize NVML",
    "NVIDIA-SMI has failed",
    "No devices were found",
    "Unable to determine the device handle",
    "Unable to load the NVIDIA driver",
)
# The shell's words when there is no nvidia-smi to run at all.
_MISSING_COMMAND = ("command not found", "nvidia-smi: not found", "No such file or directory")


@dataclass
class NvmlStatus:
    """Whether nvidia-smi could talk to the driver; `library_version` is NVML's major.minor when known."""

    status: str  # "ok" | "mismatch" | "error"
    library_version: str | None
    message: str

    def to_dict(self) -> Json:
        return {"status": self.status, "library_version": self.library_version, "message": self.message}


def _library_version_in(lines: Sequence[str]) -> str | None:
    """NVML major.minor from 'NVML library version:', 'NVML version :' or the table's 'NVIDIA-SMI x.y.z'."""
    for line in lines:
        key, sep, value = line.partition(":")
        if (
            sep
            and key.strip().lower() in ("nvml library version", "nvml version")
            and _is_version(value.strip())
        ):
            return _major_minor(value.strip())
    for line in lines:
        words = line.strip("| ").split()
        if len(words) >= 2 and words[0] == "NVIDIA-SMI" and _is_version(words[1]):
            return _major_minor(words[1])
    return None


def parse_nvml(text: str, source: str = "nvidia-smi") -> NvmlStatus:
    """Classify nvidia-smi output (stdout and stderr together): ok, driver/library mismatch, or error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return NvmlStatus("error", None, "nvidia-smi printed nothing")
    failures = [
        line
        for line in lines
        if line.startswith(_FAILURE_PREFIXES) or any(words in line for words in _MISSING_COMMAND)
    ]
    version = _library_version_in(lines)
    if not failures:
        return NvmlStatus("ok", version, "")
    message = failures[0]
    if "Driver/library version mismatch" in message:
        return NvmlStatus("mismatch", version, message)
    return NvmlStatus("error", version, message)


def _raise_on_smi_failure(text: str, source: str, expected: str) -> None:
    status = parse_nvml(text, source)
    if status.status != "ok" and text.strip():
        detail = status.message
        if status.library_version:
            detail += f" (NVML library version {status.library_version})"
        raise ParseError(source, f"nvidia-smi failed instead of printing {expected}: {detail}")


# ---------------------------------------------------------------------------------------------
# /proc/driver/nvidia/version (and the kernel's load banner in dmesg / the journal)
# ---------------------------------------------------------------------------------------------


@dataclass
class KernelModule:
    """The loaded NVIDIA kernel module: version, open or proprietary flavor, CPU architecture."""

    version: str
    flavor: str  # "open" | "proprietary"
    arch: str | None = None
    gcc_version: str | None = None

    def to_dict(self) -> Json:
        out: Json = {"version": self.version, "flavor": self.flavor}
        if self.arch is not None:
            out["arch"] = self.arch
        if self.gcc_version is not None:
            out["gcc_version"] = self.gcc_version
        return out


_BANNER_SHAPE = "'NVIDIA UNIX [Open] ... Kernel Module ... <version> ...'"


def _parse_banner(banner: str, source: str, line: int) -> KernelModule:
    """Read 'NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  ...' (open) or
    'NVIDIA UNIX x86_64 Kernel Module  580.142  ...' (proprietary)."""
    words = banner.split()
    if words[:2] != ["NVIDIA", "UNIX"]:
        raise ParseError(source, f"expected {_BANNER_SHAPE}, found {_one_line(banner)!r}", line=line)
    try:
        module_at = next(i for i in range(2, len(words) - 1) if words[i : i + 2] == ["Kernel", "Module"])
    except StopIteration:
        raise ParseError(
            source, f"expected {_BANNER_SHAPE}, found {_one_line(banner)!r}", line=line
        ) from None
    flavor = "open" if words[2] == "Open" else "proprietary"
    before = words[3 if flavor == "open" else 2 : module_at]
    after = words[module_at + 2 :]
    arch = before[0] if len(before) == 1 else None
    if after[:1] == ["for"] and len(after) >= 2:
        arch, after = after[1], after[2:]
    if not after or not _is_version(after[0]):
        found = after[0] if after else "nothing"
        raise ParseError(
            source, f"expected a version like 580.126.09 after the module name, found {found!r}", line=line
        )
    return KernelModule(version=after[0], flavor=flavor, arch=arch)


def parse_driver(text: str, source: str = "/proc/driver/nvidia/version") -> KernelModule:
    """The kernel module from /proc/driver/nvidia/version, or from 'NVRM: loading ...' lines of dmesg/journal.

    With several load banners (module reloads) the last one wins: it is the module loaded now.
    """
    lines = text.splitlines()
    found: tuple[int, str] | None = None
    for number, line in enumerate(lines, 1):
        if "NVRM version:" in line:
            found = (number, line.split("NVRM version:", 1)[1])
            break
        if "NVRM: loading " in line:
            found = (number, line.split("NVRM: loading ", 1)[1])
    if found is None:
        raise ParseError(
            source,
            "expected a line 'NVRM version: NVIDIA UNIX ... Kernel Module <version> ...' "
            "(cat /proc/driver/nvidia/version) or a dmesg line 'NVRM: loading NVIDIA UNIX ...'; "
            "is the nvidia module loaded?",
        )
    module = _parse_banner(found[1], source, found[0])
    for line in lines:
        if line.startswith("GCC version:"):
            words = line.split()
            if len(words) >= 5 and words[2:4] == ["gcc", "version"]:
                module.gcc_version = words[4]
    return module


# ---------------------------------------------------------------------------------------------
# nvidia-smi default table and nvidia-smi --version
# ---------------------------------------------------------------------------------------------


@dataclass
class SmiGpu:
    """One GPU block of the default nvidia-smi table. Long names are cut to '...' by nvidia-smi."""

    index: int
    name: str
    name_truncated: bool
    bus_id: str | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    persistence_mode: str | None = None
    compute_mode: str | None = None

    def to_dict(self) -> Json:
        return {
            "index": self.index,
            "name": self.name,
            "name_truncated": self.name_truncated,
            "bus_id": self.bus_id,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "persistence_mode": self.persistence_mode,
            "compute_mode": self.compute_mode,
        }


@dataclass
class SmiProcess:
    """One row of the table's Processes section; GI/CI are None outside MIG ('N/A')."""

    gpu: int
    pid: int
    type: str
    process_name: str
    used_memory_mib: int | None
    gpu_instance: int | None = None
    compute_instance: int | None = None

    def to_dict(self) -> Json:
        return {
            "gpu": self.gpu,
            "gpu_instance": self.gpu_instance,
            "compute_instance": self.compute_instance,
            "pid": self.pid,
            "type": self.type,
            "process_name": self.process_name,
            "used_memory_mib": self.used_memory_mib,
        }


@dataclass
class SmiTable:
    """The default `nvidia-smi` output.

    `driver_version` is the kernel module ('Driver Version', or 'KMD Version' from the 610
    branch on); `smi_version` is the user-space nvidia-smi. `processes_state` is 'listed',
    'none_running' ('No running processes found'), 'empty' (a Processes section with no rows
    at all, as inside containers that cannot see host PIDs) or 'absent' (no Processes section).
    """

    smi_version: str
    driver_version: str | None
    cuda_version: str | None
    gpus: list[SmiGpu]
    processes: list[SmiProcess]
    processes_state: str

    def to_dict(self) -> Json:
        return {
            "smi_version": self.smi_version,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "gpus": [g.to_dict() for g in self.gpus],
            "processes": [p.to_dict() for p in self.processes],
            "processes_state": self.processes_state,
        }


def _table_cells(line: str) -> list[str]:
    """The cells of a '| a | b | c |' row, stripped."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table_mib(text: str) -> int | None:
    text = text.strip()
    if text in ("N/A", ""):
        return None
    if not text.endswith("MiB") or not text[:-3].strip().isdigit():
        raise ValueError(f"expected memory like '15MiB', found {text!r}")
    return int(text[:-3])


def _parse_header_line(line: str, source: str, number: int) -> tuple[str, str | None, str | None]:
    """'NVIDIA-SMI x  Driver Version: y  CUDA Version: z' (or the 610 'KMD Version' / 'CUDA UMD Version')."""
    parts = [p.strip() for p in re.split(r"\s{2,}", line.strip().strip("|").strip()) if p.strip()]
    smi = parts[0].split()
    if len(smi) != 2 or smi[0] != "NVIDIA-SMI" or not _is_version(smi[1]):
        raise ParseError(
            source, f"expected 'NVIDIA-SMI <version>' in the table header, found {_one_line(line)!r}", number
        )
    values: dict[str, str] = {}
    for part in parts[1:]:
        key, sep, value = part.partition(":")
        if sep:
            values[key.strip().lower()] = value.strip()
    driver = values.get("kmd version") or values.get("driver version")
    cuda = values.get("cuda umd version") or values.get("cuda version")
    if driver is None:
        raise ParseError(
            source,
            f"expected 'Driver Version:' or 'KMD Version:' in the table header, found {_one_line(line)!r}",
            number,
        )
    return smi[1], driver, cuda


def _parse_gpu_block(first: tuple[int, str], second: tuple[int, str] | None, source: str) -> SmiGpu:
    """One GPU from its first row (index, name, persistence, bus id) and second row (memory)."""
    number, first_line = first
    cells = _table_cells(first_line)
    words = cells[0].split()
    if len(cells) < 2 or len(words) < 3 or not words[0].isdigit():
        raise ParseError(
            source,
            f"expected a GPU row '|   0  <name>  <On|Off> | <bus id> ...', found {_one_line(first_line)!r}",
            number,
        )
    if second is None:
        raise ParseError(
            source,
            f"GPU {words[0]} has no second row (fan, temperature, memory); the table looks cut off",
            number,
        )
    name = " ".join(words[1:-1])
    bus = cells[1].split()
    second_number, second_line = second
    memory_cells = _table_cells(second_line)
    try:
        used_text, slash, total_text = (
            memory_cells[1].partition("/") if len(memory_cells) > 1 else ("", "", "")
        )
        if not slash:
            raise ValueError(f"expected 'used / total' memory, found {_one_line(second_line)!r}")
        used, total = _table_mib(used_text), _table_mib(total_text)
    except ValueError as exc:
        raise ParseError(source, f"GPU {words[0]}: {exc}", second_number) from None
    compute = memory_cells[2].split() if len(memory_cells) > 2 else []
    return SmiGpu(
        index=int(words[0]),
        name=name,
        name_truncated=name.endswith("..."),
        bus_id=bus[0] if bus else None,
        memory_used_mib=used,
        memory_total_mib=total,
        persistence_mode=words[-1],
        compute_mode=compute[-1] if compute else None,
    )


def _parse_process_row(line: str, with_instances: bool, source: str, number: int) -> SmiProcess:
    words = line.strip().strip("|").split()
    fixed = 5 if with_instances else 3  # GPU [GI CI] PID Type
    if len(words) < fixed + 2:
        raise ParseError(
            source,
            f"expected a process row 'GPU GI CI PID Type Name Memory', found {_one_line(line)!r}",
            number,
        )

    def instance(text: str) -> int | None:
        return None if text == "N/A" else int(text)

    try:
        gpu = int(words[0])
        gi, ci = (instance(words[1]), instance(words[2])) if with_instances else (None, None)
        pid = int(words[fixed - 2])
        memory = _table_mib(words[-1])
    except ValueError:
        raise ParseError(
            source,
            f"expected a process row 'GPU GI CI PID Type Name Memory', found {_one_line(line)!r}",
            number,
        ) from None
    return SmiProcess(
        gpu=gpu,
        gpu_instance=gi,
        compute_instance=ci,
        pid=pid,
        type=words[fixed - 1],
        process_name=" ".join(words[fixed:-1]),
        used_memory_mib=memory,
    )


def parse_smi_table(text: str, source: str = "nvidia-smi") -> SmiTable:
    """GPUs and processes from the default `nvidia-smi` table (535, 550, 570+ and 610 layouts).

    Lines outside the box (prompt, timestamp) are ignored; a GPU block cut off after its
    first row is an error, so a truncated capture is never taken for a smaller machine.
    """
    _raise_on_smi_failure(text, source, "its table")
    lines = list(enumerate(text.splitlines(), 1))
    header = next(((n, l) for n, l in lines if l.strip().startswith("| NVIDIA-SMI ")), None)
    if header is None:
        raise ParseError(
            source, "expected the nvidia-smi table header '| NVIDIA-SMI <version>  Driver Version: ...'"
        )
    smi_version, driver, cuda = _parse_header_line(header[1], source, header[0])

    section = "top"  # top -> gpus (after the first '|===|' rule) -> processes
    with_instances = True
    gpus: list[SmiGpu] = []
    processes: list[SmiProcess] = []
    process_section = False
    none_running = False
    pending: tuple[int, str] | None = None  # first row of a GPU block, waiting for its second row
    for number, raw in lines:
        line = raw.strip()
        if not line.startswith(("|", "+")):
            continue
        cells = _table_cells(line)
        if line.startswith("|=") or line.startswith("+="):
            if section == "top":
                section = "gpus"
            elif section == "processes_head":
                section = "processes"
            continue
        if cells and cells[0].startswith("Processes:"):
            section, process_section = "processes_head", True
            continue
        if cells and cells[0].startswith("MIG devices:"):
            section = "mig"
            continue
        if section == "processes_head" and cells and cells[0].startswith("GPU"):
            with_instances = "GI" in cells[0].split()
            continue
        if line.startswith("+"):
            continue
        if section == "gpus":
            first_word = cells[0].split()[:1]
            if pending is None and first_word and first_word[0].isdigit():
                pending = (number, line)
            elif pending is not None:
                gpus.append(_parse_gpu_block(pending, (number, line), source))
                pending = None
        elif section == "processes":
            if "No running processes found" in line:
                none_running = True
            elif cells[0]:
                processes.append(_parse_process_row(line, with_instances, source, number))
    if pending is not None:
        gpus.append(_parse_gpu_block(pending, None, source))
    if not gpus:
        raise ParseError(source, "expected at least one GPU row in the nvidia-smi table, found none")
    if processes:
        state = "listed"
    elif none_running:
        state = "none_running"
    else:
        state = "empty" if process_section else "absent"
    return SmiTable(smi_version, driver, cuda, gpus, processes, state)


@dataclass
class SmiVersion:
    """`nvidia-smi --version`. From the 610 branch on, DRIVER/CUDA lines say 'Deprecated' and
    'KMD version' / 'CUDA UMD version' carry the values; both layouts give the same keys here."""

    smi_version: str
    nvml_version: str | None
    driver_version: str | None
    cuda_version: str | None

    def to_dict(self) -> Json:
        return {
            "smi_version": self.smi_version,
            "nvml_version": self.nvml_version,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
        }


def parse_smi_version(text: str, source: str = "nvidia-smi --version") -> SmiVersion:
    """Versions from `nvidia-smi --version` ('KEY : value' lines), old and 610+ layouts."""
    _raise_on_smi_failure(text, source, "its versions")
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        value = value.strip()
        if sep and value and not value.startswith("Deprecated"):
            values[key.strip().lower()] = value
    smi = values.get("nvidia-smi version")
    if smi is None or not _is_version(smi):
        raise ParseError(source, "expected a line 'NVIDIA-SMI version  : <version>' (nvidia-smi --version)")
    return SmiVersion(
        smi_version=smi,
        nvml_version=values.get("nvml version"),
        driver_version=values.get("kmd version") or values.get("driver version"),
        cuda_version=values.get("cuda umd version") or values.get("cuda version"),
    )


def library_version_from_path(path: str, source: str = "readlink -f libnvidia-ml.so.1") -> str:
    """The driver version in a resolved library path: '.../libnvidia-ml.so.580.159.04' -> '580.159.04'."""
    name = path.strip().rsplit("/", 1)[-1]
    stem, sep, version = name.partition(".so.")
    if not sep or not stem.startswith("lib") or not _is_version(version):
        raise ParseError(
            source,
            f"expected a resolved library path ending in '.so.<driver version>', found {_one_line(path)!r}",
        )
    return version


# ---------------------------------------------------------------------------------------------
# /proc/devices
# ---------------------------------------------------------------------------------------------


@dataclass
class ProcDevices:
    """Device majors from /proc/devices, by name. A name may be registered twice (e.g.
    infiniband_mad), so `ambiguous` lists every major of such names and `major()` refuses them."""

    character: dict[str, int]
    block: dict[str, int]
    ambiguous: dict[str, list[int]] = field(default_factory=dict)
    source: str = "/proc/devices"

    def major(self, name: str, kind: str = "character") -> int | None:
        """The major of a device name; exact match (nvidia-caps is not nvidia-caps-imex-channels)."""
        table = self.character if kind == "character" else self.block
        if kind == "character" and name in self.ambiguous:
            raise ParseError(self.source, f"{name} is registered with several majors {self.ambiguous[name]}")
        return table.get(name)

    def to_dict(self) -> Json:
        out: Json = {"character": dict(self.character), "block": dict(self.block)}
        if self.ambiguous:
            out["ambiguous"] = {k: list(v) for k, v in self.ambiguous.items()}
        return out


def parse_proc_devices(text: str, source: str = "/proc/devices") -> ProcDevices:
    """Majors from /proc/devices; lines before any 'Character devices:' header count as character devices."""
    tables: dict[str, dict[str, list[int]]] = {"character": {}, "block": {}}
    kind = "character"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line in ("Character devices:", "Block devices:"):
            kind = "character" if line.startswith("Character") else "block"
            continue
        words = line.split()
        if len(words) != 2 or not words[0].isdigit():
            raise ParseError(
                source,
                f"expected '<major> <name>' or a 'Character devices:' header, found {_one_line(line)!r}",
                number,
            )
        majors = tables[kind].setdefault(words[1], [])
        if int(words[0]) not in majors:
            majors.append(int(words[0]))
    if not any(tables.values()):
        raise ParseError(source, "expected '<major> <name>' lines (cat /proc/devices), found none")
    ambiguous = {name: majors for name, majors in tables["character"].items() if len(majors) > 1}
    return ProcDevices(
        character={name: majors[0] for name, majors in tables["character"].items()},
        block={name: majors[0] for name, majors in tables["block"].items()},
        ambiguous=ambiguous,
        source=source,
    )


# ---------------------------------------------------------------------------------------------
# Debian package versions, dpkg-query and dpkg -l
# ---------------------------------------------------------------------------------------------

_UPSTREAM = re.compile(r"[0-9][A-Za-z0-9.+~-]*")
_REVISION = re.compile(r"[A-Za-z0-9.+~]+")


def debian_upstream(version: str, source: str = "package version") -> str:
    """The upstream part of a Debian version: epoch and Debian revision stripped.

    '580.126.09-0ubuntu0.24.04.1' -> '580.126.09'; '1:1.1.13-1ubuntu0.1' -> '1.1.13'. NVIDIA
    user space must equal the kernel module on this part only (Ubuntu and CUDA-repo
    revisions differ for the same driver).
    """
    text = version.strip()
    epoch, colon, rest = text.partition(":")
    if not colon:
        epoch, rest = "", text
    elif not epoch.isdigit():
        raise ParseError(
            source, f"expected a Debian version like '1:2.3-4', the epoch must be a number, found {version!r}"
        )
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    if not _UPSTREAM.fullmatch(upstream) or (dash and not _REVISION.fullmatch(revision)):
        raise ParseError(
            source, f"expected a Debian version like '580.126.09-0ubuntu0.24.04.1', found {version!r}"
        )
    return upstream


def _split_arch(package: str) -> tuple[str, str | None]:
    name, colon, arch = package.partition(":")
    return name, (arch if colon else None)


def nvidia_branch(package: str) -> str | None:
    """The NVIDIA driver branch a package belongs to, from its name; None for packages outside a branch.

    'libnvidia-compute-580:amd64' -> '580'; 'nvidia-firmware-580-580.126.09' -> '580';
    'libnvidia-compute-550-server' -> '550-server' (a separate series with its own packages);
    'nvidia-driver-580-open' -> '580'; 'nvidia-settings', 'linux-signatures-nvidia-6.8.0-40-generic' -> None.
    """
    parts = _split_arch(package.strip())[0].split("-")
    after = next((i + 1 for i, part in enumerate(parts) if "nvidia" in part), None)
    if after is None:
        return None
    for i in range(after, len(parts)):
        part = parts[i]
        if "." in part:  # a kernel or driver version: the branch, if any, came before it
            return None
        if len(part) == 3 and part.isdigit():
            server = i + 1 < len(parts) and parts[i + 1] == "server"
            return part + ("-server" if server else "")
    return None


def embedded_upstream(package: str) -> str | None:
    """A driver version carried in a package NAME: 'nvidia-firmware-580-580.95.05' -> '580.95.05'."""
    name = _split_arch(package.strip())[0]
    branch = nvidia_branch(name)
    if branch is None:
        return None
    parts = name.split("-")
    branch_parts = branch.split("-")
    candidate = parts[-1]
    follows_branch = parts[-1 - len(branch_parts) : -1] == branch_parts
    if follows_branch and _VERSION.fullmatch(candidate) and candidate.startswith(branch_parts[0] + "."):
        return candidate
    return None


# Desired action, package state and error flag letters of dpkg's status abbreviation.
_DESIRED, _STATE, _ERROR = "uihrp", "ncHUFWti", " R"


def _valid_status(status: str) -> bool:
    return (
        2 <= len(status) <= 3
        and status[0] in _DESIRED
        and status[1] in _STATE
        and (len(status) == 2 or status[2] in _ERROR)
    )


@dataclass
class DpkgPackage:
    """One package as dpkg reports it. `status` is dpkg's abbreviation ('ii', 'hi', 'rc', 'iU', ...)."""

    package: str
    version: str
    upstream: str | None
    status: str | None
    arch: str | None = None

    @property
    def installed(self) -> bool:
        """Unpacked and configured ('ii' or 'hi'); 'rc', 'iU', 'iF' are not usable installs."""
        return self.status is not None and self.status[1] == "i"

    @property
    def held(self) -> bool:
        return self.status is not None and self.status[0] == "h"

    def to_dict(self) -> Json:
        return {
            "package": self.package,
            "arch": self.arch,
            "version": self.version,
            "upstream": self.upstream,
            "status": self.status,
            "installed": self.installed,
            "held": self.held,
        }


def _package(
    name: str, version: str, status: str | None, arch: str | None, source: str, line: int
) -> DpkgPackage:
    package, name_arch = _split_arch(name)
    try:
        upstream = debian_upstream(version, source) if version else None
    except ParseError:
        raise ParseError(source, f"{package}: expected a Debian version, found {version!r}", line) from None
    return DpkgPackage(
        package=package, version=version, upstream=upstream, status=status, arch=arch or name_arch
    )


def parse_dpkg_query(text: str, source: str = "dpkg-query -W") -> list[DpkgPackage]:
    """Tab-separated `dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'` output.

    The status column is optional (plain `dpkg-query -W` prints package and version only)."""
    packages: list[DpkgPackage] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3) or not fields[0].strip():
            raise ParseError(
                source,
                f"expected 'package<TAB>version[<TAB>status]', "
                f"found {len(fields)} tab-separated fields: {_one_line(line)!r}",
                number,
            )
        status = (fields[2].rstrip() or None) if len(fields) == 3 else None
        if status is not None and not _valid_status(status):
            raise ParseError(source, f"expected a dpkg status like 'ii' or 'rc', found {fields[2]!r}", number)
        packages.append(_package(fields[0].strip(), fields[1].strip(), status, None, source, number))
    return packages


def _is_dpkg_list_header(line: str) -> bool:
    return line.startswith(("Desired=", "| Status=", "|/ Err?=", "||/ ", "+++-"))


def parse_dpkg_list(text: str, source: str = "dpkg -l") -> list[DpkgPackage]:
    """Rows of `dpkg -l` (also piped through grep, or cut down to status, name and version)."""
    packages: list[DpkgPackage] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or _is_dpkg_list_header(line):
            continue
        words = line.split(None, 4)
        if len(words) < 3 or not _valid_status(words[0]):
            raise ParseError(
                source,
                "expected a dpkg -l row '<status> <package> <version> [<arch> <description>]', "
                f"found {_one_line(line)!r}",
                number,
            )
        arch = words[3] if len(words) >= 4 else None
        packages.append(_package(words[1], words[2], words[0], arch, source, number))
    return packages


# ---------------------------------------------------------------------------------------------
# Entry points for the CLI
# ---------------------------------------------------------------------------------------------


def _as_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_json(v) for v in value]
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
