"""The lab's machine table, its tunables and where its state lives (paths under one state folder)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # lab/labbuilder/config.py -> the repository
KIT_PROVISION = REPO / "lab" / "kit" / "provision"
PVE_DIR = REPO / "lab" / "pve"
# A real /proc/devices capture (H200 machine): its nvidia-uvm major (238) goes into the node's LXC configs.
PROC_DEVICES_FIXTURE = REPO / "tests" / "fixtures" / "nvidia" / "h200-device-run" / "proc-devices.txt"


DEFAULT_MIRROR = "http://deb.debian.org/debian"


CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_STATES = ("running", "degraded")


@dataclass(frozen=True)
class Container:
    """One lab machine: the production name, its group, its own loopback address and its role.

    role "container" rehearses a Proxmox LXC container (Proxmox id `vmid`, GPU kit installed);
    role "node" is the Proxmox node stand-in that reaches the containers with `pct exec`.
    on_demand: built and booted only when named (`lab up ct201`); `lab up` alone leaves it out until it exists,
    and the lab inventory lists it only then.
    """

    name: str
    group: str
    address: str
    role: str = "container"
    vmid: int | None = None
    on_demand: bool = False

    @property
    def is_node(self) -> bool:
        return self.role == "node"


def lab_instance() -> int:
    """Which lab of this machine (LAB_INSTANCE, 0 when unset): lab N lives on 127.N.0.0/16 in its own state folder,
    so two labs run side by side (make test runs its lab tests in two streams)."""
    raw = os.environ.get("LAB_INSTANCE") or "0"
    if not raw.isdigit() or int(raw) > 9:
        raise ValueError(f"LAB_INSTANCE must be a number 0-9 (the second byte of the lab's loopback addresses), "
                         f"found {raw!r}")
    return int(raw)


INSTANCE = lab_instance()


def machine_table(instance: int) -> tuple[Container, ...]:
    """The lab's machines: the production names and groups on lab `instance`'s own loopback addresses."""
    return (
        Container(name="ct200", group="pro6000", address=f"127.{instance}.200.1", vmid=200),
        Container(name="ct129", group="eval", address=f"127.{instance}.129.1", vmid=129),
        Container(name="pve1", group="proxmox_nodes", address=f"127.{instance}.10.1", role="node"),
        # A second PRO 6000 box whose replicas ct200's gateway fronts (a serving group of two hosts).
        Container(name="ct201", group="pro6000_pair", address=f"127.{instance}.201.1", vmid=201, on_demand=True),
    )


CONTAINERS: tuple[Container, ...] = machine_table(INSTANCE)

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
    rootfs: Path | None = None  # the cached base rootfs's folder; None: <state>/rootfs

    @classmethod
    def from_env(cls) -> Settings:
        default = REPO / ".cache" / ("lab" if INSTANCE == 0 else f"lab-{INSTANCE}")
        state = Path(os.environ.get("LAB_STATE_DIR") or default)
        if not state.is_absolute():
            state = REPO / state
        # Another lab of this machine clones the first lab's base rootfs (one debootstrap for all).
        rootfs = os.environ.get("LAB_ROOTFS_DIR") or (str(REPO / ".cache" / "lab" / "rootfs") if INSTANCE else None)
        return cls(
            state=state,
            rootfs=Path(rootfs).resolve() if rootfs else None,
            mirror=os.environ.get("LAB_DEBIAN_MIRROR", DEFAULT_MIRROR),
            boot_timeout=float(os.environ.get("LAB_BOOT_TIMEOUT", "180")),
            stop_timeout=float(os.environ.get("LAB_STOP_TIMEOUT", "30")),
        )


@dataclass(frozen=True)
class Paths:
    """Every file and folder the lab owns, all under one state folder."""

    state: Path
    rootfs: Path | None = None  # where the base rootfs is cached; None: <state>/rootfs

    @property
    def rootfs_dir(self) -> Path:
        return self.rootfs or self.state / "rootfs"

    @property
    def base(self) -> Path:
        return self.rootfs_dir / "base"

    @property
    def base_tmp(self) -> Path:
        return self.rootfs_dir / "base.tmp"

    @property
    def base_stamp(self) -> Path:
        return self.rootfs_dir / "base.stamp"

    @property
    def base_lock(self) -> Path:
        return self.rootfs_dir / "base.lock"

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


class LabError(Exception):
    """A failure with a message that says what was expected, what was found and what to do."""
