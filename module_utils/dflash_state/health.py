"""A quick look at a local HTTP endpoint (the engine's /health): status and time, never a generation."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any


def get(url: str, timeout: float = 3.0) -> dict[str, Any]:
    """{url, status (HTTP code, or None when nothing answered), error, elapsed_s}."""
    start = time.monotonic()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the host's own endpoints, never a proxy
    try:
        with opener.open(url, timeout=timeout) as response:
            status: int | None = response.status
            error = ""
    except urllib.error.HTTPError as exc:
        status, error = exc.code, str(exc.reason)
    except (urllib.error.URLError, OSError) as exc:
        status, error = None, str(getattr(exc, "reason", exc))
    return {"url": url, "status": status, "error": error, "elapsed_s": round(time.monotonic() - start, 3)}
