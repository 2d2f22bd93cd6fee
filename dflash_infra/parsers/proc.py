"""What the kernel tells through /proc: the NVIDIA module's version banner (also as dmesg prints it),
/proc/devices, and each GPU's /proc/driver/nvidia/gpus/<bus>/information.

These files come from the kernel module itself, so they are readable when NVML is not (a user space that
does not match the loaded module makes nvidia-smi fail, these files still name the GPUs)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from dflash_infra.parsers.common import Json, ParseError, is_version, one_line


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
        raise ParseError(source, f"expected {_BANNER_SHAPE}, found {one_line(banner)!r}", line=line)
    try:
        module_at = next(i for i in range(2, len(words) - 1) if words[i : i + 2] == ["Kernel", "Module"])
    except StopIteration:
        raise ParseError(
            source, f"expected {_BANNER_SHAPE}, found {one_line(banner)!r}", line=line
        ) from None
    flavor = "open" if words[2] == "Open" else "proprietary"
    before = words[3 if flavor == "open" else 2 : module_at]
    after = words[module_at + 2 :]
    arch = before[0] if len(before) == 1 else None
    if after[:1] == ["for"] and len(after) >= 2:
        arch, after = after[1], after[2:]
    if not after or not is_version(after[0]):
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
                f"expected '<major> <name>' or a 'Character devices:' header, found {one_line(line)!r}",
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
# /proc/driver/nvidia/gpus/<bus>/information
# ---------------------------------------------------------------------------------------------


_INFO_FILE = "/proc/driver/nvidia/gpus/<bus>/information"
_BUS_LOCATION = re.compile(r"(?P<domain>[0-9a-f]{4,8}):(?P<rest>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])", re.IGNORECASE)
_GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
# Lines every driver since the 390 branch prints; the others are read when present.
_INFO_REQUIRED = ("Model", "IRQ", "GPU UUID", "Bus Location", "Device Minor")
# 'GPU Excluded' was called 'Blacklisted' before the 460 branch.
_INFO_ALIASES = {"Blacklisted": "GPU Excluded"}

T = TypeVar("T")


def _unknown(value: str) -> bool:
    """The driver's placeholders for a value it cannot read: 'N/A', '??.??.??.??.??', 'GPU-????????-...'."""
    return value in ("", "N/A") or set(value.removeprefix("GPU-")) <= set("?.-")


def _info_name(value: str, what: str) -> str:
    if _unknown(value):
        raise ValueError(f"{what} must name the GPU model, found {value!r}")
    return value


def _info_text(value: str, what: str) -> str | None:
    return None if _unknown(value) else value


def _info_int(value: str, what: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{what} must be a whole number, found {value!r}")
    return int(value)


def _info_uuid(value: str, what: str) -> str | None:
    if _unknown(value):
        return None
    if not _GPU_UUID.fullmatch(value):
        raise ValueError(f"{what} must look like 'GPU-ee3729f3-f3e0-707b-4478-8312f077d0e1', found {value!r}")
    return value


def _info_bus(value: str, what: str) -> str:
    if not _BUS_LOCATION.fullmatch(value):
        raise ValueError(f"{what} must be a PCI address like '0000:17:00.0', found {value!r}")
    return value


def _info_bits(value: str, what: str) -> int | None:
    if _unknown(value):
        return None
    number, _, unit = value.partition(" ")
    if not number.isdigit() or unit != "bits":
        raise ValueError(f"{what} must be a number of bits like '52 bits', found {value!r}")
    return int(number)


def _info_mask(value: str, what: str) -> str | None:
    if _unknown(value):
        return None
    if re.fullmatch(r"0x[0-9a-f]+", value, re.IGNORECASE) is None:
        raise ValueError(f"{what} must be a hexadecimal mask like '0xfffffffffffff', found {value!r}")
    return value


def _info_yes_no(value: str, what: str) -> bool:
    if value not in ("Yes", "No"):
        raise ValueError(f"{what} must be Yes or No, found {value!r}")
    return value == "Yes"


@dataclass(frozen=True)
class _InfoLines:
    """The 'Key: value' lines of one information file, by key, with their line numbers."""

    source: str
    lines: dict[str, tuple[int, str]]

    def get(self, key: str, convert: Callable[[str, str], T]) -> T | None:
        """The line's value converted; None when the file has no such line."""
        if key not in self.lines:
            return None
        number, value = self.lines[key]
        try:
            return convert(value, key)
        except ValueError as exc:
            raise ParseError(self.source, str(exc), number) from None

    def require(self, key: str, convert: Callable[[str, str], T]) -> T:
        value = self.get(key, convert)
        if value is None:
            raise ParseError(self.source, f"expected a '{key}:' line with a value ({_INFO_FILE})")
        return value


def _information_lines(text: str, source: str) -> _InfoLines:
    """Split the file into its lines; a key given twice means two files were run together."""
    found: dict[str, tuple[int, str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        key = _INFO_ALIASES.get(key.strip(), key.strip())
        if not sep or not key:
            raise ParseError(source, f"expected 'Key: value' lines of {_INFO_FILE}, found {one_line(line)!r}", number)
        if key in found:
            raise ParseError(source, f"'{key}:' appears twice (first on line {found[key][0]}); expected the "
                             "information file of one GPU", number)
        found[key] = (number, value.strip())
    return _InfoLines(source, found)


def parse_gpu_information(text: str, source: str = _INFO_FILE) -> Json:
    """One GPU from /proc/driver/nvidia/gpus/<bus>/information (readable without NVML), as a dict:

    name (the Model line), uuid, bus_location ('0000:17:00.0'), pci_bus_id (the same address as nvidia-smi
    spells it, '00000000:17:00.0', to match --query-gpu=pci.bus_id), device_minor (N of /dev/nvidiaN), irq,
    bus_type, dma_size_bits, dma_mask, video_bios, firmware (GSP firmware), excluded (bool). uuid and
    video_bios are None while the driver prints question marks (the GPU was not initialised since boot);
    optional lines a driver does not print are None (excluded: False). Lines this parser does not know are
    left out; a missing or malformed known line is a ParseError.
    """
    info = _information_lines(text, source)
    if not info.lines:
        raise ParseError(source, f"expected the 'Model:', 'GPU UUID:', 'Bus Location:' ... lines of {_INFO_FILE}, "
                         "found nothing")
    missing = [key for key in _INFO_REQUIRED if key not in info.lines]
    if missing:
        raise ParseError(source, f"expected the lines {', '.join(k + ':' for k in _INFO_REQUIRED)} of "
                         f"{_INFO_FILE}; missing {', '.join(k + ':' for k in missing)}")
    bus = info.require("Bus Location", _info_bus)
    domain, rest = bus.split(":", 1)
    return dict(
        name=info.require("Model", _info_name),
        uuid=info.get("GPU UUID", _info_uuid),
        bus_location=bus,
        pci_bus_id=f"{domain.zfill(8)}:{rest}".upper(),
        device_minor=info.require("Device Minor", _info_int),
        irq=info.require("IRQ", _info_int),
        bus_type=info.get("Bus Type", _info_text),
        dma_size_bits=info.get("DMA Size", _info_bits),
        dma_mask=info.get("DMA Mask", _info_mask),
        video_bios=info.get("Video BIOS", _info_text),
        firmware=info.get("GPU Firmware", _info_text),
        excluded=info.get("GPU Excluded", _info_yes_no) is True,
    )
