"""SSH material: the lab key, the machines' host keys in known_hosts, and the ssh command line."""

from __future__ import annotations

import os
import subprocess

from .config import CONTAINERS, Container, Paths
from .host import Clock, run


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
