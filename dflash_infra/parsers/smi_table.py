"""The default nvidia-smi table (535 to 610 layouts) and nvidia-smi --version."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflash_infra.parsers.common import Json, ParseError, is_version, one_line
from dflash_infra.parsers.nvml import raise_on_smi_failure


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
    if len(smi) != 2 or smi[0] != "NVIDIA-SMI" or not is_version(smi[1]):
        raise ParseError(
            source, f"expected 'NVIDIA-SMI <version>' in the table header, found {one_line(line)!r}", number
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
            f"expected 'Driver Version:' or 'KMD Version:' in the table header, found {one_line(line)!r}",
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
            f"expected a GPU row '|   0  <name>  <On|Off> | <bus id> ...', found {one_line(first_line)!r}",
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
            raise ValueError(f"expected 'used / total' memory, found {one_line(second_line)!r}")
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
            f"expected a process row 'GPU GI CI PID Type Name Memory', found {one_line(line)!r}",
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
            f"expected a process row 'GPU GI CI PID Type Name Memory', found {one_line(line)!r}",
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
    raise_on_smi_failure(text, source, "its table")
    lines = list(enumerate(text.splitlines(), 1))
    header = next(((n, text) for n, text in lines if text.strip().startswith("| NVIDIA-SMI ")), None)
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
    raise_on_smi_failure(text, source, "its versions")
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        value = value.strip()
        if sep and value and not value.startswith("Deprecated"):
            values[key.strip().lower()] = value
    smi = values.get("nvidia-smi version")
    if smi is None or not is_version(smi):
        raise ParseError(source, "expected a line 'NVIDIA-SMI version  : <version>' (nvidia-smi --version)")
    return SmiVersion(
        smi_version=smi,
        nvml_version=values.get("nvml version"),
        driver_version=values.get("kmd version") or values.get("driver version"),
        cuda_version=values.get("cuda umd version") or values.get("cuda version"),
    )
