#!/usr/bin/env python3
"""Proxmox VE API STAND-IN for the lab: the endpoints the proxmox_guest role uses, over HTTPS with a lab CA,
backed by the lab's systemd-nspawn containers. It is a stand-in, never part of a production path: production
talks to the real Proxmox VE API of its node.

    python3 lab/pve/api.py --state-dir .cache/lab --listen 127.0.10.1 --port 8006

Response shapes follow pve-container/pve-manager ({"data": ...}, UPIDs for asynchronous tasks, task status
"stopped" with exitstatus "OK"). Container configs are the real files under <state>/pve/etc-pve/lxc (bind-mounted
at pve1:/etc/pve); a snapshot is a copy of the container's rootfs plus a [snapshot] section in its config, as real
Proxmox VE writes it. See lab/pve/README.md for every endpoint and what is simulated. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

LAB_DIR = Path(__file__).resolve().parent.parent
VERSION = {"version": "8.4.1", "release": "8.4", "repoid": "2a5fa54a8503f96d"}
DEFAULT_USER = "dflash@pve"
DEFAULT_TOKEN_ID = "deploy"
SERVICE_SEP = "="  # PVEAPIToken=USER@REALM!TOKENID=SECRET
# Options PUT .../config accepts (pve-container's json_config_properties); anything else, raw lxc.* keys
# included, fails parameter verification as it does on a real node.
CONFIG_KEYS = re.compile(
    r"^(arch|cmode|console|cores|cpulimit|cpuunits|debug|description|digest|delete|revert|entrypoint|env|features|"
    r"hookscript|hostname|lock|memory|nameserver|onboot|ostype|protection|rootfs|searchdomain|startup|swap|tags|"
    r"template|timezone|tty|unprivileged|(mp|net|unused|dev)\d+)$")
INTEGER_KEYS = {"cores", "cpuunits", "memory", "swap", "onboot", "protection", "template", "tty", "unprivileged",
                "console", "debug", "snaptime"}
SNAPNAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{1,39}$")
SECTION = re.compile(r"^\[([^\]]+)\]\s*$")
RAW = re.compile(r"^(lxc\.[a-z0-9_.-]+)(?::|\s*=)\s*(.*?)\s*$")
OPTION = re.compile(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$")


class ApiError(Exception):
    """An error answer: HTTP status, the reason phrase Proxmox VE puts in the status line, optional field errors."""

    def __init__(self, status: int, reason: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.errors = errors


def fail(message: str) -> ApiError:
    """A `die` inside a Proxmox VE API handler: HTTP 500 with the message as reason."""
    return ApiError(500, message)


# --------------------------------------------------------------------------- container configs


@dataclass
class Section:
    """One section of a container config: options (insertion order), raw lxc.* entries, description."""

    options: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] = field(default_factory=list)
    description: str = ""

    def copy(self) -> Section:
        return Section(dict(self.options), list(self.lxc), self.description)


@dataclass
class Conf:
    """/etc/pve/lxc/<vmid>.conf: the current config, a pending section and the snapshot sections."""

    main: Section
    snapshots: dict[str, Section]
    pending: Section | None = None


def encode_text(text: str) -> str:
    """PVE::Tools::encode_text: percent-encode ':' and everything outside printable ASCII (config comments)."""
    return "".join(chr(b) if 0x20 <= b <= 0x7e and b != 0x3a else f"%{b:02X}" for b in text.encode())


def decode_text(text: str) -> str:
    """PVE::Tools::decode_text."""
    return re.sub(r"%([0-9a-fA-F]{2})", lambda m: chr(int(m[1], 16)), text)


def parse_conf(text: str) -> Conf:
    """Parse a container config the way pve-container's parse_pct_config does (leniently)."""
    conf = Conf(main=Section(), snapshots={})
    current = conf.main
    for line in text.splitlines():
        if not line.strip():
            continue
        header = SECTION.match(line)
        if header:
            current = Section()
            if header[1].lower() == "pve:pending":
                conf.pending = current
            else:
                conf.snapshots[header[1]] = current
            continue
        if line.startswith("#"):
            current.description += decode_text(line[1:]) + "\n"
            continue
        raw = RAW.match(line)
        if raw:
            current.lxc.append((raw[1], raw[2]))
            continue
        option = OPTION.match(line)
        if option:
            if option[1] == "description":
                current.description += decode_text(option[2])
            else:
                current.options[option[1]] = option[2]
    return conf


