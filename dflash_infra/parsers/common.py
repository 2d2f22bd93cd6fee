"""What every parser here shares: the ParseError type and how input is quoted in its messages."""

from __future__ import annotations

import re
from typing import Any

Json = dict[str, Any]

# A driver or library version as NVIDIA prints it: two or three dot-separated numbers.
VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")


class ParseError(ValueError):
    """Input of the wrong shape; the message names the input, the line and what was expected."""

    def __init__(self, source: str, problem: str, line: int | None = None) -> None:
        where = f"{source} line {line}" if line is not None else source
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


def one_line(text: str, limit: int = 120) -> str:
    """Quote a piece of input inside an error message: one line, bounded length."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_version(text: str) -> bool:
    """A driver or library version as NVIDIA prints it ('580.126.09', '580.142')."""
    return VERSION.fullmatch(text) is not None


def major_minor(version: str) -> str:
    """'580.159.04' -> '580.159' (how NVML names its own version)."""
    return ".".join(version.split(".")[:2])
