#!/usr/bin/env python3
"""The SGLang Model Gateway's control plane, from the host it runs on: the smg_gateway role installs this file as
smg-ctl (roles/smg_gateway/files/smg-ctl is a link to it), and the dflash_gateway_worker module runs its drain, add and
remove (this file is that module's module_utils).

Reads the control-plane key from the gateway's credentials folder (root only), so the key never travels to the
controller, never enters a command line and is never printed. Every subcommand prints one JSON object and exits 0
when it did what it says (ready: the gateway serves and every expected worker is ready), 1 otherwise (2: usage).

  smg-ctl --url http://127.0.0.1:30000 --credentials /etc/dflash-infra/smg-gateway ready --workers URL...
  smg-ctl ... workers                  # the gateway's workers: url, id, status, healthy
  smg-ctl ... drain --worker URL [--env-file F]  # take a worker out (DELETE /workers/{id}: no new requests; smg
                                       # removes it after its drain settle time), then wait until the engine
                                       # itself has no request running or waiting (its /v1/loads, with the key of
                                       # F), so that a restart cuts no generation short
  smg-ctl ... --key-file K drain|add --worker URL  # a worker of another host: its key from K (the endpoint's)
  smg-ctl ... add --worker URL [--env-file F]  # put a worker back (POST /workers, with the API key of the
                                       # engine's environment file F) and wait until it is ready
  smg-ctl ... remove --worker URL      # a worker the plan no longer has: DELETE /workers/{id}, wait until it is gone
  smg-ctl --credentials DIR init-key   # make the control-plane key once (kept when it exists)
  smg-ctl --credentials DIR verify-unit FILE NAME  # systemd-analyze verify FILE under its unit NAME
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONTROL_KEY = "control-plane-key"


def tls_context(url: str) -> ssl.SSLContext | None:
    """The TLS context for this host's own HTTPS endpoint on a loopback address (the gateway serving the team's
    certificate, whose names are the endpoint's, not 127.0.0.1): encrypted, not checked against the certificate's
    names, which on loopback only the host itself can answer. None for plain HTTP; an HTTPS URL elsewhere gets
    Python's verified default."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return None
    context = ssl.create_default_context()
    try:
        loopback = ipaddress.ip_address(str(parts.hostname)).is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    if loopback:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def opener(url: str, context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener for the endpoints this host reaches directly (its gateway, engines, a replica of another host):
    never through a proxy of the environment (an http_proxy set for apt would otherwise carry them), HTTPS with
    `context`, else as tls_context says."""
    handlers: list[Any] = [urllib.request.ProxyHandler({})]
    context = context or tls_context(url)
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


class Gateway:
    """The gateway's control plane, with the control-plane key of `key_file` (the credentials folder's
    control-plane-key); no file, or one that cannot be read, is no key (a gateway that wants one answers 401)."""

    def __init__(self, url: str, key_file: Path | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.opener = opener(self.url)
        self.timeout = timeout
        try:
            self.key = key_file.read_text().strip() if key_file is not None else ""
        except OSError:
            self.key = ""

    def call(self, method: str, path: str, body: Any = None, auth: bool = True) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth and self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text.strip()[:300]

    def workers(self) -> list[dict[str, Any]]:
        """GET /workers: [{url, id, status, healthy}]; GatewayError for any other answer."""
        status, body = self.call("GET", "/workers")
        workers = body.get("workers") if status == 200 and isinstance(body, dict) else None
        if not isinstance(workers, list):
            raise GatewayError(f"GET /workers answered {status}: {str(body)[:200]}", status)
        return [{"url": str(w.get("url") or "").rstrip("/"), "id": w.get("id"), "status": w.get("status"),
                 "healthy": w.get("is_healthy")} for w in workers if isinstance(w, dict)]

    def worker(self, url: str) -> dict[str, Any] | None:
        return next((w for w in self.workers() if w["url"] == url.rstrip("/")), None)


class GatewayError(RuntimeError):
    """The gateway answered, but not what was asked (`status`: its HTTP status)."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.status = status


