"""The sentences a plan collects while it is made."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Notes:
    """Errors refuse the plan, warnings qualify it, reasons explain each chosen setting (keyed by setting)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
