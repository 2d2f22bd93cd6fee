"""The lab host: commands, progress output, mounts, and the checks before anything is built."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .config import Container, LabError


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


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


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


# Host commands the lab needs, and the Debian package that ships each.
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "findmnt": "util-linux",
}


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


def machine_cgroups(key: str, self_cgroup: str = "/proc/self/cgroup",
                    mountinfo: str = "/proc/self/mountinfo") -> list[Path]:
    """A cgroup of its own for one machine, `<this process's cgroup>/dflash-lab/<key>`, in the unified hierarchy
    and in systemd's named v1 one (hybrid hosts), created when missing.

    With --register=no and --keep-unit, systemd-nspawn splits the cgroup it starts in into `supervisor` and
    `payload`, and the container's systemd runs its units under `payload`. Started side by side from one cgroup,
    every machine would share the same `payload/system.slice/<unit>` cgroups: stopping a unit in one container
    would kill or move the same unit's processes in another (two containers both running sglang-qwen.service).
    The nspawn process is started in these cgroups (`join_cgroups`)."""
    mounts: dict[str, tuple[str, str]] = {}  # "unified" / "name=systemd" -> (mount root, mount point)
    with open(mountinfo, encoding="utf-8") as fh:
        for line in fh:
            fields, _, rest = line.partition(" - ")
            parts, extra = fields.split(), rest.split()
            if len(parts) < 5 or len(extra) < 3:
                continue
            if extra[0] == "cgroup2":
                mounts.setdefault("unified", (parts[3], parts[4]))
            elif extra[0] == "cgroup" and "name=systemd" in extra[2].split(","):
                mounts.setdefault("name=systemd", (parts[3], parts[4]))
    out: list[Path] = []
    with open(self_cgroup, encoding="utf-8") as fh:
        for line in fh:
            cells = line.rstrip("\n").split(":", 2)
            if len(cells) != 3:
                continue
            _, hierarchy, path = cells
            kind = "unified" if hierarchy == "" else hierarchy if hierarchy == "name=systemd" else ""
            if kind not in mounts:
                continue
            root, point = mounts[kind]
            relative = path[len(root):] if root != "/" and path.startswith(root) else path
            folder = Path(point + relative.rstrip("/")) / "dflash-lab" / key
            folder.mkdir(parents=True, exist_ok=True)
            out.append(folder)
    return out


def join_cgroups(folders: Sequence[Path], argv: Sequence[str]) -> list[str]:
    """`argv` run in the cgroups `folders`: a shell moves itself into each, then execs argv (the same pid)."""
    procs = " ".join(shlex.quote(str(folder / "cgroup.procs")) for folder in folders)
    return ["/bin/sh", "-c", f'for g in {procs}; do echo $$ > "$g" || exit 125; done; exec "$@"', "sh", *argv]
