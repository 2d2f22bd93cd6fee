"""The Proxmox node stand-in pve1: its /etc/pve (LXC configs with the NVIDIA passthrough), its rootfs
and bind mounts."""

from __future__ import annotations

import json
from pathlib import Path

from .config import (
    NODE_PCTD_DIR,
    NODE_PROC_DEVICES,
    NODE_PVE_SRC,
    PROC_DEVICES_FIXTURE,
    PVE_DIR,
    REPO,
    Container,
    LabError,
    Paths,
    guests,
    node,
)
from .host import Clock, write_file

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
        if conf.exists() or (c.on_demand and not paths.created_stamp(c.name).exists()):
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


def node_binds(paths: Paths, c: Container) -> list[str]:
    """The node stand-in's bind mounts: /etc/pve, the pct daemon's socket folder, lab/pve (read-only)."""
    if not c.is_node:
        return []
    paths.etc_pve.mkdir(parents=True, exist_ok=True)
    paths.pctd_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [f"--bind={paths.etc_pve}:/etc/pve", f"--bind={paths.pctd_dir}:{NODE_PCTD_DIR}",
            f"--bind-ro={PVE_DIR}:{NODE_PVE_SRC}"]
