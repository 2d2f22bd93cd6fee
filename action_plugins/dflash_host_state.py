"""Action plugin dflash_host_state: run the module of the same name on the host (one round trip) and turn its
result into the host_state_current fact on the controller (dflash_infra.host_state.normalize), in one task."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

try:
    from dflash_infra import host_state
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import host_state

# The module's options this plugin does not pass on (they shape the fact on the controller).
CONTROLLER_OPTIONS = ("deny_extra", "fact")


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    """Reads the host with the dflash_host_state module, parses what it read, sets the fact."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        deny_extra = list(args.get("deny_extra") or [])
        fact = str(args.get("fact") or "host_state_current")
        module_args = {k: v for k, v in args.items() if k not in CONTROLLER_OPTIONS}
        read = self._execute_module(module_name="dflash_host_state", module_args=module_args, task_vars=task_vars)
        if read.get("failed"):
            return {**result, **read}
        try:
            state = host_state.normalize(read["state"], deny_extra)
        except ValueError as exc:  # a parser's one-line message: what it expected, what it found
            raise AnsibleActionFail(f"dflash_host_state: {exc}") from exc
        # `at` names this read: a stage that decided from an earlier read of the host knows to decide again.
        state["read"] = {"at": uuid.uuid4().hex, "sections": read.get("sections"), "seconds": read.get("seconds"),
                         "elapsed_s": read.get("elapsed_s")}
        return {**result, "changed": False, "ansible_facts": {fact: state}, "elapsed_s": read.get("elapsed_s")}
