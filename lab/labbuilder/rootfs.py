"""The base root file system, built once with debootstrap and cloned for every machine."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import subprocess
import time

from .config import LabError, Paths, Settings
from .host import Clock, remove_tree, tail, unmount_all_under

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = (
    "systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "iproute2", "openssh-server",
    "sudo", "rsync", "ca-certificates", "procps",
)


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
    """Build the Debian rootfs once with debootstrap; the stamp is written only when it is complete.

    Labs of this machine share it: the build holds base.lock, so a second lab waits for the first's build.
    The lab's logs folder exists already (`lab up` makes it)."""
    paths.rootfs_dir.mkdir(parents=True, exist_ok=True)
    with paths.base_lock.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_base(paths, settings, clock)


def _build_base(paths: Paths, settings: Settings, clock: Clock) -> bool:
    if base_stamp_matches(paths):
        return False
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
        "built_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
    }
    paths.base_stamp.write_text(json.dumps(stamp, indent=2) + "\n")
    clock.say(f"base rootfs built in {seconds:.0f} s")
    return True