def ready(gw: Gateway, args: argparse.Namespace) -> dict[str, Any]:
    """One look: /health, then every expected worker listed, ready and healthy."""
    try:
        status, body = gw.call("GET", "/health", auth=False)
    except (OSError, http.client.HTTPException) as exc:  # not up yet, or another protocol on the port (TLS vs HTTP)
        return {"state": "waiting", "gate": "health", "detail": f"{gw.url}/health: {exc!r}"}
    if status != 200:
        return {"state": "waiting", "gate": "health", "detail": f"{gw.url}/health answered {status}: {body}"}
    try:
        seen = {w["url"]: w for w in gw.workers()}
    except (OSError, GatewayError) as exc:
        return {"state": "waiting", "gate": "workers", "detail": str(exc)}
    expected = [u.rstrip("/") for u in args.workers]
    missing = [u for u in expected if u not in seen]
    unready = [f"{u} {seen[u]['status']}" for u in expected if u in seen and
               (seen[u]["status"] != "ready" or not seen[u]["healthy"])]
    extra = sorted(set(seen) - set(expected))
    if missing or unready:
        return {"state": "waiting", "gate": "workers", "workers": list(seen.values()),
                "detail": "; ".join(filter(None, [f"not registered: {', '.join(missing)}" if missing else "",
                                                  f"not ready: {', '.join(unready)}" if unready else ""]))}
    also = f"; also: {', '.join(extra)}" if extra else ""
    return {"state": "ready", "gate": "workers", "workers": list(seen.values()),
            "detail": f"/health 200; {len(expected)} worker(s) ready{also}"}


def wait(what: str, deadline: float, step: float, look: Any) -> dict[str, Any]:
    while True:
        out: dict[str, Any] = look()
        if out["state"] != "waiting" or time.monotonic() >= deadline:
            if out["state"] == "waiting":
                out = {**out, "state": "failed", "detail": f"{what}: still waiting at the deadline: {out['detail']}"}
            return out
        time.sleep(step)


def worker_context(url: str, credentials: Path | None) -> ssl.SSLContext | None:
    """A replica of another host over HTTPS: verified against the team's CA of the gateway's credentials (tls-ca)."""
    if urllib.parse.urlsplit(url).scheme != "https":
        return None
    ca = credentials / "tls-ca" if credentials is not None else None
    return ssl.create_default_context(cafile=str(ca)) if ca is not None and ca.is_file() else tls_context(url)


def engine_load(url: str, key: str, timeout: float, credentials: Path | None = None) -> dict[str, Any]:
    """One look at the engine's own queue: SGLang's GET /v1/loads?include=core (0.5.19 and 0.5.23), whose scheduler
    publishes its load at once when it goes idle. An engine that does not answer has nothing in flight."""
    request = urllib.request.Request(url.rstrip("/") + "/v1/loads?include=core")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with opener(url, worker_context(url, credentials)).open(request, timeout=timeout) as response:
            body = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        if exc.code == 401 and not key:
            return {"state": "failed", "detail": f"{url}/v1/loads answered 401: the engine wants its API key "
                                                 "(--env-file, its environment file)"}
        if exc.code == 401:
            return {"state": "failed", "detail": f"{url}/v1/loads refused the key of its environment file: the running "
                                                 "engine holds another (the file changed since it started). It is out "
                                                 "of the gateway; re-run the deploy, which restarts and adds it back"}
        return {"state": "failed", "detail": f"{url}/v1/loads answered {exc.code}"}
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return {"state": "done", "detail": f"the engine does not answer ({exc!r}): nothing in flight"}
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list):
        return {"state": "failed", "detail": f"{url}/v1/loads: expected a loads list, found {str(body)[:200]}"}
    busy = sum(int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0)) for load in loads)
    if busy:
        return {"state": "waiting", "detail": f"{url} still has {busy} request(s) running or waiting"}
    return {"state": "done", "detail": "the engine has no request running or waiting"}


def drain(gw: Gateway, args: argparse.Namespace) -> dict[str, Any]:
    """Remove the worker (DELETE /workers/{id}: the gateway sends it no new request and removes it after its drain
    settle time), then wait until the engine has finished what it was given (its /v1/loads)."""
    deadline = time.monotonic() + args.wait
    key = worker_key(args)
    out = remove(gw, args, "drain", deadline)
    if out["state"] != "done" or not out["changed"]:  # not a worker, refused, or still listed at the deadline
        return out
    out = wait("drain", deadline, args.step, lambda: engine_load(args.worker, key, gw.timeout, args.credentials))
    return {**out, "changed": True, "detail": (f"{args.worker} drained and removed; {out['detail']}"
                                               if out["state"] == "done" else out["detail"])}


def remove(gw: Gateway, args: argparse.Namespace, what: str = "remove",
           deadline: float | None = None) -> dict[str, Any]:
    """DELETE /workers/{id} and wait until the gateway lists the worker no more (its in-flight requests finish within
    the gateway's drain settle time). Alone, for a worker the plan no longer has: the engine is not this deploy's to
    wait on; drain waits on it after."""
    found = gw.worker(args.worker)
    if found is None:
        return {"state": "done", "changed": False, "detail": f"{args.worker} is not a worker of {gw.url}"}
    status, body = gw.call("DELETE", f"/workers/{found['id']}")
    if status not in (200, 202):
        return {"state": "failed", "changed": False,
                "detail": f"DELETE /workers/{found['id']} answered {status}: {body}"}

    def gone() -> dict[str, Any]:
        now = gw.worker(args.worker)
        return ({"state": "done", "detail": f"{args.worker} removed from {gw.url}"} if now is None else
                {"state": "waiting", "detail": f"{args.worker} is {now['status']}"})
    limit = deadline if deadline is not None else time.monotonic() + args.wait
    return {**wait(what, limit, args.step, gone), "changed": True}


