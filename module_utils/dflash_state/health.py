"""A quick look at a local HTTP endpoint (the engine's /health): status and time, never a generation."""

from __future__ import annotations

import http.client
import ipaddress
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def loopback_tls(url: str) -> ssl.SSLContext | None:
    """The TLS context for the host's own HTTPS endpoint on a loopback address (the gateway serving the team's
    certificate, whose names are the endpoint's, not 127.0.0.1): encrypted, not authenticated, which on loopback
    only the host itself can answer. None for plain HTTP; a non-loopback HTTPS URL gets Python's verified default."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return None
    try:
        loopback = ipaddress.ip_address(str(parts.hostname)).is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    if not loopback:
        return ssl.create_default_context()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def local_opener(url: str) -> urllib.request.OpenerDirector:
    """An opener for the host's own endpoints: never through a proxy, HTTPS on loopback as loopback_tls says."""
    handlers: list[Any] = [urllib.request.ProxyHandler({})]
    context = loopback_tls(url)
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def get(url: str, timeout: float = 3.0) -> dict[str, Any]:
    """{url, status (HTTP code, or None when nothing answered), error, elapsed_s}."""
    start = time.monotonic()
    opener = local_opener(url)
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
    """What the gateway on this host routes to: its GET /workers with the control-plane key read here (root only), so
    the key never leaves the host. {asked, url, status, error, workers: [{url, id, status, healthy}]}."""
    out: dict[str, Any] = {"asked": True, "url": url, "status": None, "error": "", "workers": []}
    key = ""
    try:
        with open(key_file or "", encoding="utf-8") as fh:
            key = fh.read().strip()
    except OSError:  # no key file: asked without a key, which a gateway with one answers 401
        pass
    request = urllib.request.Request(url.rstrip("/") + "/workers")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with local_opener(url).open(request, timeout=timeout) as response:
            out["status"] = response.status
            body = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        out["status"], out["error"] = exc.code, str(exc.reason)
        return out
    except (urllib.error.URLError, OSError) as exc:
        out["error"] = str(getattr(exc, "reason", exc))
        return out
    except (http.client.HTTPException, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: not a JSON answer"
        return out
    workers = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(workers, list):
        out["error"] = f"expected a workers list, found {str(body)[:200]}"
        return out
    out["workers"] = [{"url": str(w.get("url") or "").rstrip("/"), "id": w.get("id"), "status": w.get("status"),
                       "healthy": w.get("is_healthy")} for w in workers if isinstance(w, dict)]
    return out
