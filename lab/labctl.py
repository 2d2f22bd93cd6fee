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
import sys
from collections.abc import Sequence

# The lab builder's modules (lab/labbuilder/); every name they define stays importable as labctl.<name>.
from labbuilder.commands import (
    ContainerStatus,
    DaemonStatus,
    Lab,
)
from labbuilder.config import (
    CONTAINER_PATH,
    CONTAINERS,
    DEFAULT_MIRROR,
    KIT_PROVISION,
    NODE_PCTD_DIR,
    NODE_PROC_DEVICES,
    NODE_PVE_SRC,
    PROC_DEVICES_FIXTURE,
    PVE_DIR,
    READY_STATES,
    REPO,
    Container,
    LabError,
    Paths,
    Settings,
    guests,
    node,
)
from labbuilder.daemons import (
    DAEMON_START_TIMEOUT,
    DAEMONS,
    Daemon,
    connectable,
    daemon_is_stale,
    daemon_pids,
    process_started_at,
    start_daemon,
    stop_daemon,
)
from labbuilder.host import (
    HOST_TOOLS,
    Clock,
    check_address,
    ensure_host_tools,
    mounts_under,
    refuse_on_proxmox,
    remove_tree,
    require_root,
    run,
    tail,
    unmount_all_under,
    write_file,
)
from labbuilder.machines import (
    configure_rootfs,
    create_machine,
    created_info,
    journal_tail,
    nsenter_argv,
    provision_with_kit,
    running_pid,
    start_nspawn,
    stop_machine,
    systemd_state,
    wait_ready,
)
from labbuilder.procs import (
    all_pids,
    cmdline,
    container_leader,
    environ,
    is_alive,
    machine_uuid,
    ns_pids,
    nspawn_pids_for,
    orphan_leaders,
    parent_of,
    proc_state,
    wait_gone_all,
)
from labbuilder.pve import (
    NVIDIA_CONTROL_NODES,
    NVIDIA_MAJOR,
    SAFE_TEXT,
    char_major,
    encode_text,
    ensure_lxc_dir,
    guest_gpu_count,
    lxc_config,
    node_binds,
    nvidia_passthrough_lines,
    prepare_node_rootfs,
    write_node_configs,
)
from labbuilder.rootfs import (
    INCLUDE,
    SUITE,
    VARIANT,
    base_stamp_matches,
    build_base,
)
from labbuilder.ssh import (
    ensure_lab_key,
    ensure_paramiko_home,
    host_key_lines,
    ssh_answers,
    ssh_argv,
    write_known_hosts,
)

__all__ = [
    "CONTAINERS",
    "CONTAINER_PATH",
    "DAEMONS",
    "DAEMON_START_TIMEOUT",
    "DEFAULT_MIRROR",
    "HOST_TOOLS",
    "INCLUDE",
    "KIT_PROVISION",
    "NODE_PCTD_DIR",
    "NODE_PROC_DEVICES",
    "NODE_PVE_SRC",
    "NVIDIA_CONTROL_NODES",
    "NVIDIA_MAJOR",
    "PROC_DEVICES_FIXTURE",
    "PVE_DIR",
    "READY_STATES",
    "REPO",
    "SAFE_TEXT",
    "SUITE",
    "VARIANT",
    "Clock",
    "Container",
    "ContainerStatus",
    "Daemon",
    "DaemonStatus",
    "Lab",
    "LabError",
    "Paths",
    "Settings",
    "all_pids",
    "base_stamp_matches",
    "build_base",
    "char_major",
    "check_address",
    "cmdline",
    "configure_rootfs",
    "connectable",
    "container_leader",
    "create_machine",
    "created_info",
    "daemon_is_stale",
    "daemon_pids",
    "encode_text",
    "ensure_host_tools",
    "ensure_lab_key",
    "ensure_lxc_dir",
    "ensure_paramiko_home",
    "environ",
    "guest_gpu_count",
    "guests",
    "host_key_lines",
    "is_alive",
    "journal_tail",
    "lxc_config",
    "machine_uuid",
    "main",
    "mounts_under",
    "node",
    "node_binds",
    "ns_pids",
    "nsenter_argv",
    "nspawn_pids_for",
    "nvidia_passthrough_lines",
    "orphan_leaders",
    "parent_of",
    "parse_args",
    "prepare_node_rootfs",
    "proc_state",
    "process_started_at",
    "provision_with_kit",
    "refuse_on_proxmox",
    "remove_tree",
    "require_root",
    "run",
    "running_pid",
    "ssh_answers",
    "ssh_argv",
    "start_daemon",
    "start_nspawn",
    "stop_daemon",
    "stop_machine",
    "systemd_state",
    "tail",
    "unmount_all_under",
    "wait_gone_all",
    "wait_ready",
    "write_file",
    "write_known_hosts",
    "write_node_configs",
]


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
    remove = sub.add_parser("remove", help="stop and remove on-demand machines (e.g. ct201), as if never built")
    remove.add_argument("names", nargs="+", metavar="NAME")
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
        if args.command == "remove":
            return lab.remove(args.names)
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