def render_section(section: Section) -> str:
    """A section as write_pct_config writes it: description comments, sorted options, then raw lxc.* lines."""
    lines = section.description.rstrip("\n").split("\n") if section.description else []
    out = "".join(f"#{encode_text(line)}\n" for line in lines)
    out += "".join(f"{key}: {section.options[key]}\n" for key in sorted(section.options))
    return out + "".join(f"{key}: {value}\n" for key, value in section.lxc)


def render_conf(conf: Conf) -> str:
    text = render_section(conf.main)
    if conf.pending is not None:
        text += "\n[pve:pending]\n" + render_section(conf.pending)
    for name in sorted(conf.snapshots):
        text += f"\n[{name}]\n" + render_section(conf.snapshots[name])
    return text


def section_json(section: Section, digest: str | None = None) -> dict[str, Any]:
    """GET .../config: plain options (numbers where the schema says integer), raw keys as [[key, value], ...]."""
    data: dict[str, Any] = {}
    for key, value in section.options.items():
        data[key] = int(value) if key in INTEGER_KEYS and value.isdigit() else value
    if section.description:
        data["description"] = section.description
    if section.lxc:
        data["lxc"] = [[key, value] for key, value in section.lxc]
    if digest:
        data["digest"] = digest
    return data


# --------------------------------------------------------------------------- what the containers run on


class Backend(Protocol):
    """Where the containers live: power state, start/stop and the rootfs folder of a container name."""

    def known(self, name: str) -> bool: ...

    def running(self, name: str) -> bool: ...

    def uptime(self, name: str) -> int: ...

    def start(self, name: str, log: Callable[[str], None]) -> None: ...

    def stop(self, name: str, log: Callable[[str], None]) -> None: ...

    def rootfs(self, name: str) -> Path: ...


class LabBackend:
    """The lab's nspawn containers, driven through lab/labctl.py (the same code as `lab start/stop`)."""

    def __init__(self, state: Path) -> None:
        sys.path.insert(0, str(LAB_DIR))
        import labctl  # lab/labctl.py, standard library only

        self.labctl = labctl
        self.settings = dataclasses.replace(labctl.Settings.from_env(), state=state)
        self.paths = labctl.Paths(state)
        self.lock = threading.Lock()

    def guests(self) -> list[Any]:
        """The lab machines that stand in for LXC containers (not the node stand-in itself)."""
        return [c for c in self.labctl.CONTAINERS if not getattr(c, "is_node", False)]

    def container(self, name: str) -> Any:
        found = [c for c in self.guests() if c.name == name]
        if not found:
            raise fail(f"'{name}' is not a lab container ({', '.join(c.name for c in self.guests())})")
        return found[0]

    def known(self, name: str) -> bool:
        return any(c.name == name for c in self.guests())

    def running(self, name: str) -> bool:
        return self.known(name) and self.labctl.running_pid(self.paths, self.container(name)) is not None

    def uptime(self, name: str) -> int:
        pid = self.labctl.running_pid(self.paths, self.container(name)) if self.known(name) else None
        if pid is None:
            return 0
        with contextlib.suppress(OSError, ValueError, IndexError):
            started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
            since_boot = float(Path("/proc/uptime").read_text().split()[0])
            return max(0, int(since_boot - started / os.sysconf("SC_CLK_TCK")))
        return 0

    def _lab(self, action: str, name: str, log: Callable[[str], None]) -> None:
        lab = self.labctl.Lab(self.settings)
        out = io.StringIO()
        with self.lock, contextlib.redirect_stdout(out):
            try:
                getattr(lab, action)([name])
            except self.labctl.LabError as exc:
                raise fail(str(exc).splitlines()[0]) from exc
            finally:
                for line in out.getvalue().splitlines():
                    log(line)

    def start(self, name: str, log: Callable[[str], None]) -> None:
        self._lab("start", name, log)

    def stop(self, name: str, log: Callable[[str], None]) -> None:
        self._lab("stop", name, log)

    def rootfs(self, name: str) -> Path:
        return self.paths.machine(name)


