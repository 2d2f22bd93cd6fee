#!/usr/bin/env python3
"""Lab builder: Debian bookworm containers booted with systemd-nspawn that rehearse the
Proxmox LXC containers (real systemd as PID 1, real apt/dpkg, real sshd), plus a Proxmox
node stand-in (pve1) whose `pct exec` reaches them the way production does.

Subcommands: up, down [--purge], status [--json], start NAME, stop NAME, reset NAME, shell NAME.
Run as root. State lives in .cache/lab of the repository (LAB_STATE_DIR overrides it).
Standard library only, so it runs with the system python3 before the project venv exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

REPO = Path(__file__).resolve().parent.parent
KIT_PROVISION = REPO / "lab" / "kit" / "provision"
PVE_DIR = REPO / "lab" / "pve"
# A real /proc/devices capture (H200 machine): its nvidia-uvm major (238) goes into the node's LXC configs.
PROC_DEVICES_FIXTURE = REPO / "tests" / "fixtures" / "nvidia" / "h200-device-run" / "proc-devices.txt"

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = (
    "systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "iproute2", "openssh-server",
    "sudo", "rsync", "ca-certificates", "procps",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# Host commands the lab needs, and the Debian package that ships each.
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "findmnt": "util-linux",
}

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_STATES = ("running", "degraded")


@dataclass(frozen=True)
class Container:
    """One lab machine: the production name, its group, its own loopback address and its role.

    role "container" rehearses a Proxmox LXC container (Proxmox id `vmid`, GPU kit installed);
    role "node" is the Proxmox node stand-in that reaches the containers with `pct exec`.
    """

    name: str
    group: str
    address: str
    role: str = "container"
    vmid: int | None = None

    @property
    def is_node(self) -> bool:
        return self.role == "node"


CONTAINERS: tuple[Container, ...] = (
    Container(name="ct200", group="pro6000", address="127.0.200.1", vmid=200),
    Container(name="ct129", group="eval", address="127.0.129.1", vmid=129),
    Container(name="pve1", group="proxmox_nodes", address="127.0.10.1", role="node"),
)

# Where the node stand-in finds its pieces (paths inside pve1).
NODE_PVE_SRC = "/usr/local/lib/dflash-lab/pve"        # lab/pve, bind-mounted read-only
NODE_PCTD_DIR = "/var/lib/dflash-lab/pctd"            # <state>/run/pctd: the pct daemon's socket
NODE_PROC_DEVICES = "/var/lib/dflash-lab/proc/devices"  # stand-in of the node's /proc/devices


def guests() -> list[Container]:
    """The machines that rehearse Proxmox containers (everything but the node stand-in)."""
    return [c for c in CONTAINERS if not c.is_node]


def node() -> Container:
    """The Proxmox node stand-in."""
    return next(c for c in CONTAINERS if c.is_node)


@dataclass(frozen=True)
class Settings:
    """Tunables read from the environment once, so every step sees the same values."""

    state: Path
    mirror: str
    boot_timeout: float
    stop_timeout: float

    @classmethod
    def from_env(cls) -> Settings:
        state = Path(os.environ.get("LAB_STATE_DIR") or REPO / ".cache" / "lab")
        if not state.is_absolute():
            state = REPO / state
        return cls(
            state=state,
            mirror=os.environ.get("LAB_DEBIAN_MIRROR", DEFAULT_MIRROR),
            boot_timeout=float(os.environ.get("LAB_BOOT_TIMEOUT", "180")),
            stop_timeout=float(os.environ.get("LAB_STOP_TIMEOUT", "30")),
        )


@dataclass(frozen=True)
class Paths:
    """Every file and folder the lab owns, all under one state folder."""

    state: Path

    @property
    def base(self) -> Path:
        return self.state / "rootfs" / "base"

    @property
    def base_tmp(self) -> Path:
        return self.state / "rootfs" / "base.tmp"

    @property
    def base_stamp(self) -> Path:
        return self.state / "rootfs" / "base.stamp"

    @property
    def machines(self) -> Path:
        return self.state / "machines"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def ssh(self) -> Path:
        return self.state / "ssh"

    @property
    def key(self) -> Path:
        return self.ssh / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh / "known_hosts"

    @property
    def lock(self) -> Path:
        return self.state / "lab.lock"

    def machine(self, name: str) -> Path:
        return self.machines / name

    def created_stamp(self, name: str) -> Path:
        return self.machines / f"{name}.created"

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def console_log(self, name: str) -> Path:
        return self.logs / f"{name}.console.log"

    def provision_log(self, name: str) -> Path:
        return self.logs / f"{name}.provision.log"

    @property
    def etc_pve(self) -> Path:
        """The node stand-in's /etc/pve (bind-mounted into pve1; the API stand-in shares it)."""
        return self.state / "pve" / "etc-pve"

    def lxc_dir(self, node_name: str) -> Path:
        return self.etc_pve / "nodes" / node_name / "lxc"

    @property
    def pctd_dir(self) -> Path:
        return self.run / "pctd"

    @property
    def pctd_socket(self) -> Path:
        return self.pctd_dir / "pctd.sock"

    @property
    def paramiko_home(self) -> Path:
        """A HOME whose ~/.ssh/known_hosts is the lab's: paramiko reads host keys only from there."""
        return self.ssh / "home"


@dataclass
class ContainerStatus:
    """What `lab status` reports for one container."""

    name: str
    group: str
    address: str
    created: bool
    provisioned: bool | None
    pid: int | None
    leader: int | None
    systemd: str
    ssh: bool


@dataclass
class DaemonStatus:
    """What `lab status` reports for one of the node stand-in's host daemons."""

    name: str
    pid: int | None
    ready: bool
    log: str


class LabError(Exception):
    """A failure with a message that says what was expected, what was found and what to do."""


# --------------------------------------------------------------------------- output


class Clock:
    """Prints progress lines prefixed with the time since the command started."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {message}", flush=True)


def tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file, or a note that it is missing."""
    if not path.exists():
        return f"({path} does not exist)"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------- processes


