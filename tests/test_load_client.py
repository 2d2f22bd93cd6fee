"""The load client's arithmetic (tools/load.py) on a real Locust 2.47.0 report: 8 users of tools/locustfile.py
against the lab gateway for 8 s, stopped by SIGTERM (tests/fixtures/locust/report-chat-8-users.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import load  # noqa: E402

REPORT = json.loads((ROOT / "tests" / "fixtures" / "locust" / "report-chat-8-users.json").read_text())


def test_figures_of_a_real_report() -> None:
    out = load.figures(REPORT, 8.0)
    assert (out["requests"], out["failed"]) == (1167, 0)
    assert out["requests_per_s"] == round(1167 / 8.0, 1)
    # Locust printed 44 ms at the 50th and 60 ms at the 99th percentile for this run (its own summary table).
    assert (out["p50_ms"], out["p99_ms"]) == (44.0, 60.0)


def test_nearest_rank_percentiles() -> None:
    histogram = {"10": 50, "20": 49, "900": 1}
    assert load.percentile(histogram, 0.5) == 10.0 and load.percentile(histogram, 0.99) == 20.0
    assert load.percentile(histogram, 1.0) == 900.0 and load.percentile({}, 0.5) == 0.0


@pytest.mark.parametrize("url", ["http://ct200:30000", "http://ct200.example:30000", "http://[2001:db8::1]:30000"])
def test_the_load_client_refuses_anything_but_loopback(url: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected a loopback URL"):
        load.Load(url, tmp_path)
