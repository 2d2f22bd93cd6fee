"""The load client's arithmetic (tools/load.py) on a real Locust 2.47.0 report: 8 users of tools/locustfile.py
against the lab gateway for 8 s, stopped by SIGTERM (tests/fixtures/locust/report-chat-8-users.json)."""

from __future__ import annotations

import http.server
import json
import sys
import threading
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


class _Chat(http.server.BaseHTTPRequestHandler):
    """The smallest chat-completions endpoint tools/locustfile.py accepts (a completion with one token)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"message": {"content": "GPUs."}}], "usage": {"completion_tokens": 1}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def test_the_load_client_waits_on_completed_requests_and_reports_them(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = load.Load(f"http://127.0.0.1:{server.server_address[1]}", tmp_path, users=2)
        seen = run.wait_requests(30)
        assert seen >= 32 and run.requests() >= seen  # the 2 of the start, then 30 more
        out = run.stop()
    finally:
        server.shutdown()
    assert out["requests"] >= seen and out["failed"] == 0 and out["failures"] == "", out
    with pytest.raises(RuntimeError, match="locust exited"):
        run.wait_requests(1)