def run(argv: Sequence[str | Path], *, check: bool = True, timeout: float | None = None,
        capture: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise LabError with its output."""
    args = [str(a) for a in argv]
    try:
        proc = subprocess.run(args, text=True, capture_output=capture, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"`{' '.join(args)}` did not finish within {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        out = ((proc.stdout or "") + (proc.stderr or "")).strip()
        raise LabError(f"`{' '.join(args)}` exited with {proc.returncode}:\n{out}")
    return proc


def proc_state(pid: int) -> str | None:
    """Kernel state letter of a process, or None when it no longer exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_alive(pid: int) -> bool:
    """True for a live process; a zombie counts as gone."""
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """Argument vector of a process (empty when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def parent_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def ns_pids(pid: int) -> list[int]:
    """The NSpid line: the process id in each nested pid namespace, outermost first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (FileNotFoundError, ProcessLookupError):
        return []
    return []


def nspawn_pids_for(root: Path) -> list[int]:
    """Live systemd-nspawn processes booting this directory (found by argv, not by name)."""
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if not argv or not argv[0].endswith("systemd-nspawn") or not is_alive(pid):
            continue
        if "-D" in argv and argv.index("-D") + 1 < len(argv) and Path(argv[argv.index("-D") + 1]) == root:
            found.append(pid)
    return sorted(found)


def container_leader(nspawn_pid: int) -> int | None:
    """The container's PID 1 (systemd): the descendant of nspawn that is pid 1 in its namespace."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        ppid = parent_of(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    queue = list(children.get(nspawn_pid, []))
    while queue:
        pid = queue.pop(0)
        nsp = ns_pids(pid)
        if len(nsp) >= 2 and nsp[-1] == 1 and is_alive(pid):
            return pid
        queue.extend(children.get(pid, []))
    return None


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (part.decode(errors="replace").partition("=") for part in raw.split(b"\0") if part)
    return {key: value for key, _, value in pairs}


def machine_uuid(root: Path) -> str | None:
    """The container's machine id as nspawn passes it in `container_uuid`."""
    try:
        return str(uuid.UUID((root / "etc" / "machine-id").read_text().strip()))
    except (FileNotFoundError, ValueError):
        return None


def orphan_leaders(root: Path) -> list[int]:
    """Container PID 1s of this rootfs whose systemd-nspawn is gone (it was killed with SIGKILL).

    They are recognised by `container_uuid` in their environment, which nspawn sets from
    the container's own machine id.
    """
    wanted = machine_uuid(root)
    if wanted is None:
        return []
    found = []
    for pid in all_pids():
        nsp = ns_pids(pid)
        if len(nsp) < 2 or nsp[-1] != 1 or not is_alive(pid):
            continue
        env = environ(pid)
        if env.get("container") == "systemd-nspawn" and env.get("container_uuid") == wanted:
            parent = parent_of(pid)
            if parent is None or "systemd-nspawn" not in " ".join(cmdline(parent)[:1]):
                found.append(pid)
    return sorted(found)


# --------------------------------------------------------------------------- mounts


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below `path` in the host's mount table, deepest first."""
    prefix = str(path.resolve() if path.exists() else path)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix.rstrip("/") + "/"):
            points.append(Path(point))
    return sorted(set(points), key=lambda p: len(p.parts), reverse=True)


def unmount_all_under(path: Path, clock: Clock | None = None) -> None:
    """Unmount everything below `path` (left by an interrupted debootstrap or chroot)."""
    for point in mounts_under(path):
        proc = run(["umount", point], check=False)
        if proc.returncode != 0:
            run(["umount", "-l", point], check=False)
        if clock:
            clock.say(f"unmounted {point}")
    left = mounts_under(path)
    if left:
        raise LabError(f"Expected no mounts under {path}, found {', '.join(map(str, left))}. "
                       "Unmount them by hand (umount -R) and retry.")


def remove_tree(path: Path) -> None:
    """Delete a directory tree without ever crossing into a mounted file system."""
    if not path.exists() and not path.is_symlink():
        return
    unmount_all_under(path)
    run(["rm", "-rf", "--one-file-system", "--", path])


# --------------------------------------------------------------------------- host checks


def refuse_on_proxmox() -> None:
    """The lab boots throwaway containers; a real Proxmox node is never the place for it."""
    if Path("/etc/pve").exists():
        raise LabError("This machine looks like a Proxmox VE node (/etc/pve exists). The lab boots "
                       "throwaway systemd-nspawn containers and must not run on a real node. "
                       "Run it on a development machine; use inventory/production for the real hosts.")


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(f"The lab needs root (debootstrap, systemd-nspawn, nsenter); running as uid "
                       f"{os.geteuid()}. Run it as root (e.g. sudo make lab-up).")


def ensure_host_tools(clock: Clock) -> None:
    """Install the Debian packages that provide missing tools; `apt-get update` only then."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise LabError(f"Missing host packages {', '.join(missing)} and no apt-get to install them. "
                       "The lab builder expects Debian 12; install them by hand.")
    clock.say(f"installing host packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def check_address(c: Container) -> None:
    """The container's address must be local (127.0.0.0/8 is) and port 22 on it free before boot."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((c.address, 0))
        except OSError as exc:
            raise LabError(f"{c.name} needs the loopback address {c.address} on this host, but binding "
                           f"to it failed ({exc}). Add it with `ip addr add {c.address}/32 dev lo`.") from exc
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        if s.connect_ex((c.address, 22)) == 0:
            raise LabError(f"Something already listens on {c.address}:22 before {c.name} boots (a host "
                           "sshd bound to 0.0.0.0?). The lab's sshd must own that address; bind the "
                           "host sshd to specific addresses and retry.")


# --------------------------------------------------------------------------- base rootfs


def base_stamp_matches(paths: Paths) -> bool:
    """The cached rootfs is complete and was built with today's package list."""
    if not paths.base_stamp.exists() or not paths.base.is_dir():
        return False
    try:
        stamp = json.loads(paths.base_stamp.read_text())
    except json.JSONDecodeError:
        return False
    return (stamp.get("suite"), stamp.get("variant"), stamp.get("include")) == (SUITE, VARIANT, list(INCLUDE))


