"""NVML failures (nvidia-smi that could not start) and the driver version in the NVML library's path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dflash_infra.parsers.common import Json, ParseError, is_version, major_minor, one_line

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
            and is_version(value.strip())
        ):
            return major_minor(value.strip())
    for line in lines:
        words = line.strip("| ").split()
        if len(words) >= 2 and words[0] == "NVIDIA-SMI" and is_version(words[1]):
            return major_minor(words[1])
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


def raise_on_smi_failure(text: str, source: str, expected: str) -> None:
    status = parse_nvml(text, source)
    if status.status != "ok" and text.strip():
        detail = status.message
        if status.library_version:
            detail += f" (NVML library version {status.library_version})"
        raise ParseError(source, f"nvidia-smi failed instead of printing {expected}: {detail}")


def library_version_from_path(path: str, source: str = "readlink -f libnvidia-ml.so.1") -> str:
    """The driver version in a resolved library path: '.../libnvidia-ml.so.580.159.04' -> '580.159.04'."""
    name = path.strip().rsplit("/", 1)[-1]
    stem, sep, version = name.partition(".so.")
    if not sep or not stem.startswith("lib") or not is_version(version):
        raise ParseError(
            source,
            f"expected a resolved library path ending in '.so.<driver version>', found {one_line(path)!r}",
        )
    return version
