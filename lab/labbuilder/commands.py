"""The lab's commands (up, down, status, start, stop, reset, shell) over one state folder."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from .config import CONTAINER_PATH, CONTAINERS, KIT_PROVISION, READY_STATES, Container, LabError, Paths, Settings, node
from .daemons import DAEMONS, daemon_pids, start_daemon, stop_daemon
from .host import Clock, ensure_host_tools, refuse_on_proxmox, remove_tree, require_root, unmount_all_under
from .machines import create_machine, created_info, running_pid, start_nspawn, stop_machine, systemd_state, wait_ready
from .procs import container_leader, orphan_leaders
from .pve import write_node_configs
from .rootfs import base_stamp_matches, build_base
from .ssh import ensure_lab_key, ensure_paramiko_home, ssh_answers, write_known_hosts


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


@dataclass
class Lab:
    """The lab's commands over one state folder."""

    settings: Settings
    clock: Clock = dataclasses.field(default_factory=Clock)

    @property
    def paths(self) -> Paths:
        return Paths(self.settings.state, self.settings.rootfs)

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
        return [known[n] for n in names] if names else [c for c in CONTAINERS if self.wanted(c)]

    def wanted(self, c: Container) -> bool:
        """Part of the lab without being named: every machine but an on-demand one that was never built."""
        return not c.on_demand or self.paths.created_stamp(c.name).exists()

    def up(self, names: Sequence[str] = ()) -> int:
        refuse_on_proxmox()
        require_root()
        _lock = self.lock()
        containers = self.select(names)
        ensure_host_tools(self.clock)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
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

    def discard(self, c: Container) -> None:
        """Stop a machine and remove its disk (the caller holds the lab lock)."""
        stop_machine(self.paths, c, self.settings, self.clock, discard=True)
        self.paths.created_stamp(c.name).unlink(missing_ok=True)
        unmount_all_under(self.paths.machine(c.name), self.clock)
        remove_tree(self.paths.machine(c.name))

    def reset(self, names: Sequence[str]) -> int:
        """Rebuild containers from the cached rootfs (initial state, kit included), leaving the others alone."""
        refuse_on_proxmox()
        require_root()
        containers = self.select(names)
        with self.lock():
            for c in containers:
                self.discard(c)
                if c.is_node:  # the node's /etc/pve is part of its initial state
                    remove_tree(self.paths.etc_pve)
                self.clock.say(f"{c.name}: removed; rebuilding from {self.paths.base}")
        return self.up([c.name for c in containers])

    def remove(self, names: Sequence[str]) -> int:
        """Stop and remove on-demand machines (their disk, host keys and Proxmox config), leaving the lab as `lab up`
        builds it; the other machines are refused (`lab reset` rebuilds them)."""
        refuse_on_proxmox()
        require_root()
        containers = self.select(names)
        fixed = [c.name for c in containers if not c.on_demand]
        if fixed:
            raise LabError(f"{', '.join(fixed)} belong to every lab; only on-demand machines are removed "
                           f"({', '.join(c.name for c in CONTAINERS if c.on_demand)}); `lab reset` rebuilds the others")
        with self.lock():
            for c in containers:
                self.discard(c)
                if c.vmid is not None:
                    for conf in self.paths.etc_pve.glob(f"nodes/*/lxc/{c.vmid}.conf"):
                        conf.unlink()
                self.clock.say(f"{c.name}: removed")
            write_known_hosts(self.paths)
        return 0

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
            if not stop_machine(self.paths, c, self.settings, self.clock, discard=True):
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
            shared = "" if self.paths.base.is_relative_to(self.paths.state) else f"; the shared {self.paths.base} stays"
            self.clock.say(f"purged {self.paths.state} (base rootfs, lab key, logs{shared})")
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
        rows = [self.status_of(c) for c in CONTAINERS if self.wanted(c)]
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
                print(f"{r.name:<7}{r.group:<15}{r.address:<14}{r.pid or '-'!s:<9}{r.systemd:<14}"
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