def build_base(paths: Paths, settings: Settings, clock: Clock) -> bool:
    """Build the Debian rootfs once with debootstrap; the stamp is written only when it is complete."""
    if base_stamp_matches(paths):
        return False
    paths.logs.mkdir(parents=True, exist_ok=True)
    for stale in (paths.base_tmp, paths.base):
        remove_tree(stale)
    paths.base_stamp.unlink(missing_ok=True)
    clock.say(f"building base rootfs with debootstrap ({SUITE}, {VARIANT}) -> {paths.base}")
    started = time.monotonic()
    log = paths.logs / "debootstrap.log"
    with log.open("w") as out:
        proc = subprocess.run(
            ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(INCLUDE)}",
             SUITE, str(paths.base_tmp), settings.mirror],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    unmount_all_under(paths.base_tmp)
    if proc.returncode != 0:
        raise LabError(f"debootstrap exited with {proc.returncode}; the base rootfs was not built. "
                       f"Last lines of {log}:\n{tail(log)}\nCheck the mirror ({settings.mirror}, "
                       "LAB_DEBIAN_MIRROR overrides it) and retry `lab up`.")
    paths.base_tmp.rename(paths.base)
    seconds = time.monotonic() - started
    stamp = {
        "suite": SUITE, "variant": VARIANT, "include": list(INCLUDE), "mirror": settings.mirror,
        "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
    }
    paths.base_stamp.write_text(json.dumps(stamp, indent=2) + "\n")
    clock.say(f"base rootfs built in {seconds:.0f} s")
    return True


# --------------------------------------------------------------------------- ssh material


def ensure_lab_key(paths: Paths, clock: Clock) -> None:
    """One ed25519 key pair for root logins into every lab container."""
    paths.ssh.mkdir(parents=True, exist_ok=True)
    paths.ssh.chmod(0o700)
    if paths.key.exists() and paths.key.with_suffix(".pub").exists():
        return
    paths.key.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflash-lab", "-f", paths.key])
    clock.say(f"generated lab SSH key {paths.key}")


def host_key_lines(paths: Paths, c: Container) -> list[str]:
    """known_hosts lines for one container's host keys, under its name and its address."""
    etc_ssh = paths.machine(c.name) / "etc" / "ssh"
    lines = []
    for pub in sorted(etc_ssh.glob("ssh_host_*_key.pub")):
        keytype, key = pub.read_text().split()[:2]
        lines.append(f"{c.name},{c.address} {keytype} {key}")
    return lines


def write_known_hosts(paths: Paths) -> None:
    """Rewrite the lab's known_hosts from the machines that exist now."""
    lines = []
    for c in CONTAINERS:
        if paths.created_stamp(c.name).exists():
            lines.extend(host_key_lines(paths, c))
    paths.ssh.mkdir(parents=True, exist_ok=True)
    paths.known_hosts.write_text("".join(f"{line}\n" for line in lines))
    ensure_paramiko_home(paths)


def ensure_paramiko_home(paths: Paths) -> None:
    """<state>/ssh/home/.ssh/known_hosts -> the lab's known_hosts.

    paramiko (and so community.proxmox.proxmox_pct_remote) checks host keys only against
    ~/.ssh/known_hosts; running Ansible with HOME=<state>/ssh/home keeps that check on, against
    the lab's own keys.
    """
    dot_ssh = paths.paramiko_home / ".ssh"
    dot_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    link = dot_ssh / "known_hosts"
    if link.is_symlink() and os.readlink(link) == "../../known_hosts":
        return
    link.unlink(missing_ok=True)
    link.symlink_to("../../known_hosts")