# --------------------------------------------------------------------------- tasks


@dataclass
class Task:
    """A worker as Proxmox VE's fork_worker runs it: a UPID, a log, and an exit status when it stops."""

    upid: str
    node: str
    kind: str
    vmid: str
    user: str
    pid: int
    pstart: int
    starttime: int
    log: list[str] = field(default_factory=list)
    exitstatus: str | None = None

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = {"upid": self.upid, "node": self.node, "pid": self.pid, "pstart": self.pstart,
                                "starttime": self.starttime, "type": self.kind, "id": self.vmid,
                                "user": self.user.split("!")[0],
                                "status": "running" if self.exitstatus is None else "stopped"}
        if "!" in self.user:
            data["tokenid"] = self.user.split("!", 1)[1]
        if self.exitstatus is not None:
            data["exitstatus"] = self.exitstatus
        return data


class Tasks:
    """Runs each task in a thread, one at a time per container (the config lock of a real node)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.tasks: dict[str, Task] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.guard = threading.Lock()
        self.counter = 0

    def run(self, kind: str, vmid: str, user: str, work: Callable[[Callable[[str], None]], None]) -> str:
        with self.guard:
            self.counter += 1
            now = int(time.time())
            pid, pstart = os.getpid(), self.counter
            upid = f"UPID:{self.node}:{pid:08X}:{pstart:08X}:{now:08X}:{kind}:{vmid}:{user}:"
            task = Task(upid, self.node, kind, vmid, user, pid, pstart, now)
            self.tasks[upid] = task
            lock = self.locks.setdefault(vmid, threading.Lock())

        def body() -> None:
            with lock:
                try:
                    work(task.log.append)
                    task.log.append("TASK OK")
                    task.exitstatus = "OK"
                except Exception as exc:  # the task's error is its exit status, as on a real node
                    message = exc.reason if isinstance(exc, ApiError) else str(exc) or type(exc).__name__
                    task.log.append(f"TASK ERROR: {message}")
                    task.exitstatus = message

        threading.Thread(target=body, name=upid, daemon=True).start()
        return upid

    def get(self, upid: str) -> Task:
        task = self.tasks.get(upid)
        if task is None:
            raise fail(f"no such task '{upid}'")
        return task


# --------------------------------------------------------------------------- the API


@dataclass
class Token:
    """The one API token the stand-in accepts (the shape of `pveum user token add ... --output-format json`)."""

    full_tokenid: str
    value: str

    @classmethod
    def load_or_create(cls, path: Path) -> Token:
        if not path.exists():
            data = {"full-tokenid": f"{DEFAULT_USER}!{DEFAULT_TOKEN_ID}", "info": {"privsep": "0"},
                    "value": str(uuid.uuid4())}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            tmp.chmod(0o600)
            tmp.rename(path)
        data = json.loads(path.read_text())
        return cls(full_tokenid=data["full-tokenid"], value=data["value"])

    def user_of(self, header: str | None) -> str:
        """The authenticated 'user@realm!tokenid', or a 401 like a real node's."""
        if not header:
            raise ApiError(401, "No ticket")
        scheme, _, credentials = header.partition("=")
        tokenid, sep, secret = credentials.partition(SERVICE_SEP)
        if scheme.strip() != "PVEAPIToken" or not sep or tokenid != self.full_tokenid or secret != self.value:
            raise ApiError(401, "authentication failure")
        return tokenid


