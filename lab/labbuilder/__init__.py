"""The lab builder behind lab/labctl.py, one module per concern.

- `config`: the machine table (ct200, ct129, pve1), tunables from the environment, the state folder's paths
- `host`: commands, progress output, mounts and the host checks
- `procs`: processes read from /proc (nspawn processes, container PID 1s)
- `rootfs`: the debootstrap base root file system
- `ssh`: the lab key, known_hosts and the ssh command line
- `machines`: one machine's disk and its systemd-nspawn process
- `pve`: the Proxmox node stand-in's /etc/pve, rootfs and bind mounts
- `daemons`: the node stand-in's host daemons (pct daemon, API stand-in)
- `commands`: `Lab`, the commands over one state folder

Standard library only, like lab/labctl.py.
"""
