"""The one client of the gateway's control plane (module_utils/dflash_gateway/ctl.py: Gateway, opener), which both
smg-ctl (drain, add, remove: the dflash_gateway_worker module) and host_state's read of what the gateway routes to
(module_utils/dflash_state/health.gateway_workers) use.

A loopback HTTP server answers GET /workers the way smg 1.13.0 does (its `workers` list of {id, url, status,
is_healthy, ...}; the same answer read from the real gateway in tests/lab/test_engine_standin.py), 401 without the
key. An http_proxy in the environment (set for apt on some hosts) must not carry these loopback calls: the proxy
named here is a closed port, so a call through it fails.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "module_utils"))
from dflash_gateway import ctl  # noqa: E402
from dflash_state import health  # noqa: E402

KEY = "control-plane-key-for-this-test"
WORKERS = {"workers": [
    {"id": "2f0c", "url": "http://127.0.0.1:30001/", "model_id": "Qwen3.6-27B", "status": "ready", "is_healthy": True,
     "load": 0},
    {"id": "91aa", "url": "http://127.0.0.1:30002", "model_id": "Qwen3.6-27B", "status": "pending",
     "is_healthy": False, "load": 0}],
    "total": 2}


class Handler(BaseHTTPRequestHandler):
    answer: object = WORKERS

    def do_GET(self) -> None:  # http.server's name for the GET handler
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b"Unauthorized")
            return
        body = json.dumps(self.answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    proxy = f"http://127.0.0.1:{closed_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    key_file = tmp_path / ctl.CONTROL_KEY
    key_file.write_text(f"{KEY}\n")
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", key_file
    finally:
        server.shutdown()
        Handler.answer = WORKERS


def test_the_workers_are_read_past_an_environment_proxy_with_the_key(gateway: tuple[str, Path]) -> None:
    url, key_file = gateway
    rows = [{"url": "http://127.0.0.1:30001", "id": "2f0c", "status": "ready", "healthy": True},
            {"url": "http://127.0.0.1:30002", "id": "91aa", "status": "pending", "healthy": False}]
    assert ctl.Gateway(url, key_file, 3).workers() == rows
    assert ctl.Gateway(url, key_file, 3).worker("http://127.0.0.1:30001/") == rows[0]
    assert health.gateway_workers(url, str(key_file)) == {"asked": True, "url": url, "status": 200, "error": "",
                                                          "workers": rows}
    assert health.get(f"{url}/health")["status"] == 401  # the engine's /health look: past the proxy too


def test_no_key_a_wrong_answer_or_no_gateway_is_an_error_not_an_exception(gateway: tuple[str, Path],
                                                                          tmp_path: Path) -> None:
    url, key_file = gateway
    for missing in ("", str(tmp_path / "no-such-key")):
        refused = health.gateway_workers(url, missing)
        assert (refused["status"], refused["workers"]) == (401, []), refused
        assert refused["error"].startswith("GET /workers answered 401"), refused
    with pytest.raises(ctl.GatewayError) as raised:
        ctl.Gateway(url, None, 3).workers()
    assert raised.value.status == 401

    Handler.answer = {"workers": "not a list"}
    wrong = health.gateway_workers(url, str(key_file))
    assert (wrong["status"], wrong["workers"]) == (200, []) and "not a list" in wrong["error"], wrong

    down = health.gateway_workers(f"http://127.0.0.1:{closed_port()}", str(key_file), timeout=2)
    assert down["status"] is None and down["error"] and down["workers"] == [], down
