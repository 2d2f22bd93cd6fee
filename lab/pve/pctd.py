#!/usr/bin/env python3
"""pct daemon of the lab's Proxmox node STAND-IN (pve1); lab only, never used against production.

The `pct` stand-in inside pve1 (lab/pve/pct) connects to this daemon's unix socket, hands over
its stdin/stdout/stderr file descriptors (SCM_RIGHTS) and its argument vector, environment and
working directory. For `pct exec VMID -- CMD...` the daemon enters the lab container that plays
that Proxmox id (nsenter into all namespaces of the container's PID 1) and runs CMD there with
the received descriptors, so bytes stream end to end as with lxc-attach; then it sends back the
exit status. `pct status`, `pct list` and `pct config` read the node's /etc/pve
(<state>/pve/etc-pve). Messages and behaviour follow Proxmox VE 8's pct (PVE/CLI/pct.pm).

    lab/pve/pctd.py --state-dir <lab state folder>    # foreground; `lab up` starts it in the background

Standard library only; runs as root on the lab host.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import labctl  # lab/labctl.py: machine table, state paths, container leaders

MAGIC = b"PCT1"
HEADER = struct.Struct(">4sI")  # magic, length of the JSON request that follows
MAX_REQUEST = 16 * 1024 * 1024
NODE_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # pct's own PATH (PVE::CLIHandler), kept by --keep-env
DEFAULT_CT_PATH = labctl.CONTAINER_PATH      # lxc-attach --clear-env's PATH
DIE = 255                                    # exit status of Perl's die (errno unset)
GRACE_SECONDS = 2.0

Resolver = Callable[[int], "int | None"]


@dataclass
class Request:
    """One pct invocation as the client sent it."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]


@dataclass
class Outcome:
    """What the daemon answers: the exit status and, for the log, what ran."""

    status: int
    what: str
    detail: list[str] = field(default_factory=list)


class PctError(Exception):
    """A pct failure: the message pct prints and its exit status."""

    def __init__(self, message: str, status: int = DIE) -> None:
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------- pure helpers


def parse_vmid(text: str) -> int:
    """A Proxmox guest id (pve-vmid: 100..999999999), with pct's parameter error otherwise."""
    if not re.fullmatch(r"[0-9]+", text or ""):
        raise PctError(f"400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{text}'")
    vmid = int(text)
    if not 100 <= vmid <= 999_999_999:
        raise PctError("400 Parameter verification failed.\nvmid: invalid format - value does not look like a "
                       "valid VM ID")
    return vmid


