"""One lab machine: its disk (clone, identity, GPU kit) and its systemd-nspawn process (boot, wait, stop)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid

from .config import (
    CONTAINER_PATH,
    KIT_PROVISION,
    NODE_PROC_DEVICES,
    READY_STATES,
    REPO,
    Container,
    LabError,
    Paths,
    Settings,
)
from .host import (
    Clock,
    check_address,
    join_cgroups,
    machine_cgroups,
    mounts_under,
    remove_tree,
    run,
    tail,
    unmount_all_under,
    write_file,
)
from .procs import cmdline, container_leader, is_alive, nspawn_pids_for, orphan_leaders, wait_gone_all
from .pve import node_binds, prepare_node_rootfs
from .ssh import ssh_answers


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
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }, indent=2) + "\n")
    return True


def created_info(paths: Paths, c: Container) -> dict[str, object] | None:
    """What create_machine recorded in the machine's creation stamp (None before it exists or when unreadable)."""
    stamp = paths.created_stamp(c.name)
    if not stamp.exists():
        return None
    try:
        info: dict[str, object] = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return None
    return info


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
    # Each machine in its own cgroup (named after its folder: unique across labs), never one shared `payload`.
    cgroups = machine_cgroups(f"{c.name}-{hashlib.sha256(str(paths.machine(c.name)).encode()).hexdigest()[:12]}")
    with paths.console_log(c.name).open("a") as log:
        log.write(f"\n=== {dt.datetime.now().isoformat(timespec='seconds')} {' '.join(argv)} "
                  f"(cgroups {', '.join(map(str, cgroups))})\n")
        log.flush()
        proc = subprocess.Popen(join_cgroups(cgroups, argv), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
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


def kill_all(c: Container, watch: list[int]) -> None:
    """SIGKILL to nspawn and the namespace's PID 1 (which ends every process in it), then wait for them to go."""
    for victim in watch:
        if is_alive(victim):
            os.kill(victim, signal.SIGKILL)
    if not wait_gone_all(watch, 10):
        raise LabError(f"{c.name}: processes {watch} survived SIGKILL; check `ps -o "
                       f"pid,stat,cmd -p {','.join(map(str, watch))}` (stuck in the kernel?).")


def stop_machine(paths: Paths, c: Container, settings: Settings, clock: Clock, discard: bool = False) -> bool:
    """Power the container off through its systemd, then kill it after a bounded wait. With `discard` (its disk is
    removed right after: `reset`, `down`) nothing inside needs an orderly stop, and it is killed at once.

    Also ends a container whose systemd-nspawn was killed but whose systemd lives on.
    """
    pid = running_pid(paths, c)
    leader = container_leader(pid) if pid else None
    orphans = [] if pid else orphan_leaders(paths.machine(c.name))
    if pid is None and not orphans:
        return False
    started = time.monotonic()
    watch = [p for p in (pid, leader, *orphans) if p is not None]
    if discard:
        how = "killed (its disk is discarded)"
        kill_all(c, watch)
    else:
        for target in ([leader] if leader else orphans):
            run(nsenter_argv(target, "systemctl", "poweroff", "--no-block"), check=False, timeout=15)
        how = "powered off"
        if not wait_gone_all(watch, settings.stop_timeout):
            how = "terminated"
            if pid is not None and is_alive(pid):
                os.kill(pid, signal.SIGTERM)  # nspawn turns this into an orderly halt of the container
            if not wait_gone_all(watch, 10):
                how = "killed"
                kill_all(c, watch)
    paths.pidfile(c.name).unlink(missing_ok=True)
    unmount_all_under(paths.machine(c.name))
    what = "container" if pid else f"orphaned container (systemd pid {', '.join(map(str, orphans))}, no nspawn)"
    clock.say(f"{c.name}: {what} {how} in {time.monotonic() - started:.1f} s")
    return True
