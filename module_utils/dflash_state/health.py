"""A quick look at a local HTTP endpoint (the engine's /health): status and time, never a generation."""

from __future__ import annotations

import http.client
import time
import urllib.error
from pathlib import Path
from typing import Any

try:  # the tests' import path (module_utils on sys.path), then AnsiballZ's
    from dflash_gateway import ctl
except ImportError:
    from ansible.module_utils.dflash_gateway import ctl  # type: ignore[no-redef]


def get(url: str, timeout: float = 3.0) -> dict[str, Any]:
    """{url, status (HTTP code, or None when nothing answered), error, elapsed_s}."""
    start = time.monotonic()
    opener = ctl.opener(url)
    try:
        with opener.open(url, timeout=timeout) as response:
            status: int | None = response.status
            error = ""
    except urllib.error.HTTPError as exc:
        status, error = exc.code, str(exc.reason)
    except (urllib.error.URLError, OSError) as exc:
        status, error = None, str(getattr(exc, "reason", exc))
    except http.client.HTTPException as exc:  # another protocol on the port (HTTP to a TLS listener): not an answer
        status, error = None, f"{type(exc).__name__}: not an HTTP answer"
    return {"url": url, "status": status, "error": error, "elapsed_s": round(time.monotonic() - start, 3)}


def gateway_workers(url: str, key_file: str, timeout: float = 3.0) -> dict[str, Any]:
    """What the gateway on this host routes to: its GET /workers (ctl.Gateway, the one client of the gateway's
    control plane) with the control-plane key read here (root only), so the key never leaves the host.
    {asked, url, status, error, workers: [{url, id, status, healthy}]}; an answer that is not a list of workers, or
    none, is an error, not an exception."""
    out: dict[str, Any] = {"asked": True, "url": url, "status": None, "error": "", "workers": []}
    gateway = ctl.Gateway(url, Path(key_file) if key_file else None, timeout)
    try:
        out["workers"] = gateway.workers()
        out["status"] = 200
    except ctl.GatewayError as exc:
        out["status"], out["error"] = exc.status, str(exc)
    except (urllib.error.URLError, OSError) as exc:
        out["error"] = str(getattr(exc, "reason", exc))
    except http.client.HTTPException as exc:
        out["error"] = f"{type(exc).__name__}: not an HTTP answer"
    return out
