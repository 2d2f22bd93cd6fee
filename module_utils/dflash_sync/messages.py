"""The sentences a sync prints: byte counts for people, one line per plan and per finished sync."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def human(n: float) -> str:
    """Bytes as B, KiB, MiB, GiB or TiB (two decimals above bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def plan_summary(plan: Mapping[str, Any]) -> str:
    """One line for the play output: what a sync does (or would do) for one model at the destination."""
    counts = {a: sum(1 for f in plan["files"] if f["action"] == a)
              for a in ("ok", "adopt", "staged", "transfer", "link")}
    resume = sum(int(f.get("resume_bytes") or 0) for f in plan["files"])
    parts = [f"{plan['name']}: {len(plan['files'])} files, {human(plan['total_bytes'])}",
             f"{counts['ok']} verified in place"]
    if counts["adopt"]:
        parts.append(f"{counts['adopt']} present and adopted after hashing")
    if counts["staged"]:
        parts.append(f"{counts['staged']} received earlier, to verify")
    if counts["transfer"]:
        parts.append(f"{counts['transfer']} to copy ({human(plan['transfer_bytes'])}"
                     + (f", {human(resume)} already received" if resume else "") + ")")
    if counts["link"]:
        parts.append(f"{counts['link']} unchanged, hard-linked from the kept version ({human(plan['link_bytes'])}, "
                     "no byte copied)")
    if plan.get("extras"):
        parts.append(f"{len(plan['extras'])} extra files to remove ({', '.join(plan['extras'][:3])})")
    if plan.get("permissions"):
        parts.append(f"{len(plan['permissions'])} owners or modes to set")
    if plan.get("foreign"):
        parts.append(f"{len(plan['foreign'])} files this project did not write left in place "
                     f"({', '.join(plan['foreign'][:3])})")
    parts += plan.get("versions") or []
    parts.append(f"hashed {human(plan.get('hashed_bytes', 0))} to decide")
    parts.append(f"free {human(plan['free_bytes'])}")
    return ", ".join(parts)


def sync_summary(report: Mapping[str, Any]) -> str:
    """One line for the play output: what a finished sync moved, pulled and verified."""
    repaired = report["repaired"]
    pulls = "".join(
        f"pulled {human(t['bytes'])} in {t['seconds']} s ({human(t['stats'].get('literal_data', 0))} sent as data, "
        f"{human(t['stats'].get('matched_data', 0))} reused from {human(t['resumed_bytes'])} already received); "
        for t in report["transfers"])
    linked = report.get("linked") or []
    versions = "".join(f"{step}; " for step in report.get("versions") or [])
    return (f"{report['name']}: {versions}{len(report['moved'])} files moved into place "
            f"({human(report.get('written_bytes', 0))} written), "
            + (f"{len(linked)} unchanged hard-linked ({human(report.get('linked_bytes', 0))}, no byte copied), "
               if linked else "")
            + f"{len(report['removed'])} removed, "
            f"{len(repaired)} repaired{(' (' + ', '.join(repaired) + ')') if repaired else ''}; {pulls}"
            f"verified {human(report['hashed_bytes'])} by sha256 ({human(report['hashed_while_receiving'])} of it "
            f"while rsync was writing); manifest {report['manifest_sha256'][:16]}.")