def add(gw: Gateway, args: argparse.Namespace) -> dict[str, Any]:
    """POST /workers {url} (when it is not one yet), then wait until the gateway says it is ready and healthy. A 409
    WORKER_CREATE_IN_PROGRESS (the gateway is already adding that URL: the workers of its own command line at its
    start, until each answers) or WORKER_ALREADY_EXISTS is the same wait, with nothing changed by this call."""
    changed = False
    if gw.worker(args.worker) is None:
        key = worker_key(args)
        status, body = gw.call("POST", "/workers",
                               {"url": args.worker.rstrip("/"), **({"api_key": key} if key else {})})
        code = body.get("code") if isinstance(body, dict) else None
        being_added = status == 409 and code in ("WORKER_CREATE_IN_PROGRESS", "WORKER_ALREADY_EXISTS")
        if not being_added and status not in (200, 201, 202):
            return {"state": "failed", "changed": False, "detail": f"POST /workers answered {status}: {body}"}
        changed = not being_added

    def up() -> dict[str, Any]:
        now = gw.worker(args.worker)
        if now and now["status"] == "ready" and now["healthy"]:
            return {"state": "done", "changed": changed, "detail": f"{args.worker} is ready behind {gw.url}"}
        return {"state": "waiting", "detail": f"{args.worker} is {now['status'] if now else 'not listed yet'}"}
    return wait("add", time.monotonic() + args.wait, args.step, up)


def worker_key(args: argparse.Namespace) -> str:
    """The worker's API key: from --key-file (a worker of another host: the endpoint's key, from the gateway's
    credentials), else from its --env-file; empty when neither has one."""
    if args.key_file is not None:
        return args.key_file.read_text().strip() if args.key_file.exists() else ""
    return env_file_key(args.env_file) if args.env_file else ""


def env_file_key(path: Path) -> str:
    """The engine's API key from its environment file (SGLANG_API_KEY=..., root only), empty when it has none: smg
    sends a worker the key it was added with, and one added without a key gets none."""
    if not path.exists():
        return ""
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "SGLANG_API_KEY":
            return value.strip()
    return ""


def listed(gw: Gateway, args: argparse.Namespace) -> dict[str, Any]:
    return {"state": "done", "workers": gw.workers()}


def init_key(credentials: Path) -> dict[str, Any]:
    path = credentials / CONTROL_KEY
    credentials.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return {"state": "done", "changed": False, "detail": f"{path} exists; kept"}
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")
    return {"state": "done", "changed": True, "detail": f"{path} made (32 random bytes)"}


def verify_unit(rendered: Path, name: str) -> int:
    """systemd-analyze verify needs the file under its unit name; Ansible validates a temporary file."""
    with tempfile.TemporaryDirectory() as folder:
        shutil.copyfile(rendered, Path(folder) / name)
        return subprocess.run(["systemd-analyze", "verify", "--man=no", str(Path(folder) / name)]).returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="smg-ctl", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--credentials", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP call")
    parser.add_argument("--key-file", type=Path, help="the workers' API key (drain, add) from this file instead of "
                        "--env-file: for workers on another host, whose environment files are there")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ready").add_argument("--workers", nargs="+", default=[])
    sub.add_parser("workers")
    for name in ("drain", "add", "remove"):
        one = sub.add_parser(name)
        one.add_argument("--worker", required=True)
        one.add_argument("--wait", type=float, default=120.0, help="seconds until it gives up")
        one.add_argument("--step", type=float, default=0.5)
        one.add_argument("--env-file", type=Path, help="the engine's environment file: its API key (add: goes with "
                         "it to the gateway; drain: reads the engine's /v1/loads)")
    sub.add_parser("init-key")
    verify = sub.add_parser("verify-unit")
    verify.add_argument("file", type=Path)
    verify.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "verify-unit":
        return verify_unit(args.file, args.name)
    if args.command == "init-key":
        out = init_key(args.credentials)
    else:
        gw = Gateway(args.url, args.credentials / CONTROL_KEY, args.timeout)
        commands: dict[str, Callable[[Gateway, argparse.Namespace], dict[str, Any]]] = {
            "ready": ready, "drain": drain, "add": add, "remove": remove, "workers": listed}
        try:
            out = commands[args.command](gw, args)
        except (OSError, GatewayError) as exc:
            out = {"state": "failed", "detail": str(exc)}
    print(json.dumps(out, sort_keys=True))
    return 0 if out["state"] in ("ready", "done") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