class Api:
    """Routes /api2/json/... to handlers; every handler returns the `data` of the answer."""

    def __init__(self, state: Path, node: str, backend: Backend) -> None:
        self.node = node
        self.backend = backend
        self.pve = state / "pve"
        self.conf_dir = self.pve / "etc-pve" / "lxc"
        self.snap_dir = self.pve / "snapshots"
        self.tasks = Tasks(node)
        self.conf_lock = threading.RLock()
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("GET", re.compile(r"/version"), self.version),
            ("GET", re.compile(r"/nodes"), self.nodes),
            ("GET", re.compile(r"/cluster/resources"), self.resources),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/lxc"), self.lxc_list),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/config"), self.config_get),
            ("PUT", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/config"), self.config_put),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/status/current"), self.status_current),
            ("POST", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/status/start"), self.start),
            ("POST", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/status/(?P<how>stop|shutdown)"),
             self.stop),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/snapshot"), self.snapshot_list),
            ("POST", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/snapshot"), self.snapshot_create),
            ("DELETE", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/snapshot/(?P<name>[^/]+)"),
             self.snapshot_delete),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/snapshot/(?P<name>[^/]+)/config"),
             self.snapshot_config),
            ("POST", re.compile(r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>\d+)/snapshot/(?P<name>[^/]+)/rollback"),
             self.rollback),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/status"), self.task_status),
            ("GET", re.compile(r"/nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/log"), self.task_log),
        ]

    def handle(self, method: str, path: str, params: dict[str, str], user: str) -> Any:
        for verb, pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match and verb == method:
                args = {k: unquote(v) for k, v in match.groupdict().items()}
                if "node" in args and args["node"] != self.node:
                    raise fail(f"hostname lookup '{args['node']}' failed - failed to get address info for: "
                               f"{args['node']}: Name or service not known")
                return handler(params=params, user=user, **{k: v for k, v in args.items() if k != "node"})
        raise ApiError(501, f"Method '{method} /api2/json{path}' not implemented")

    # ---- the cluster

    def version(self, **_: Any) -> dict[str, str]:
        return dict(VERSION)

    def node_entry(self) -> dict[str, Any]:
        return {"node": self.node, "id": f"node/{self.node}", "type": "node", "status": "online", "level": "",
                "maxcpu": os.cpu_count() or 1, "cpu": 0.01, "uptime": int(time.monotonic())}

    def nodes(self, **_: Any) -> list[dict[str, Any]]:
        return [self.node_entry()]

    def vmids(self) -> list[str]:
        if not self.conf_dir.is_dir():
            return []
        return sorted((p.stem for p in self.conf_dir.glob("*.conf") if p.stem.isdigit()), key=int)

    def vm_entry(self, vmid: str) -> dict[str, Any]:
        conf = self.load(vmid)[0]
        name = conf.main.options.get("hostname", f"CT{vmid}")
        running = self.backend.known(name) and self.backend.running(name)
        memory = int(conf.main.options.get("memory", "512") or 512)
        return {"vmid": int(vmid), "name": name, "type": "lxc", "status": "running" if running else "stopped",
                "maxmem": memory * 1024 * 1024, "maxswap": int(conf.main.options.get("swap", "0") or 0) * 1024 * 1024,
                "cpus": int(conf.main.options.get("cores", "1") or 1), "maxdisk": 0, "disk": 0, "mem": 0,
                "uptime": self.backend.uptime(name) if running else 0,
                "template": int(conf.main.options.get("template", "0") or 0)}

    def resources(self, params: dict[str, str], **_: Any) -> list[dict[str, Any]]:
        wanted = params.get("type")
        found: list[dict[str, Any]] = []
        if wanted in (None, "", "vm"):
            for vmid in self.vmids():
                entry = self.vm_entry(vmid)
                entry["maxcpu"] = entry.pop("cpus")
                found.append({"id": f"lxc/{vmid}", "node": self.node, **entry})
        if wanted in (None, "", "node"):
            found.append(self.node_entry())
        return found

    def lxc_list(self, **_: Any) -> list[dict[str, Any]]:
        return [self.vm_entry(vmid) for vmid in self.vmids()]

    # ---- configs

    def conf_path(self, vmid: str) -> Path:
        return self.conf_dir / f"{vmid}.conf"

    def load(self, vmid: str) -> tuple[Conf, str]:
        path = self.conf_path(vmid)
        try:
            raw = path.read_text()
        except FileNotFoundError:
            raise fail(f"Configuration file 'nodes/{self.node}/lxc/{vmid}.conf' does not exist") from None
        return parse_conf(raw), hashlib.sha1(raw.encode()).hexdigest()

    def save(self, vmid: str, conf: Conf) -> None:
        path = self.conf_path(vmid)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(render_conf(conf))
        tmp.replace(path)

    def name_of(self, vmid: str) -> str:
        name = self.load(vmid)[0].main.options.get("hostname", "")
        if not self.backend.known(name):
            raise fail(f"CT {vmid}: hostname '{name}' is not a container of this lab")
        return name

    def config_get(self, vmid: str, params: dict[str, str], **_: Any) -> dict[str, Any]:
        conf, digest = self.load(vmid)
        if params.get("snapshot"):
            if params.get("current") in ("1", "true"):
                raise ApiError(400, "Parameter verification failed.",
                               {"snapshot": "cannot use 'snapshot' parameter with 'current'",
                                "current": "cannot use 'snapshot' parameter with 'current'"})
            snap = conf.snapshots.get(params["snapshot"])
            if snap is None:
                raise fail(f"snapshot '{params['snapshot']}' does not exist")
            return section_json(snap, digest)
        return section_json(conf.main, digest)

    def config_put(self, vmid: str, params: dict[str, str], **_: Any) -> None:
        unknown = {k: "property is not defined in schema and the schema does not allow additional properties"
                   for k in params if not CONFIG_KEYS.match(k)}
        if unknown:
            raise ApiError(400, "Parameter verification failed.", unknown)
        with self.conf_lock:
            conf, digest = self.load(vmid)
            if params.get("digest") and params["digest"] != digest:
                raise fail("detected modified configuration - file changed by other user? Try again.")
            changes = {k: v for k, v in params.items() if k not in ("digest", "delete", "revert")}
            if not changes and not params.get("delete"):
                raise fail("no options specified")
            for key in re.split(r"[,;\s]+", params.get("delete", "").strip()):
                if key:
                    conf.main.options.pop(key, None)
            for key, value in changes.items():
                if key == "description":
                    conf.main.description = value
                else:
                    conf.main.options[key] = value
            self.save(vmid, conf)
        return None

    # ---- power

    def status_current(self, vmid: str, **_: Any) -> dict[str, Any]:
        entry = self.vm_entry(vmid)
        entry["ha"] = {"managed": 0}
        return entry

    def start(self, vmid: str, user: str, **_: Any) -> str:
        name = self.name_of(vmid)
        if self.backend.running(name):
            raise fail(f"CT {vmid} already running")
        return self.tasks.run("vzstart", vmid, user, lambda log: self.backend.start(name, log))

    def stop(self, vmid: str, user: str, how: str, **_: Any) -> str:
        name = self.name_of(vmid)
        if not self.backend.running(name):
            raise fail(f"CT {vmid} not running")
        kind = "vzstop" if how == "stop" else "vzshutdown"
        return self.tasks.run(kind, vmid, user, lambda log: self.backend.stop(name, log))

    # ---- snapshots

    def snapshot_list(self, vmid: str, **_: Any) -> list[dict[str, Any]]:
        conf, digest = self.load(vmid)
        found: list[dict[str, Any]] = []
        for name, snap in conf.snapshots.items():
            item: dict[str, Any] = {"name": name, "snaptime": int(snap.options.get("snaptime", "0") or 0),
                                    "description": snap.description.rstrip("\n")}
            if "parent" in snap.options:
                item["parent"] = snap.options["parent"]
            found.append(item)
        name = conf.main.options.get("hostname", "")
        current: dict[str, Any] = {"name": "current", "digest": digest,
                                   "running": int(self.backend.known(name) and self.backend.running(name))}
        if "parent" in conf.main.options:
            current["parent"] = conf.main.options["parent"]
        return [*found, current]

    def snapshot_create(self, vmid: str, params: dict[str, str], user: str, **_: Any) -> str:
        snapname = params.get("snapname", "")
        if not SNAPNAME.match(snapname):
            raise ApiError(400, "Parameter verification failed.",
                           {"snapname": f"invalid format - invalid configuration ID '{snapname}'"})
        if snapname in ("current", "vzdump"):
            raise fail(f"unable to use snapshot name '{snapname}' (reserved name)")
        name = self.name_of(vmid)
        if snapname in self.load(vmid)[0].snapshots:
            raise fail(f"snapshot name '{snapname}' already used")

        def work(log: Callable[[str], None]) -> None:
            target = self.snap_dir / vmid / snapname
            tmp = target.with_name(f".{snapname}.partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            log(f"copying rootfs {self.backend.rootfs(name)} (cp -a --reflink=auto)")
            copy_tree(self.backend.rootfs(name), tmp / "rootfs", live=self.backend.running(name))
            shutil.copy2(self.conf_path(vmid), tmp / f"{vmid}.conf")
            tmp.rename(target)
            with self.conf_lock:
                conf = self.load(vmid)[0]
                snap = conf.main.copy()
                snap.options["snaptime"] = str(int(time.time()))
                snap.description = params.get("description", "")
                conf.snapshots[snapname] = snap
                conf.main.options["parent"] = snapname
                self.save(vmid, conf)
            log(f"snapshot {snapname} of CT {vmid} created")

        return self.tasks.run("vzsnapshot", vmid, user, work)

    def snapshot_config(self, vmid: str, name: str, **_: Any) -> dict[str, Any]:
        conf = self.load(vmid)[0]
        if name not in conf.snapshots:
            raise fail(f"snapshot '{name}' does not exist")
        snap = conf.snapshots[name].copy()
        snap.lxc = []
        return section_json(snap)

    def snapshot_delete(self, vmid: str, name: str, user: str, **_: Any) -> str:
        if name not in self.load(vmid)[0].snapshots:
            raise fail(f"snapshot '{name}' does not exist")

        def work(log: Callable[[str], None]) -> None:
            with self.conf_lock:
                conf = self.load(vmid)[0]
                gone = conf.snapshots.pop(name)
                for section in [conf.main, *conf.snapshots.values()]:
                    if section.options.get("parent") == name:
                        if "parent" in gone.options:
                            section.options["parent"] = gone.options["parent"]
                        else:
                            section.options.pop("parent")
                self.save(vmid, conf)
            remove_tree(self.snap_dir / vmid / name)
            log(f"snapshot {name} of CT {vmid} deleted")

        return self.tasks.run("vzdelsnapshot", vmid, user, work)

    def rollback(self, vmid: str, name: str, params: dict[str, str], user: str, **_: Any) -> str:
        if name not in self.load(vmid)[0].snapshots:
            raise fail(f"snapshot '{name}' does not exist")
        ct = self.name_of(vmid)
        start = params.get("start", "0") in ("1", "true")

        def work(log: Callable[[str], None]) -> None:
            # A real node stops a running container (vm_stop with force) and leaves it stopped unless start=1.
            if self.backend.running(ct):
                log(f"stopping CT {vmid} for the rollback")
                self.backend.stop(ct, log)
            rootfs = self.backend.rootfs(ct)
            trash = self.pve / "trash" / f"{vmid}-{int(time.time() * 1000)}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            rootfs.rename(trash)
            log(f"restoring rootfs of CT {vmid} from snapshot {name}")
            try:
                copy_tree(self.snap_dir / vmid / name / "rootfs", rootfs)
            except Exception:
                remove_tree(rootfs)
                trash.rename(rootfs)
                raise
            remove_tree(trash)
            with self.conf_lock:
                conf = self.load(vmid)[0]
                restored = conf.snapshots[name].copy()
                restored.options.pop("snaptime", None)
                restored.description = conf.main.description
                restored.options["parent"] = name
                conf.main = restored
                self.save(vmid, conf)
            if start:
                log(f"starting CT {vmid}")
                self.backend.start(ct, log)

        return self.tasks.run("vzrollback", vmid, user, work)

    # ---- tasks

    def task_status(self, upid: str, **_: Any) -> dict[str, Any]:
        return self.tasks.get(upid).status()

    def task_log(self, upid: str, **_: Any) -> list[dict[str, Any]]:
        return [{"n": n, "t": line} for n, line in enumerate(self.tasks.get(upid).log, 1)]


def copy_tree(source: Path, target: Path, live: bool = False) -> None:
    """cp -a --reflink=auto: owners, modes, links and device nodes as they are.

    A running container's files may vanish while they are copied (lock and temporary files): with `live`,
    those errors alone do not fail the copy, which is then as consistent as a power cut (no storage snapshot).
    """
    if not source.is_dir():
        raise fail(f"expected the rootfs folder {source}, found none")
    proc = subprocess.run(["cp", "-a", "--reflink=auto", "--", str(source), str(target)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    errors = [line for line in proc.stderr.splitlines() if not (live and "No such file or directory" in line)]
    if proc.returncode != 0 and (errors or not proc.stderr.strip()):
        raise fail(f"cp -a {source} {target} failed: {' '.join(errors)[:300] or proc.returncode}")


def remove_tree(path: Path) -> None:
    """rm -rf that never crosses into a mount."""
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False, stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------- HTTPS


def ensure_tls(tls: Path, address: str, node: str) -> tuple[Path, Path, Path]:
    """A lab CA and a server certificate for IP:<address>, DNS:<node>, made with the openssl CLI when missing."""
    tls.mkdir(parents=True, exist_ok=True)
    tls.chmod(0o700)
    ca_key, ca_crt = tls / "ca.key", tls / "ca.crt"
    key, crt, ext = tls / "server.key", tls / "server.crt", tls / "server.ext"

    def openssl(*args: str) -> None:
        proc = subprocess.run(["openssl", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise SystemExit(f"pve stand-in: openssl {args[0]} failed: {proc.stderr.strip()}")

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    if not (ca_key.exists() and ca_crt.exists()):
        openssl("req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca_crt), "-days", "3650",
                "-subj", "/O=dflash lab/CN=dflash lab CA (Proxmox VE API stand-in)",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                "-addext", "subjectKeyIdentifier=hash")
        crt.unlink(missing_ok=True)
    wanted = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:{address},DNS:{node}\n"
              "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    if not (crt.exists() and key.exists() and ext.exists() and ext.read_text() == wanted):
        ext.write_text(wanted)
        csr = tls / "server.csr"
        openssl("req", "-new", *curve, "-keyout", str(key), "-out", str(csr), "-subj", f"/O=dflash lab/CN={node}")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-out", str(crt),
                "-days", "825", "-set_serial", f"0x{uuid.uuid4().hex}", "-extfile", str(ext))
        csr.unlink(missing_ok=True)
    for secret in (ca_key, key):
        secret.chmod(0o600)
    return crt, key, ca_crt


class Handler(BaseHTTPRequestHandler):
    """HTTP front: token check, parameters from the query (GET/DELETE) or the form body (POST/PUT), JSON out."""

    server: Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.serve("GET")

    def do_POST(self) -> None:
        self.serve("POST")

    def do_PUT(self) -> None:
        self.serve("PUT")

    def do_DELETE(self) -> None:
        self.serve("DELETE")

    def serve(self, method: str) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if body:
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                params.update({k: str(v) for k, v in json.loads(body).items()})
            else:
                params.update(dict(parse_qsl(body, keep_blank_values=True)))
        try:
            if not url.path.startswith("/api2/json/"):
                raise ApiError(501, f"Method '{method} {url.path}' not implemented")
            user = self.server.token.user_of(self.headers.get("Authorization"))
            data = self.server.api.handle(method, url.path[len("/api2/json"):].rstrip("/"), params, user)
            self.answer(200, "OK", {"data": data})
        except ApiError as exc:
            answer: dict[str, Any] = {"data": None}
            if exc.errors:
                answer["errors"] = exc.errors
            self.answer(exc.status, exc.reason, answer)
        except Exception as exc:  # an unexpected failure still answers like a node's 500, with the message
            self.answer(500, f"{type(exc).__name__}: {exc}", {"data": None})

    def answer(self, status: int, reason: str, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status, reason.replace("\n", " ")[:200] or HTTPStatus(status).phrase)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=0")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # BaseHTTPRequestHandler's signature
        sys.stderr.write(f"pve stand-in: {self.address_string()} {format % args}\n")


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with the API, its token and TLS."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], api: Api, token: Token, context: ssl.SSLContext) -> None:
        super().__init__(address, Handler)
        self.api = api
        self.token = token
        # The TLS handshake runs in the request's thread (finish_request), so a silent client blocks nobody.
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(60)
        try:
            request.do_handshake()
        except (ssl.SSLEOFError, ConnectionError):
            return  # a connect-and-close readiness probe, not a client
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"pve stand-in: {client_address[0]}: TLS handshake failed: {exc}\n")
            return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        sys.stderr.write(f"pve stand-in: {client_address[0]}: {sys.exc_info()[1]!r}\n")


def make_server(state: Path, address: str, port: int, node: str, backend: Backend) -> Server:
    """Everything the daemon needs: folders, token, TLS, the listening socket."""
    pve = state / "pve"
    (pve / "etc-pve" / "lxc").mkdir(parents=True, exist_ok=True)
    token = Token.load_or_create(pve / "api-token.json")
    crt, key, _ = ensure_tls(pve / "tls", address, node)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(crt, key)
    return Server((address, port), Api(state, node, backend), token, context)


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM ends serve_forever like Ctrl-C: the socket is closed and the exit status is 0."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Proxmox VE API stand-in for the lab (see lab/pve/README.md)")
    parser.add_argument("--state-dir", required=True, type=Path, help="the lab's state folder (.cache/lab)")
    parser.add_argument("--listen", default="127.0.10.1", help="address to listen on (the lab node's address)")
    parser.add_argument("--port", type=int, default=8006, help="port (8006 as on a real node; 0 picks a free one)")
    parser.add_argument("--node", default="pve1", help="the node name the API answers for")
    args = parser.parse_args(argv)
    state = args.state_dir.resolve()
    try:
        server = make_server(state, args.listen, args.port, args.node, LabBackend(state))
    except OSError as exc:
        print(f"pve stand-in: cannot listen on {args.listen}:{args.port} ({exc.strerror or exc}); is another "
              "stand-in running, or is the address missing?", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    host, port = server.server_address[:2]
    print(f"pve stand-in: listening on https://{host}:{port}/api2/json (node {args.node}, state {state}, "
          f"CA {state / 'pve' / 'tls' / 'ca.crt'})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
