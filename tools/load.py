"""Locust (the load client of the gateway's lab tests and `make bench-serve`), headless, against one endpoint until
stopped, and its own figures read back from its JSON report: requests, failures, requests/s, latency percentiles.
Bounded by the caller (users; a SIGTERM when its play ends; a run-time cap) and pointed at loopback or the lab's
own addresses only (`start` refuses anything else).
"""

from __future__ import annotations

import csv
import ipaddress
import json
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "tools" / "locustfile.py"
MAX_SECONDS = 600


def percentile(histogram: dict[str, int], fraction: float) -> float:
    """The nearest-rank percentile (ms) of Locust's response-time histogram {rounded ms: count}."""
    points = sorted((float(ms), int(n)) for ms, n in histogram.items())
    total = sum(n for _, n in points)
    if not total:
        return 0.0
    rank, seen = max(1, -(-int(fraction * total * 1000) // 1000)), 0
    for ms, n in points:
        seen += n
        if seen >= rank:
            return ms
    return points[-1][0]


def figures(stats: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Requests, failures, requests/s over the wall time, p50/p99 latency (ms) from Locust's JSON report."""
    histogram: dict[str, int] = {}
    for entry in stats:
        for ms, n in (entry.get("response_times") or {}).items():
            histogram[str(ms)] = histogram.get(str(ms), 0) + int(n)
    requests = sum(int(s["num_requests"]) for s in stats)
    return {"requests": requests, "failed": sum(int(s["num_failures"]) for s in stats),
            "seconds": round(seconds, 2), "requests_per_s": round(requests / seconds, 1) if seconds else 0.0,
            "p50_ms": percentile(histogram, 0.50), "p99_ms": percentile(histogram, 0.99)}


def _local(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Load:
    """One headless Locust run against `url` (users at once, no think time) until `stop`."""

    def __init__(self, url: str, folder: Path, users: int = 4) -> None:
        if not _local(url):
            raise ValueError(f"load client: expected a loopback URL (the lab's own addresses), found {url}")
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "locust"), "-f", str(LOCUSTFILE), "--headless", "-u", str(users),
             "-r", str(users), "-t", f"{MAX_SECONDS}s", "--host", url, "--json", "--only-summary",
             "--csv", str(folder / "load"), "--stop-timeout", "30"],
            cwd=REPO, stdout=(folder / "report.json").open("w"), stderr=(folder / "locust.log").open("w"))
        self.started = time.monotonic()
        self.wait_requests(users)  # every user spawned and answered (spawn rate = users per second)

    def requests(self) -> int:
        """Requests completed so far: the Aggregated row of the stats CSV Locust rewrites every second."""
        try:
            rows = list(csv.DictReader((self.folder / "load_stats.csv").open()))
        except FileNotFoundError:
            return 0
        return next((int(row["Request Count"]) for row in rows if row["Name"] == "Aggregated"), 0)

    def wait_requests(self, count: int, timeout_s: float = 60.0) -> int:
        """Wait until at least `count` more requests than now have completed (a condition, not a fixed sleep)."""
        target, deadline = self.requests() + count, time.monotonic() + timeout_s
        while (done := self.requests()) < target:
            if self.proc.poll() is not None:
                raise RuntimeError(f"locust exited ({self.proc.returncode}): "
                                   f"{(self.folder / 'locust.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"load client: {done} of {target} requests after {timeout_s:.0f} s")
            time.sleep(0.2)
        return done

    def stop(self) -> dict[str, Any]:
        seconds = time.monotonic() - self.started
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        text = (self.folder / "report.json").read_text()
        if not text.strip():
            raise RuntimeError(f"locust wrote no report: {(self.folder / 'locust.log').read_text()[-2000:]}")
        out = figures(json.loads(text), seconds)
        failures = self.folder / "load_failures.csv"
        rows = failures.read_text().splitlines() if failures.exists() else []
        out["failures"] = "\n".join(rows) if len(rows) > 1 else ""  # Locust writes the header when nothing failed
        return out
