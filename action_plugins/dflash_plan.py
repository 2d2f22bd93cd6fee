"""Action plugin dflash_plan: plan one host on the controller (dflash_infra.planner) in one task: the plan becomes a
fact, planner errors fail the task before anything is changed, and `differs` says whether the plan differs from
the one the fact held before (the role shows the table then)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

try:
    from dflash_infra import planner
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import planner


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    """Plans from `request` (the `dflash-infra plan` request keys) and sets `fact` (default serving_plan_current)."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        fact = str(self._task.args.get("fact") or "serving_plan_current")
        before = ((task_vars or {}).get("ansible_facts") or {}).get(fact)
        try:
            plan = planner.plan_dict(dict(self._task.args["request"]))
        except (KeyError, ValueError) as exc:
            return {**result, "failed": True, "msg": f"dflash_plan: {exc}"}
        host = (task_vars or {}).get("inventory_hostname", "host")
        if plan["errors"]:
            return {**result, "changed": False, "failed": True,
                    "msg": f"{host}: the plan has errors, nothing was changed: {' | '.join(plan['errors'])}\n"
                           f"{planner.plan_table(plan)}"}
        return {**result, "changed": False, "ansible_facts": {fact: plan}, "differs": plan != before}
