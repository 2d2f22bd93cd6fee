"""Action plugin dflash_host_lock: one deploy at a time on a host.

Names this run (user, controller, the ansible-playbook process and its start time; dflash_infra.host_lock) and has
the module of the same name take the host's lock. A lock another live run holds fails the task at once, naming
that run; a dead run's lock (its process gone from this controller, or older than stale_after_s) is taken over
with a warning. Under --check no lock is taken: the lock is only read, and a holder is named in a warning.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

try:
    from dflash_infra import host_lock
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import host_lock

display = Display()


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    """Takes or gives back the host's deploy lock for this run."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        host = str((task_vars or {}).get("inventory_hostname", "the host"))
        path, state = str(args["path"]), str(args.get("state") or "acquired")
        stale_after_s = int(args.get("stale_after_s", 7200))
        # Workers are forked from the ansible-playbook process: its pid names the run for every task.
        me = host_lock.holder(getpass.getuser(), socket.gethostname(), os.getppid(), str(args.get("playbook") or ""))

        def call(**module_args: Any) -> dict[str, Any]:
            out: dict[str, Any] = self._execute_module(module_name="dflash_host_lock", task_vars=task_vars,
                                                       module_args={"path": path, "holder": me, **module_args})
            return out

        if self._play_context.check_mode:
            seen = call(state="read")
            held = seen.get("held_by")
            if held and not host_lock.same_run(held, me):
                display.warning(f"{host}: {host_lock.describe(held)} holds the deploy lock ({path}); this --check "
                                "run shows the host while that run may be changing it")
            return {**result, **seen, "changed": False, "msg": f"{host}: --check takes no lock"}
        if state == "released":
            return {**result, **call(state="released"), "changed": False}
        got = call(state="acquired")
        if got.get("failed") or got.get("acquired"):
            return {**result, **got, "msg": got.get("msg") or f"{host}: deploy lock taken ({path})"}
        held = got.get("held_by") or {}
        why = ("its file cannot be read: " + str(held["unreadable"]) if "unreadable" in held else
               host_lock.staleness(held, me["controller"], dt.datetime.now(dt.UTC), stale_after_s))
        if not why:
            return {**result, "failed": True, "held_by": held,
                    "msg": f"{host}: another deploy holds this host: {host_lock.describe(held)}. One deploy runs "
                           f"at a time; wait for it to finish. If that run is dead and this controller cannot "
                           f"tell (it ran elsewhere), remove {path} on {host}, or it is taken over once it is "
                           f"{stale_after_s / 3600:g} h old."}
        taken = call(state="acquired", take_over=held)
        if not taken.get("acquired"):
            return {**result, "failed": True, "held_by": taken.get("held_by"),
                    "msg": f"{host}: the deploy lock changed hands while this run looked at it; now held by "
                           f"{host_lock.describe(taken.get('held_by') or {})}"}
        message = (f"{host}: took over the deploy lock of a dead run ({why}): "
                   f"{host_lock.describe(held) if 'unreadable' not in held else path}")
        display.warning(message)
        return {**result, **taken, "changed": False, "msg": message}
