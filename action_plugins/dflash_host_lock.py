"""Action plugin dflash_host_lock: one deploy at a time on a host.

Names this run (user, controller, the ansible-playbook process and its start time; dflash_infra.host_lock) and takes
the host's lock with one shell command over the open connection (no module round trip: the lock costs each run two
execs, not two Python start-ups on the host). A lock another live run holds fails the task at once, naming
that run; a dead run's lock (its process gone from this controller, or its heartbeat older than stale_after_s) is
taken over with a warning naming it. `state: heartbeat` touches the lock (its modification time is the run's
heartbeat) and fails when this run no longer holds it. Under --check no lock is taken: the lock is only read, and a
holder is named in a warning.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

try:
    from dflash_infra import host_lock
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import host_lock

display = Display()


# The lock's primitives as one POSIX shell command each (one exec over the open connection, no Python on the host):
# the holder is written whole to a temporary file, then hard-linked to the lock path, which fails when the path
# exists, so of two runs exactly one gets it and a reader never sees a half-written lock. Each prints a word, the
# lock's modification time (the heartbeat, seconds since the epoch; 0 without a lock) and the lock's text.
_BEAT = 'stat -c %Y {p} 2>/dev/null || echo 0; cat {p} 2>/dev/null || true'
ACQUIRE = ('d=$(dirname {p}) && mkdir -p "$d" && t="$d/.deploy-lock.$$" && printf "%s\\n" {j} > "$t" && '
           'if ln "$t" {p} 2>/dev/null; then rm -f "$t"; echo ACQUIRED; else rm -f "$t"; echo HELD; fi; ' + _BEAT)
TAKE_OVER = ('d=$(dirname {p}) && t="$d/.deploy-lock.$$" && printf "%s\\n" {j} > "$t" && '
             'if [ "$(cat {p} 2>/dev/null)" = {old} ]; then mv -f "$t" {p} && echo ACQUIRED; '
             'else rm -f "$t"; echo HELD; fi; ' + _BEAT)
RELEASE = ('if [ "$(cat {p} 2>/dev/null)" = {j} ]; then rm -f {p}; echo RELEASED; else echo KEPT; fi; ' + _BEAT)
READ = 'echo READ; ' + _BEAT
HEARTBEAT = 'if [ -e {p} ]; then touch -c {p}; echo BEAT; else echo GONE; fi; ' + _BEAT


def _holder_of(text: str) -> dict[str, Any] | None:
    text = text.strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return {"unreadable": f"not JSON ({exc}): {text[:120]!r}"}
    return data if isinstance(data, dict) else {"unreadable": f"not a JSON object: {text[:120]!r}"}


def parse_output(stdout: str) -> tuple[str, str, dict[str, Any] | None, dt.datetime | None]:
    """A primitive's output: its first word, the lock file's exact text, the holder that text names, and the lock's
    heartbeat (its modification time; None without a lock).

    A sudoable command over SSH runs on a pseudo-terminal (ssh -tt), which ends lines with CR LF; the lock file never
    holds a CR (the holder is JSON), so dropping them gives back the file's exact text, which take-over compares.
    """
    first, _, rest = stdout.replace("\r", "").partition("\n")
    stamp, _, text = rest.partition("\n")
    seconds = int(stamp) if stamp.strip().isdigit() else 0
    beat = dt.datetime.fromtimestamp(seconds, dt.UTC) if seconds else None
    return first.strip(), text.rstrip("\n"), _holder_of(text), beat


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    """Takes or gives back the host's deploy lock for this run."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        host = str((task_vars or {}).get("inventory_hostname", "the host"))
        path, state = str(args["path"]), str(args.get("state") or "acquired")
        stale_after_s = int(args.get("stale_after_s", 900))
        # Workers are forked from the ansible-playbook process: its pid names the run for every task.
        me = host_lock.holder(getpass.getuser(), socket.gethostname(), os.getppid(), str(args.get("playbook") or ""))
        mine = json.dumps(me, sort_keys=True)

        seen: dict[str, Any] = {}  # the lock file's text and heartbeat as the last primitive printed them

        def shell(template: str, **more: str) -> tuple[str, dict[str, Any] | None]:
            """Run one primitive; its first output line and the holder it printed."""
            command = template.format(p=shlex.quote(path), j=shlex.quote(mine), **more)
            out = self._low_level_execute_command(command, sudoable=True)
            if out.get("rc") != 0:
                raise AnsibleActionFail(f"{host}: the deploy lock {path} could not be handled (rc {out.get('rc')}): "
                                        f"{(out.get('stderr') or out.get('stdout') or '').strip()[:500]}")
            first, seen["text"], holder, seen["beat"] = parse_output(str(out.get("stdout") or ""))
            return first, holder

        if self._play_context.check_mode:
            _, held = shell(READ)
            if held and not host_lock.same_run(held, me):
                display.warning(f"{host}: {host_lock.describe(held)} holds the deploy lock ({path}); this --check "
                                "run shows the host while that run may be changing it")
            return {**result, "changed": False, "held_by": held, "msg": f"{host}: --check takes no lock"}
        if state == "heartbeat":
            word, held = shell(HEARTBEAT)
            if word != "BEAT" or not host_lock.same_run(held, me):
                return {**result, "failed": True, "changed": False, "held_by": held,
                        "msg": f"{host}: this run no longer holds the deploy lock ({path}): "
                               + (f"{host_lock.describe(held)} took it over" if held else "it is gone")
                               + f" (this run: pid {me['pid']}, since {me['started_at']}). Stopping before changing "
                               "anything more; see what that run did, then deploy again"}
            return {**result, "changed": False, "heartbeat": True}
        if state == "released":
            word, held = shell(RELEASE)
            if word != "RELEASED" and held and host_lock.same_run(held, me):  # this run, under another play name
                word, held = shell(RELEASE.replace("{j}", "{held}"), held=shlex.quote(seen["text"]))
            return {**result, "changed": False, "released": word == "RELEASED", "held_by": held}
        word, held = shell(ACQUIRE)
        if word == "ACQUIRED" or host_lock.same_run(held, me):
            return {**result, "changed": False, "acquired": True, "held_by": None,
                    "msg": f"{host}: deploy lock taken ({path})"}
        held = held or {"unreadable": "empty"}
        why = ("its file cannot be read: " + str(held["unreadable"]) if "unreadable" in held else
               host_lock.staleness(held, me["controller"], dt.datetime.now(dt.UTC), stale_after_s,
                                   heartbeat=seen.get("beat")))
        if not why:
            return {**result, "failed": True, "changed": False, "held_by": held,
                    "msg": f"{host}: another deploy holds this host: {host_lock.describe(held)}, its last heartbeat "
                           f"{seen['beat']:%H:%M:%S} UTC. One deploy runs at a time; wait for it to finish. If that "
                           f"run is dead and this controller cannot tell (it ran elsewhere), it is taken over once "
                           f"its heartbeat is {stale_after_s / 60:g} min old (or remove {path} on {host})."
                    if seen.get("beat") else
                    f"{host}: another deploy holds this host: {host_lock.describe(held)}. One deploy runs at a "
                    f"time; wait for it to finish."}
        # Replaced only if the file still holds the dead run's lock exactly as it was read.
        word, now_held = shell(TAKE_OVER, old=shlex.quote(seen["text"]))
        if word != "ACQUIRED":
            return {**result, "failed": True, "changed": False, "held_by": now_held,
                    "msg": f"{host}: the deploy lock changed hands while this run looked at it; now held by "
                           f"{host_lock.describe(now_held or {})}"}
        message = (f"{host}: took over the deploy lock of a dead run ({why}): "
                   f"{host_lock.describe(held) if 'unreadable' not in held else path}")
        display.warning(message)
        return {**result, "changed": False, "acquired": True, "took_over": held, "msg": message}