def parse_bool(text: str) -> bool:
    """A Proxmox boolean parameter value."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise PctError(f"400 Parameter verification failed.\nkeep-env: type check ('boolean') failed - got '{text}'")


def split_exec_args(args: Sequence[str]) -> tuple[bool, list[str]]:
    """`[--keep-env <bool>] [--] CMD...` -> (keep_env, command); keep-env defaults to 1 as in PVE 8."""
    keep_env = True
    rest = list(args)
    while rest:
        token = rest[0]
        if token == "--":
            return keep_env, rest[1:]
        if token.startswith("--keep-env=") or token.startswith("-keep-env="):
            keep_env = parse_bool(token.split("=", 1)[1])
            rest = rest[1:]
        elif token in ("--keep-env", "-keep-env"):
            if len(rest) < 2:
                raise PctError("400 unable to parse option\nkeep-env: missing value")
            keep_env = parse_bool(rest[1])
            rest = rest[2:]
        elif token.startswith("-"):
            raise PctError(f"400 unable to parse option\n{token.lstrip('-')}: property is not defined in schema "
                           "and the schema does not allow additional properties")
        else:
            return keep_env, rest
    return keep_env, []


def exec_environment(client_env: dict[str, str], keep_env: bool) -> dict[str, str]:
    """The command's environment: the node session's (pct's PATH, no SSL_CERT_*) or lxc-attach's clean one."""
    if not keep_env:
        return {"PATH": DEFAULT_CT_PATH, "container": "lxc"}
    env = {k: v for k, v in client_env.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    env["PATH"] = NODE_PATH
    return env


def decode_text(text: str) -> str:
    """Proxmox's decode_text (percent-decoding of config comments)."""
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def parse_config(text: str) -> tuple[dict[str, str], list[tuple[str, str]], str]:
    """Main section of a Proxmox LXC config: (options, raw lxc.* lines in order, description)."""
    options: dict[str, str] = {}
    lxc: list[tuple[str, str]] = []
    description = ""
    for line in text.splitlines():
        if line.startswith("["):
            break  # snapshot or pending sections follow
        if line.startswith("#"):
            description += decode_text(line[1:]) + "\n"
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            continue
        if key.startswith("lxc."):
            lxc.append((key.strip(), value.strip()))
        else:
            options[key.strip()] = value.strip()
    return options, lxc, description


def format_config(text: str) -> str:
    """`pct config` output: options sorted by key (no digest), the description encoded, then lxc.* lines."""
    options, lxc, description = parse_config(text)
    if description:
        options["description"] = labctl.encode_text(description)
    lines = [f"{key}: {value}" for key, value in sorted(options.items()) if key != "digest"]
    lines += [f"{key}: {value}" for key, value in lxc]
    return "".join(f"{line}\n" for line in lines)


def format_list(rows: Sequence[tuple[int, str, str, str]]) -> str:
    """`pct list` output: (vmid, status, lock, name) rows sorted by id; nothing at all when empty."""
    if not rows:
        return ""
    fmt = "{:<10} {:<10} {:<12} {:<20}\n"
    out = fmt.format("VMID", "Status", "Lock", "Name")
    for vmid, status, lock, name in sorted(rows):
        out += fmt.format(vmid, status, lock, name)
    return out


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it (128 + N for a signal)."""
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------- the node


@dataclass
class Node:
    """The node stand-in's view: its /etc/pve and how a Proxmox id maps to a running lab container."""

    etc_pve: Path
    name: str
    resolve: Resolver  # vmid -> PID 1 of the running container (host pid), None when stopped
    nsenter: str = "nsenter"

    def conf_path(self, vmid: int) -> Path:
        return self.etc_pve / "nodes" / self.name / "lxc" / f"{vmid}.conf"

    def load_config(self, vmid: int) -> str:
        """The config text, or pct's error for a guest that is not on this node."""
        try:
            return self.conf_path(vmid).read_text()
        except (FileNotFoundError, NotADirectoryError):
            raise PctError(f"Configuration file 'nodes/{self.name}/lxc/{vmid}.conf' does not exist") from None

    def vmids(self) -> list[int]:
        folder = self.etc_pve / "nodes" / self.name / "lxc"
        return sorted(int(p.stem) for p in folder.glob("*.conf") if p.stem.isdigit()) if folder.is_dir() else []

    def status(self, vmid: int) -> str:
        return "running" if self.resolve(vmid) else "stopped"

    def exec_argv(self, leader: int, cwd: str, command: Sequence[str]) -> list[str]:
        """nsenter into every namespace and the root of the container's PID 1, in the caller's cwd when the
        container has it (else /), like lxc-attach.

        nsenter opens --wd before it enters the mount namespace, so the folder is named through
        /proc/<leader>/root: a path inside the container's own tree.
        """
        root = Path(f"/proc/{leader}/root")
        inside = root / cwd.lstrip("/")
        workdir = inside if cwd.startswith("/") and ".." not in Path(cwd).parts and inside.is_dir() else root
        return [self.nsenter, "-t", str(leader), "-a", "-r", f"--wd={workdir}", "--", *command]


def default_resolver(paths: labctl.Paths) -> Resolver:
    """vmid -> the lab container's PID 1 (labctl.running_pid + container_leader), cached while it lives."""
    by_vmid = {c.vmid: c for c in labctl.guests()}
    cache: dict[int, tuple[int, int]] = {}
    lock = threading.Lock()

    def resolve(vmid: int) -> int | None:
        c = by_vmid.get(vmid)
        if c is None:
            return None
        with lock:
            cached = cache.get(vmid)
            if cached and labctl.is_alive(cached[0]) and labctl.is_alive(cached[1]) \
                    and labctl.ns_pids(cached[1])[-1:] == [1]:
                return cached[1]
            pid = labctl.running_pid(paths, c)
            leader = labctl.container_leader(pid) if pid else None
            if pid and leader:
                cache[vmid] = (pid, leader)
            else:
                cache.pop(vmid, None)
            return leader

    return resolve


# --------------------------------------------------------------------------- commands


def write_fd(fd: int, text: str) -> None:
    """Write all of text to a received descriptor (ignoring a reader that went away)."""
    data = text.encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def run_exec(node: Node, req: Request, args: Sequence[str], conn: socket.socket) -> Outcome:
    """`pct exec VMID [--keep-env B] -- CMD...`: run CMD in the container with the client's descriptors."""
    if not args:
        raise PctError("400 not enough arguments\npct exec <vmid> [<extra-args>] [OPTIONS]")
    vmid = parse_vmid(args[0])
    node.load_config(vmid)
    leader = node.resolve(vmid)
    if leader is None:
        raise PctError(f"container '{vmid}' not running!")
    keep_env, command = split_exec_args(args[1:])
    if not command:
        raise PctError("missing command")
    argv = node.exec_argv(leader, req.cwd, command)
    proc = subprocess.Popen(argv, stdin=req.fds[0], stdout=req.fds[1], stderr=req.fds[2],
                            env=exec_environment(req.env, keep_env), start_new_session=True, close_fds=True)
    for fd in req.fds:  # the child has them now; ours would hold the client's pipes open
        os.close(fd)
    req.fds = []
    status = wait_or_hang_up(proc, conn)
    return Outcome(status=status, what=f"exec {vmid}", detail=command)


def wait_or_hang_up(proc: subprocess.Popen[bytes], conn: socket.socket) -> int:
    """Wait for the command; if the client goes away first, hang up its process group (then kill it)."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(conn.fileno(), select.POLLIN | select.POLLHUP)
        while proc.poll() is None:
            events = dict(poller.poll())
            if conn.fileno() in events and pidfd not in events:
                hang_up(proc)
                break
        return exit_status(proc.wait())
    finally:
        os.close(pidfd)


def hang_up(proc: subprocess.Popen[bytes]) -> None:
    """SIGHUP to the command's process group, SIGKILL after a grace period (the client disconnected)."""
    for sig in (signal.SIGHUP, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue


def run_status(node: Node, req: Request, args: Sequence[str]) -> Outcome:
    """`pct status VMID`: status: running|stopped."""
    if not args:
        raise PctError("400 not enough arguments\npct status <vmid> [OPTIONS]")
    vmid = parse_vmid(args[0])
    node.load_config(vmid)
    status = node.status(vmid)
    write_fd(req.fds[1], f"status: {status}\n")
    return Outcome(status=0, what=f"status {vmid}", detail=[status])


def run_list(node: Node, req: Request, args: Sequence[str]) -> Outcome:
    """`pct list`: every container of this node with its status, lock and name."""
    rows = []
    for vmid in node.vmids():
        options, _, _ = parse_config(node.load_config(vmid))
        rows.append((vmid, node.status(vmid), options.get("lock", ""), options.get("hostname", f"CT{vmid}")))
    write_fd(req.fds[1], format_list(rows))
    return Outcome(status=0, what="list", detail=[str(len(rows))])


def run_config(node: Node, req: Request, args: Sequence[str]) -> Outcome:
    """`pct config VMID`: the current configuration, as pct prints it."""
    if not args:
        raise PctError("400 not enough arguments\npct config <vmid> [OPTIONS]")
    vmid = parse_vmid(args[0])
    write_fd(req.fds[1], format_config(node.load_config(vmid)))
    return Outcome(status=0, what=f"config {vmid}")


COMMANDS = {"status": run_status, "list": run_list, "config": run_config}
USAGE = "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n       (this node stand-in implements: exec, status, list, config)"


def dispatch(node: Node, req: Request, conn: socket.socket) -> Outcome:
    """Run one pct command line; pct's own errors go to the client's stderr with their exit status."""
    argv = req.argv
    try:
        if not argv:
            raise PctError(f"ERROR: no command specified\n{USAGE}")
        if argv[0] == "exec":
            return run_exec(node, req, argv[1:], conn)
        if argv[0] in COMMANDS:
            return COMMANDS[argv[0]](node, req, argv[1:])
        raise PctError(f"ERROR: unknown command 'pct {argv[0]}'\n{USAGE}")
    except PctError as exc:
        if req.fds:
            write_fd(req.fds[2], f"{exc}\n")
        return Outcome(status=exc.status, what=" ".join(argv[:2]) or "(none)", detail=[str(exc).splitlines()[0]])


# --------------------------------------------------------------------------- protocol


def receive_request(conn: socket.socket) -> Request:
    """Header with the three descriptors, then the JSON request (argv, env, cwd)."""
    fds = array.array("i")
    msg, ancdata, _flags, _addr = conn.recvmsg(HEADER.size, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    received = list(fds)
    if not msg and not received:
        raise EOFError("connection closed before a request (a readiness probe)")
    try:
        if len(msg) != HEADER.size or len(received) != 3:
            raise ValueError(f"expected a {HEADER.size}-byte header with 3 descriptors, got {len(msg)} bytes "
                             f"and {len(received)} descriptors")
        magic, length = HEADER.unpack(msg)
        if magic != MAGIC or length > MAX_REQUEST:
            raise ValueError(f"bad header {msg!r}")
        body = b""
        while len(body) < length:
            chunk = conn.recv(min(65536, length - len(body)))
            if not chunk:
                raise ValueError("client closed the connection inside the request")
            body += chunk
        data = json.loads(body)
        return Request(argv=[str(a) for a in data["argv"]], env={str(k): str(v) for k, v in data["env"].items()},
                       cwd=str(data.get("cwd") or "/"), fds=received)
    except (ValueError, KeyError, TypeError, AttributeError):
        for fd in received:
            os.close(fd)
        raise


class Handler(socketserver.BaseRequestHandler):
    """One client connection: one pct command."""

    server: Server

    def handle(self) -> None:
        conn: socket.socket = self.request
        started = time.monotonic()
        try:
            req = receive_request(conn)
        except EOFError:
            return
        except (ValueError, OSError) as exc:
            self.server.log(f"bad request: {exc}")
            return
        try:
            outcome = dispatch(self.server.node, req, conn)
        except Exception as exc:  # report any failure to the caller instead of dropping it
            if req.fds:
                write_fd(req.fds[2], f"pct (lab stand-in): internal error: {exc!r}; see <state>/logs/pctd.log\n")
            self.server.log(f"internal error on {req.argv[:2]}: {exc!r}")
            outcome = Outcome(status=DIE, what=" ".join(req.argv[:2]) or "(none)", detail=[repr(exc)])
        finally:
            for fd in req.fds:
                os.close(fd)
            req.fds = []
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"status": outcome.status}).encode() + b"\n")
        detail = json.dumps(outcome.detail)
        self.server.log(f"{outcome.what} status={outcome.status} seconds={time.monotonic() - started:.3f} "
                        f"argv={detail[:400]}")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The pct daemon: one thread per connection on a root-only unix socket."""

    daemon_threads = True

    def __init__(self, socket_path: Path, node: Node) -> None:
        self.node = node
        self.socket_path = socket_path
        self._log_lock = threading.Lock()
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        socket_path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)
        try:
            super().__init__(str(socket_path), Handler)
        finally:
            os.umask(old_umask)

    def log(self, line: str) -> None:
        with self._log_lock:
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", flush=True)

    def server_close(self) -> None:
        super().server_close()
        self.socket_path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pctd", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", required=True, type=Path, help="the lab state folder (LAB_STATE_DIR)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(f"pctd: expected to run as root (nsenter into the lab containers), running as uid {os.geteuid()}. "
              "`lab up` starts it as root.", file=sys.stderr)
        return 1
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        print("pctd: nsenter not found; install util-linux.", file=sys.stderr)
        return 1
    paths = labctl.Paths(args.state_dir.resolve())
    node = Node(etc_pve=paths.etc_pve, name=labctl.node().name, resolve=default_resolver(paths), nsenter=nsenter)
    server = Server(paths.pctd_socket, node)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    server.log(f"pctd: serving {paths.pctd_socket} for node {node.name} (/etc/pve = {paths.etc_pve})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.log("pctd: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