def ssh_argv(paths: Paths, c: Container, *command: str) -> list[str]:
    """An ssh command line that trusts only the lab's known_hosts and key (no user config)."""
    return [
        "ssh", "-F", "/dev/null", "-i", str(paths.key),
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={paths.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR",
        f"root@{c.address}", *command,
    ]


def ssh_answers(paths: Paths, c: Container) -> bool:
    try:
        proc = subprocess.run(ssh_argv(paths, c, "true"), capture_output=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


# --------------------------------------------------------------------------- container disk


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def configure_rootfs(paths: Paths, c: Container) -> None:
    """Give a fresh clone its identity: hostname, machine id, host keys, sshd address, root key."""
    root = paths.machine(c.name)
    write_file(root / "etc" / "hostname", f"{c.name}\n")
    write_file(root / "etc" / "hosts",
               f"127.0.0.1\tlocalhost\n{c.address}\t{c.name}\n"
               "::1\tlocalhost ip6-localhost ip6-loopback\n")
    write_file(root / "etc" / "machine-id", uuid.uuid4().hex + "\n", 0o444)

    etc_ssh = root / "etc" / "ssh"
    for old in etc_ssh.glob("ssh_host_*"):
        old.unlink()
    for keytype in ("rsa", "ecdsa", "ed25519"):
        run(["ssh-keygen", "-q", "-t", keytype, "-N", "", "-C", f"root@{c.name}",
             "-f", etc_ssh / f"ssh_host_{keytype}_key"])
    write_file(etc_ssh / "sshd_config.d" / "10-dflash-lab.conf",
               f"# dflash lab container {c.name} (group {c.group}).\n"
               "# The lab shares the host's network, so sshd listens only on this container's own\n"
               "# loopback address; root logs in with the lab key only.\n"
               f"ListenAddress {c.address}\n"
               "PermitRootLogin prohibit-password\n"
               "PasswordAuthentication no\n"
               "KbdInteractiveAuthentication no\n"
               "UseDNS no\n")

    ssh_dir = root / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    pub = paths.key.with_suffix(".pub").read_text()
    write_file(ssh_dir / "authorized_keys", pub, 0o600)


def provision_with_kit(paths: Paths, c: Container, clock: Clock) -> bool:
    """Run lab/kit/provision on a fresh rootfs before its first boot, when the kit exists."""
    if not (KIT_PROVISION.is_file() and os.access(KIT_PROVISION, os.X_OK)):
        return False
    root = paths.machine(c.name)
    log = paths.provision_log(c.name)
    clock.say(f"{c.name}: provisioning with {KIT_PROVISION.relative_to(REPO)} (log {log})")
    env = dict(os.environ, LAB_STATE_DIR=str(paths.state), LAB_CONTAINER=c.name,
               LAB_CONTAINER_GROUP=c.group, LAB_CONTAINER_ADDRESS=c.address)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run([str(KIT_PROVISION), str(root), c.name], stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
    leftovers = mounts_under(root)
    if leftovers:
        clock.say(f"{c.name}: provisioning left mounts behind, unmounting {len(leftovers)}")
        unmount_all_under(root)
    if proc.returncode != 0:
        raise LabError(f"{KIT_PROVISION.relative_to(REPO)} {root} {c.name} exited with "
                       f"{proc.returncode}. Last lines of {log}:\n{tail(log)}\n"
                       "The container was not marked created; fix the kit and run `lab up` again.")
    clock.say(f"{c.name}: provisioned in {time.monotonic() - started:.1f} s")
    return True


def prepare_node_rootfs(paths: Paths, c: Container) -> None:
    """Make a fresh clone the Proxmox node stand-in: /usr/sbin/pct and a /proc/devices stand-in, no GPU kit.

    /usr/sbin/pct links into lab/pve, which `lab up` bind-mounts read-only at NODE_PVE_SRC, so the
    client is always the checked-out one; /etc/pve and the pct daemon's socket folder are bind mounts too.
    """
    root = paths.machine(c.name)
    for folder in (NODE_PVE_SRC, NODE_PCTD_DIR, "/etc/pve"):
        (root / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
    pct = root / "usr" / "sbin" / "pct"
    pct.unlink(missing_ok=True)
    pct.symlink_to(f"{NODE_PVE_SRC}/pct")
    write_file(root / NODE_PROC_DEVICES.lstrip("/"), PROC_DEVICES_FIXTURE.read_text())
    write_file(root / "var" / "lib" / "dflash-lab" / "README",
               f"Lab STAND-IN of a Proxmox VE node (dflash-infra lab/README.md), not a Proxmox node.\n"
               f"/usr/sbin/pct is the lab's pct stand-in (lab/pve/pct): it hands `pct exec` to the host's\n"
               f"pct daemon (lab/pve/pctd.py) through {NODE_PCTD_DIR}/pctd.sock, which enters the lab\n"
               f"container with nsenter. /etc/pve is <state>/pve/etc-pve of the lab host.\n"
               f"{NODE_PROC_DEVICES} is a real /proc/devices capture ({PROC_DEVICES_FIXTURE.relative_to(REPO)}).\n")


def create_machine(paths: Paths, c: Container, clock: Clock) -> bool:
    """Clone the base rootfs for one machine, configure and provision it. False if it existed."""
    root = paths.machine(c.name)
    stamp = paths.created_stamp(c.name)
    if stamp.exists() and root.is_dir():
        return False
    if nspawn_pids_for(root):
        raise LabError(f"{c.name} has a running systemd-nspawn but no creation stamp ({stamp}). "
                       "Run `lab down` to clear the half-built container, then `lab up`.")
    stamp.unlink(missing_ok=True)
    remove_tree(root)
    paths.machines.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run(["cp", "-a", "--reflink=auto", paths.base, root])
    clock.say(f"{c.name}: cloned base rootfs in {time.monotonic() - started:.1f} s")
    configure_rootfs(paths, c)
    clock.say(f"{c.name}: hostname {c.name}, sshd on {c.address}:22, fresh host keys and machine id")
    if c.is_node:
        prepare_node_rootfs(paths, c)
        clock.say(f"{c.name}: Proxmox node stand-in: /usr/sbin/pct -> lab/pve/pct, {NODE_PROC_DEVICES}")
        provisioned = False
    else:
        provisioned = provision_with_kit(paths, c, clock)
    stamp.write_text(json.dumps({
        "name": c.name, "group": c.group, "address": c.address, "role": c.role, "provisioned": provisioned,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }, indent=2) + "\n")
    return True


def created_info(paths: Paths, c: Container) -> dict[str, object] | None:
    stamp = paths.created_stamp(c.name)
    if not stamp.exists():
        return None
    try:
        return json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return None


# --------------------------------------------------------------------------- container process


def running_pid(paths: Paths, c: Container) -> int | None:
    """The nspawn process of a container, from the pidfile or, failing that, by its argv."""
    pidfile = paths.pidfile(c.name)
    root = paths.machine(c.name)
    if pidfile.exists():
        try:
            pid = int(pidfile.read_text().strip())
        except ValueError:
            pid = 0
        if pid and is_alive(pid) and "systemd-nspawn" in " ".join(cmdline(pid)[:1]) \
                and str(root) in cmdline(pid):
            return pid
    pids = nspawn_pids_for(root)
    if pids:
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(f"{pids[0]}\n")
        return pids[0]
    pidfile.unlink(missing_ok=True)
    return None


def nsenter_argv(leader: int, *command: str) -> list[str]:
    """Run a command inside the container (all its namespaces, its root, a clean environment)."""
    return ["nsenter", "-t", str(leader), "-a", "-r", "--", "/usr/bin/env", "-i",
            f"PATH={CONTAINER_PATH}", "LANG=C.UTF-8", "TERM=dumb", *command]


def systemd_state(leader: int | None) -> str:
    """`systemctl is-system-running` inside the container ('offline' when it is not running)."""
    if leader is None:
        return "offline"
    try:
        proc = subprocess.run(nsenter_argv(leader, "systemctl", "is-system-running"),
                              capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "unresponsive"
    return proc.stdout.strip() or "unknown"


def journal_tail(paths: Paths, c: Container, leader: int | None) -> str:
    """The container's journal tail, or its console log when the journal cannot be read."""
    if leader is not None:
        proc = run(nsenter_argv(leader, "journalctl", "-b", "-n", "40", "--no-pager"),
                   check=False, timeout=30)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.rstrip()
    return tail(paths.console_log(c.name))


def node_binds(paths: Paths, c: Container) -> list[str]:
    """The node stand-in's bind mounts: /etc/pve, the pct daemon's socket folder, lab/pve (read-only)."""
    if not c.is_node:
        return []
    paths.etc_pve.mkdir(parents=True, exist_ok=True)
    paths.pctd_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [f"--bind={paths.etc_pve}:/etc/pve", f"--bind={paths.pctd_dir}:{NODE_PCTD_DIR}",
            f"--bind-ro={PVE_DIR}:{NODE_PVE_SRC}"]


def start_nspawn(paths: Paths, c: Container, clock: Clock) -> int:
    """Boot a container in the background and record the nspawn pid."""
    check_address(c)
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    argv = [
        "systemd-nspawn", "-D", str(paths.machine(c.name)), "-b",
        f"--machine={c.name}",
        "--register=no",          # the host has no machined (and no systemd as PID 1)
        "--keep-unit",            # stay in our own cgroup instead of asking systemd for a scope
        "--link-journal=no",      # keep the container's journal inside the container
        "--console=read-only",    # boot messages go to the console log, no terminal needed
        # No --private-network: the container shares the host network and owns its loopback address.
        *node_binds(paths, c),
    ]
    with paths.console_log(c.name).open("a") as log:
        log.write(f"\n=== {dt.datetime.now().isoformat(timespec='seconds')} {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd="/")
    paths.pidfile(c.name).write_text(f"{proc.pid}\n")
    clock.say(f"{c.name}: booting (systemd-nspawn pid {proc.pid}, console log {paths.console_log(c.name)})")
    return proc.pid


def wait_ready(paths: Paths, c: Container, pid: int, settings: Settings, clock: Clock) -> str:
    """Wait until systemd inside reports running/degraded and sshd answers; fail with the journal."""
    deadline = time.monotonic() + settings.boot_timeout
    state = "starting"
    leader: int | None = None
    while time.monotonic() < deadline:
        if not is_alive(pid):
            raise LabError(f"{c.name}: systemd-nspawn (pid {pid}) exited during boot. Console log "
                           f"{paths.console_log(c.name)}:\n{tail(paths.console_log(c.name))}")
        leader = leader if leader and is_alive(leader) else container_leader(pid)
        state = systemd_state(leader)
        if state in READY_STATES:
            break
        if state in ("maintenance", "stopping"):
            raise LabError(f"{c.name}: systemd reports '{state}' instead of running/degraded. "
                           f"Journal tail:\n{journal_tail(paths, c, leader)}")
        time.sleep(0.5)
    else:
        raise LabError(f"{c.name}: expected `systemctl is-system-running` to report running or degraded "
                       f"within {settings.boot_timeout:.0f} s, last state '{state}'. Journal tail:\n"
                       f"{journal_tail(paths, c, leader)}\nLAB_BOOT_TIMEOUT raises the wait.")
    while time.monotonic() < deadline:
        if ssh_answers(paths, c):
            break
        time.sleep(0.5)
    else:
        raise LabError(f"{c.name}: systemd is {state} but sshd on {c.address}:22 did not accept the lab "
                       f"key within {settings.boot_timeout:.0f} s. Journal tail:\n"
                       f"{journal_tail(paths, c, leader)}")
    if state == "degraded" and leader is not None:
        failed = run(nsenter_argv(leader, "systemctl", "--failed", "--no-legend", "--plain"),
                     check=False, timeout=15).stdout.strip()
        clock.say(f"{c.name}: systemd degraded; failed units: {failed or '(none listed)'}")
    return state


def stop_machine(paths: Paths, c: Container, settings: Settings, clock: Clock) -> bool:
    """Power the container off through its systemd, then kill it after a bounded wait.

    Also ends a container whose systemd-nspawn was killed but whose systemd lives on.
    """
    pid = running_pid(paths, c)
    leader = container_leader(pid) if pid else None
    orphans = [] if pid else orphan_leaders(paths.machine(c.name))
    if pid is None and not orphans:
        return False
    started = time.monotonic()
    watch = [p for p in (pid, leader, *orphans) if p is not None]
    for target in ([leader] if leader else orphans):
        run(nsenter_argv(target, "systemctl", "poweroff", "--no-block"), check=False, timeout=15)
    how = "powered off"
    if not wait_gone_all(watch, settings.stop_timeout):
        how = "terminated"
        if pid is not None and is_alive(pid):
            os.kill(pid, signal.SIGTERM)  # nspawn turns this into an orderly halt of the container
        if not wait_gone_all(watch, 10):
            how = "killed"
            for victim in watch:  # SIGKILL to a namespace's PID 1 ends every process in it
                if is_alive(victim):
                    os.kill(victim, signal.SIGKILL)
            if not wait_gone_all(watch, 10):
                raise LabError(f"{c.name}: processes {watch} survived SIGKILL; check `ps -o "
                               f"pid,stat,cmd -p {','.join(map(str, watch))}` (stuck in the kernel?).")
    paths.pidfile(c.name).unlink(missing_ok=True)
    unmount_all_under(paths.machine(c.name))
    what = "container" if pid else f"orphaned container (systemd pid {', '.join(map(str, orphans))}, no nspawn)"
    clock.say(f"{c.name}: {what} {how} in {time.monotonic() - started:.1f} s")
    return True


def wait_gone_all(pids: Sequence[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(is_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return not any(is_alive(p) for p in pids)


# --------------------------------------------------------------------------- node stand-in: /etc/pve


NVIDIA_MAJOR = 195  # fixed major of /dev/nvidia<N> and /dev/nvidiactl; nvidia-uvm's is dynamic
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
SAFE_TEXT = set(range(0x20, 0x3a)) | set(range(0x3b, 0x7f))  # what PVE::Tools::encode_text leaves alone


def char_major(proc_devices: str, name: str) -> int | None:
    """Major number of a character device in /proc/devices text (None when it is not listed)."""
    section = ""
    for line in proc_devices.splitlines():
        if line.strip().endswith(":"):
            section = line.strip()
            continue
        parts = line.split()
        if section == "Character devices:" and len(parts) == 2 and parts[1] == name:
            return int(parts[0])
    return None


def encode_text(text: str) -> str:
    """Proxmox's encode_text: percent-encode control characters, ':' and non-ASCII (config comments)."""
    return "".join(chr(b) if b in SAFE_TEXT else f"%{b:02X}" for b in text.encode())


def nvidia_passthrough_lines(gpu_count: int, uvm_major: int) -> list[str]:
    """The LXC lines that hand a node's NVIDIA devices to a container (cgroup2 allow + bind mounts)."""
    lines = [f"lxc.cgroup2.devices.allow: c {major}:* rwm" for major in (NVIDIA_MAJOR, uvm_major)]
    for dev in [f"nvidia{i}" for i in range(gpu_count)] + list(NVIDIA_CONTROL_NODES):
        lines.append(f"lxc.mount.entry: /dev/{dev} dev/{dev} none bind,optional,create=file")
    return lines


def lxc_config(c: Container, gpu_count: int, uvm_major: int) -> str:
    """A Proxmox LXC config (nodes/<node>/lxc/<vmid>.conf) for a lab container, in Proxmox's own layout.

    Description comment first, then the options sorted by key, then the raw lxc.* lines; no
    address literals (the network is DHCP).
    """
    options = {
        "arch": "amd64",
        "cores": "8",
        "features": "nesting=1",
        "hostname": c.name,
        "memory": "16384",
        "net0": "name=eth0,bridge=vmbr0,firewall=1,ip=dhcp,type=veth",
        "ostype": "debian",
        "rootfs": f"local-lvm:vm-{c.vmid}-disk-0,size=64G",
        "swap": "0",
    }
    description = f"Lab stand-in of CT{c.vmid} (group {c.group}); dflash-infra lab/README.md"
    lines = [f"#{encode_text(description)}"]
    lines += [f"{key}: {value}" for key, value in sorted(options.items())]
    lines += nvidia_passthrough_lines(gpu_count, uvm_major)
    return "\n".join(lines) + "\n"


def guest_gpu_count(paths: Paths, c: Container) -> int | None:
    """How many GPUs the kit simulates in a container (from its installed profile), None without one."""
    profile = paths.machine(c.name) / "etc" / "dflash-lab" / "gpu-profile.json"
    try:
        return len(json.loads(profile.read_text())["gpus"])
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def ensure_lxc_dir(paths: Paths, node_name: str) -> Path:
    """nodes/<node>/lxc under the node's /etc/pve, with the `lxc`, `qemu-server` and `local` links of a real node."""
    real = paths.lxc_dir(node_name)
    real.mkdir(parents=True, exist_ok=True)
    (real.parent / "qemu-server").mkdir(exist_ok=True)
    for link, target in (("lxc", f"nodes/{node_name}/lxc"), ("qemu-server", f"nodes/{node_name}/qemu-server"),
                         ("local", f"nodes/{node_name}")):
        path = paths.etc_pve / link
        if not path.exists() and not path.is_symlink():
            path.symlink_to(target)
    return paths.etc_pve / "lxc"


def write_node_configs(paths: Paths, clock: Clock) -> bool:
    """Write each container's <vmid>.conf into the node's /etc/pve when it is missing (never overwrite)."""
    n = node()
    if not paths.created_stamp(n.name).exists():
        return False
    lxc = ensure_lxc_dir(paths, n.name)
    devices = paths.machine(n.name) / NODE_PROC_DEVICES.lstrip("/")
    uvm_major = char_major(devices.read_text() if devices.exists() else PROC_DEVICES_FIXTURE.read_text(),
                           "nvidia-uvm")
    if uvm_major is None:
        raise LabError(f"Expected an nvidia-uvm line in {devices} (the node's /proc/devices stand-in), found "
                       f"none. Run `lab reset {n.name}` to copy it again from {PROC_DEVICES_FIXTURE}.")
    written = False
    for c in guests():
        conf = lxc / f"{c.vmid}.conf"
        if conf.exists():
            continue
        gpus = guest_gpu_count(paths, c)
        if gpus is None:
            clock.say(f"{n.name}: {c.name} has no GPU profile yet; {conf.name} is written by the next `lab up`")
            continue
        tmp = conf.with_suffix(".conf.tmp")
        tmp.write_text(lxc_config(c, gpus, uvm_major))
        tmp.rename(conf)
        clock.say(f"{n.name}: wrote /etc/pve/lxc/{conf.name} ({c.name}, {gpus} GPUs, nvidia-uvm major {uvm_major})")
        written = True
    return written


# --------------------------------------------------------------------------- node stand-in: host daemons


@dataclass(frozen=True)
class Daemon:
    """A host process that serves the node stand-in: the pct daemon, the Proxmox API stand-in.

    Started in its own session with `--state-dir <state>` (and `--listen <node address> --port`
    for a TCP service); found again by its argument vector, never by name.
    """

    name: str
    script: Path
    port: int | None = None  # TCP port on the node's address; None: the pct daemon's unix socket
    also_reads: tuple[Path, ...] = ()  # other sources whose change means a restart

    def argv(self, paths: Paths) -> list[str]:
        argv = [sys.executable, str(self.script), "--state-dir", str(paths.state)]
        if self.port is not None:
            argv += ["--listen", node().address, "--port", str(self.port)]
        return argv

    def wanted(self) -> bool:
        return self.script.is_file()

    def log(self, paths: Paths) -> Path:
        return paths.logs / f"{self.name}.log"

    def pidfile(self, paths: Paths) -> Path:
        return paths.run / f"{self.name}.pid"

    def ready(self, paths: Paths) -> bool:
        """The service accepts connections (unix socket or TCP port)."""
        if self.port is None:
            return connectable(socket.AF_UNIX, str(paths.pctd_socket))
        return connectable(socket.AF_INET, (node().address, self.port))


def connectable(family: socket.AddressFamily, address: str | tuple[str, int]) -> bool:
    """Something accepts a stream connection at this address."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(address)
        except OSError:
            return False
    return True


DAEMONS: tuple[Daemon, ...] = (
    Daemon(name="pctd", script=PVE_DIR / "pctd.py", also_reads=(Path(__file__).resolve(),)),
    Daemon(name="pve-api", script=PVE_DIR / "api.py", port=8006),
)
DAEMON_START_TIMEOUT = 20.0


def daemon_pids(paths: Paths, d: Daemon) -> list[int]:
    """Live processes running this daemon's script for this state folder."""
    found = []
    for pid in all_pids():
        argv = cmdline(pid)
        if (str(d.script) in argv[1:3] and "--state-dir" in argv
                and argv[argv.index("--state-dir") + 1:][:1] == [str(paths.state)] and is_alive(pid)):
            found.append(pid)
    return sorted(found)


def process_started_at(pid: int) -> float | None:
    """Start time of a process as a Unix timestamp (from /proc/<pid>/stat and the boot time)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
    except (FileNotFoundError, ProcessLookupError, StopIteration, IndexError):
        return None
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def daemon_is_stale(d: Daemon, pid: int) -> bool:
    """The daemon runs older code than the checkout (its script or a module it reads changed since it started)."""
    started = process_started_at(pid)
    newest = max(p.stat().st_mtime for p in (d.script, *d.also_reads) if p.exists())
    return started is not None and newest > started + 1


def stop_daemon(paths: Paths, d: Daemon, clock: Clock) -> bool:
    """SIGTERM, then SIGKILL after a bounded wait. False when it was not running."""
    pids = daemon_pids(paths, d)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    if pids and not wait_gone_all(pids, 10):
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        wait_gone_all(pids, 5)
    d.pidfile(paths).unlink(missing_ok=True)
    if pids:
        clock.say(f"{d.name}: stopped (pid {', '.join(map(str, pids))})")
    return bool(pids)


def start_daemon(paths: Paths, d: Daemon, clock: Clock) -> bool:
    """Start the daemon unless it runs (restart it when its code changed). True when it was (re)started."""
    pids = daemon_pids(paths, d)
    if os.getpid() in pids:
        return False  # called from inside the daemon itself (the API stand-in starting a container)
    if pids and not any(daemon_is_stale(d, pid) for pid in pids) and d.ready(paths):
        return False
    if pids:
        clock.say(f"{d.name}: restarting (code changed since it started, or it does not answer)")
        stop_daemon(paths, d, clock)
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    argv = d.argv(paths)
    log = d.log(paths)
    with log.open("a") as out:
        out.write(f"\n=== {dt.datetime.now().isoformat(timespec='seconds')} {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=REPO)
    d.pidfile(paths).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    while not d.ready(paths):
        if proc.poll() is not None:
            raise LabError(f"{d.name} ({' '.join(argv)}) exited with {proc.returncode} while starting. "
                           f"Last lines of {log}:\n{tail(log)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise LabError(f"{d.name} (pid {proc.pid}) did not accept connections within "
                           f"{DAEMON_START_TIMEOUT:.0f} s. Last lines of {log}:\n{tail(log)}")
        time.sleep(0.1)
    clock.say(f"{d.name}: started (pid {proc.pid}, log {log})")
    return True


# --------------------------------------------------------------------------- commands


@dataclass
class Lab:
    """The lab's commands over one state folder."""

    settings: Settings
    clock: Clock = dataclasses.field(default_factory=Clock)

    @property
    def paths(self) -> Paths:
        return Paths(self.settings.state)

    def lock(self) -> TextIO:
        """Serialise lab commands that change state (a second `lab up` waits for the first)."""
        self.paths.state.mkdir(parents=True, exist_ok=True)
        handle = self.paths.lock.open("w")
        fcntl.flock(handle, fcntl.LOCK_EX)
        return handle

    def select(self, names: Sequence[str]) -> list[Container]:
        known = {c.name: c for c in CONTAINERS}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise LabError(f"Unknown machine {', '.join(unknown)}; the lab has {', '.join(known)}.")
        return [known[n] for n in names] if names else list(CONTAINERS)

    def up(self, names: Sequence[str] = ()) -> int:
        refuse_on_proxmox()
        require_root()
        _lock = self.lock()
        containers = self.select(names)
        ensure_host_tools(self.clock)
        changed = build_base(self.paths, self.settings, self.clock)
        ensure_lab_key(self.paths, self.clock)
        ensure_paramiko_home(self.paths)
        created = [c for c in containers if create_machine(self.paths, c, self.clock)]
        if created:
            write_known_hosts(self.paths)
            changed = True
        self.warn_unprovisioned(containers)
        changed = write_node_configs(self.paths, self.clock) or changed
        changed = self.ensure_daemons() or changed
        booting = {}
        for c in containers:
            pid = running_pid(self.paths, c)
            if pid is None:
                if orphan_leaders(self.paths.machine(c.name)):
                    self.clock.say(f"{c.name}: systemd-nspawn is gone but the container's systemd "
                                   "still runs; stopping it before a fresh boot")
                    stop_machine(self.paths, c, self.settings, self.clock)
                booting[c.name] = start_nspawn(self.paths, c, self.clock)
        for c in containers:
            pid = booting.get(c.name) or running_pid(self.paths, c)
            assert pid is not None
            if c.name in booting:
                state = wait_ready(self.paths, c, pid, self.settings, self.clock)
                self.clock.say(f"{c.name}: ready ({state}, ssh root@{c.address})")
                changed = True
            else:
                self.check_running(c, pid)
        if changed:
            self.clock.say(f"lab up: done in {self.clock.elapsed():.1f} s")
        else:
            self.clock.say("lab up: nothing to do; "
                           + ", ".join(f"{c.name} running (pid {running_pid(self.paths, c)})" for c in containers))
        return 0

    def ensure_daemons(self) -> bool:
        """Start (or restart, when dead or out of date) the node stand-in's host daemons, once the node exists."""
        if not self.paths.created_stamp(node().name).exists():
            return False
        started = False
        for d in DAEMONS:
            if d.wanted():
                started = start_daemon(self.paths, d, self.clock) or started
        return started

    def check_running(self, c: Container, pid: int) -> None:
        """A container already up must still be healthy; a stuck one is reported, not rebooted."""
        state = systemd_state(container_leader(pid))
        if state not in READY_STATES:
            state = wait_ready(self.paths, c, pid, self.settings, self.clock)
        if not ssh_answers(self.paths, c):
            raise LabError(f"{c.name} is running (pid {pid}, systemd {state}) but sshd on {c.address}:22 "
                           f"does not accept the lab key. Try `lab stop {c.name} && lab up`.")

    def warn_unprovisioned(self, containers: Sequence[Container]) -> None:
        if not (KIT_PROVISION.is_file() and os.access(KIT_PROVISION, os.X_OK)):
            return
        for c in containers:
            info = created_info(self.paths, c)
            if info is not None and not c.is_node and not info.get("provisioned"):
                self.clock.say(f"{c.name}: note: created before lab/kit/provision existed, so it has no "
                               "GPU simulation kit; `lab down && lab up` rebuilds it with the kit")

    def start(self, names: Sequence[str]) -> int:
        return self.up(names)

    def stop(self, names: Sequence[str]) -> int:
        refuse_on_proxmox()
        require_root()
        _lock = self.lock()
        for c in self.select(names):
            if not stop_machine(self.paths, c, self.settings, self.clock):
                self.clock.say(f"{c.name}: already stopped")
        return 0

    def reset(self, names: Sequence[str]) -> int:
        """Rebuild containers from the cached rootfs (initial state, kit included), leaving the others alone."""
        refuse_on_proxmox()
        require_root()
        containers = self.select(names)
        with self.lock():
            for c in containers:
                stop_machine(self.paths, c, self.settings, self.clock)
                self.paths.created_stamp(c.name).unlink(missing_ok=True)
                unmount_all_under(self.paths.machine(c.name), self.clock)
                remove_tree(self.paths.machine(c.name))
                if c.is_node:  # the node's /etc/pve is part of its initial state
                    remove_tree(self.paths.etc_pve)
                self.clock.say(f"{c.name}: removed; rebuilding from {self.paths.base}")
        return self.up([c.name for c in containers])

    def down(self, purge: bool = False) -> int:
        refuse_on_proxmox()
        require_root()
        if not self.paths.state.exists():
            self.clock.say(f"lab down: nothing to do ({self.paths.state} does not exist)")
            return 0
        _lock = self.lock()
        for d in DAEMONS:
            stop_daemon(self.paths, d, self.clock)
        for c in CONTAINERS:
            if not stop_machine(self.paths, c, self.settings, self.clock):
                self.clock.say(f"{c.name}: not running")
            if self.paths.machine(c.name).exists() or self.paths.created_stamp(c.name).exists():
                self.paths.created_stamp(c.name).unlink(missing_ok=True)
                remove_tree(self.paths.machine(c.name))
                self.clock.say(f"{c.name}: removed {self.paths.machine(c.name)}")
        for folder in (self.paths.etc_pve.parent, self.paths.pctd_dir):
            if folder.exists():
                remove_tree(folder)
                self.clock.say(f"removed {folder}")
        write_known_hosts(self.paths)
        unmount_all_under(self.paths.state, self.clock)
        if purge:
            self.paths.lock.unlink(missing_ok=True)
            remove_tree(self.paths.state)
            self.clock.say(f"purged {self.paths.state} (base rootfs, lab key, logs)")
        else:
            self.clock.say(f"kept cached base rootfs {self.paths.base} (`lab down --purge` removes it)")
        self.clock.say(f"lab down: done in {self.clock.elapsed():.1f} s")
        return 0

    def status_of(self, c: Container) -> ContainerStatus:
        pid = running_pid(self.paths, c) if self.paths.state.exists() else None
        leader = container_leader(pid) if pid else None
        orphans = [] if pid else orphan_leaders(self.paths.machine(c.name))
        info = created_info(self.paths, c)
        return ContainerStatus(
            name=c.name, group=c.group, address=c.address, created=info is not None,
            provisioned=bool(info.get("provisioned")) if info else None,
            pid=pid, leader=leader,
            systemd="orphaned" if orphans else systemd_state(leader),
            ssh=ssh_answers(self.paths, c) if leader else False,
        )

    def daemon_status(self) -> list[DaemonStatus]:
        """The node stand-in's host daemons that exist in this checkout."""
        rows = []
        for d in DAEMONS:
            if d.wanted():
                pids = daemon_pids(self.paths, d) if self.paths.state.exists() else []
                rows.append(DaemonStatus(name=d.name, pid=pids[0] if pids else None,
                                         ready=bool(pids) and d.ready(self.paths), log=str(d.log(self.paths))))
        return rows

    def status(self, as_json: bool = False) -> int:
        rows = [self.status_of(c) for c in CONTAINERS]
        daemons = self.daemon_status()
        if as_json:
            print(json.dumps({"state_dir": str(self.paths.state),
                              "base_rootfs": base_stamp_matches(self.paths),
                              "containers": [dataclasses.asdict(r) for r in rows],
                              "daemons": [dataclasses.asdict(d) for d in daemons]}, indent=2))
        else:
            base = "cached" if base_stamp_matches(self.paths) else "not built"
            print(f"state {self.paths.state}  base rootfs: {base}")
            print(f"{'NAME':<7}{'GROUP':<15}{'ADDRESS':<14}{'PID':<9}{'SYSTEMD':<14}{'SSH':<5}{'DISK'}")
            for r in rows:
                disk = ("created, kit" if r.provisioned else "created") if r.created else "-"
                print(f"{r.name:<7}{r.group:<15}{r.address:<14}{str(r.pid or '-'):<9}{r.systemd:<14}"
                      f"{'yes' if r.ssh else 'no':<5}{disk}")
            for d in daemons:
                print(f"daemon {d.name}: {'ready' if d.ready else 'not running'}"
                      f"{f' (pid {d.pid})' if d.pid else ''}, log {d.log}")
        node_up = any(r.name == node().name and r.created for r in rows)
        daemons_ok = all(d.ready for d in daemons) or not node_up
        return 0 if all(r.systemd in READY_STATES and r.ssh for r in rows) and daemons_ok else 3

    def shell(self, name: str) -> int:
        require_root()
        c = self.select([name])[0]
        pid = running_pid(self.paths, c)
        leader = container_leader(pid) if pid else None
        if leader is None:
            raise LabError(f"{c.name} is not running; `lab up` or `lab start {c.name}` first.")
        argv = ["nsenter", "-t", str(leader), "-a", "-r", "--", "/usr/bin/env", "-i",
                f"PATH={CONTAINER_PATH}", "LANG=C.UTF-8", f"TERM={os.environ.get('TERM', 'xterm')}",
                "HOME=/root", "/bin/bash", "-l"]
        os.execvp(argv[0], argv)
        return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build, boot and wait for the lab machines, start the node daemons (idempotent)")
    up.add_argument("names", nargs="*", help="only these machines (default: all)")
    down = sub.add_parser("down", help="stop and remove the machines and daemons; keeps the cached rootfs")
    down.add_argument("--purge", action="store_true", help="also remove the base rootfs, lab key and logs")
    status = sub.add_parser("status", help="pid, address, systemd state and ssh of each machine; the node daemons")
    status.add_argument("--json", action="store_true")
    for name, text in (("start", "start one machine (creating it if needed)"),
                       ("stop", "power one machine off, keeping its disk")):
        p = sub.add_parser(name, help=text)
        p.add_argument("names", nargs="+", metavar="NAME")
    reset = sub.add_parser("reset", help="rebuild machines from the cached rootfs (initial state)")
    reset.add_argument("names", nargs="+", metavar="NAME")
    shell = sub.add_parser("shell", help="a root shell inside a running machine")
    shell.add_argument("name")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    lab = Lab(Settings.from_env())
    try:
        if args.command == "up":
            return lab.up(args.names)
        if args.command == "down":
            return lab.down(purge=args.purge)
        if args.command == "status":
            return lab.status(as_json=args.json)
        if args.command == "start":
            return lab.start(args.names)
        if args.command == "stop":
            return lab.stop(args.names)
        if args.command == "reset":
            return lab.reset(args.names)
        if args.command == "shell":
            return lab.shell(args.name)
    except LabError as exc:
        print(f"lab {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"lab {args.command}: interrupted", file=sys.stderr)
        return 130
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
