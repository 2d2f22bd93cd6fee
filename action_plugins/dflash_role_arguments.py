"""Action plugin dflash_role_arguments: the argument specs of several role entry points validated in one task.

Ansible validates a role's `meta/argument_specs.yml` with a task of its own each time the role is imported. A play
that imports many roles validates them here at once, before anything changes, and imports them with
`rolespec_validate: false`. Measured (docs/architecture.md, Why a no-op is fast): a no-op deploy on the lab takes
5.12 s with the per-import validation (12 more tasks) against 4.30 s with this task, five paired runs: it saves
14.5 % of a no-op.

Each option is read from the task's variables as Ansible's own validation reads it (group_vars, -e, play vars) and
templated; an option whose value depends on a fact this run has not set yet is left for later (it is computed by the
project's own code, not typed by a person) and named in the result under `deferred`. Everything else is checked with
Ansible's ArgumentSpecValidator, exactly as the per-role validation would; a failure names the role, its entry point
and every wrong option.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

ROLES_DIR = Path(__file__).resolve().parents[1] / "roles"
_SPECS: dict[str, dict[str, Any]] = {}


def role_specs(role: str, roles_dir: Path = ROLES_DIR) -> dict[str, Any]:
    """The `argument_specs` mapping of a role (read once per controller process)."""
    key = str(roles_dir / role)
    if key not in _SPECS:
        path = roles_dir / role / "meta" / "argument_specs.yml"
        if not path.is_file():
            raise AnsibleActionFail(f"dflash_role_arguments: role {role!r} has no {path}; expected one of "
                                    f"{sorted(p.parents[1].name for p in roles_dir.glob('*/meta/argument_specs.yml'))}")
        _SPECS[key] = (yaml.safe_load(path.read_text()) or {}).get("argument_specs") or {}
    return _SPECS[key]


def entry_spec(name: str, roles_dir: Path = ROLES_DIR) -> tuple[str, str, dict[str, Any]]:
    """`role` or `role:entry` -> (role, entry, the entry point's options)."""
    role, _, entry = name.partition(":")
    entry = entry or "main"
    specs = role_specs(role, roles_dir)
    if entry not in specs:
        raise AnsibleActionFail(f"dflash_role_arguments: role {role!r} has no entry point {entry!r} in its argument "
                                f"specs (it has {sorted(specs)})")
    return role, entry, specs[entry].get("options") or {}


def validate(options: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """Ansible's own role validation of `values` against `options`; the options absent from `values` are not
    required here (they are deferred or come from the role's defaults)."""
    spec = copy.deepcopy(options)
    for name, attrs in spec.items():
        if name not in values and isinstance(attrs, dict):
            attrs["required"] = False
    result = ArgumentSpecValidator(spec).validate(values, validate_role_argument_spec=True)
    return list(result.error_messages)


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    """Validate the options of `entry_points` (list of `role` or `role:entry`) from the task's variables."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        entry_points = self._task.args.get("entry_points")
        if not isinstance(entry_points, list) or not all(isinstance(e, str) for e in entry_points) or not entry_points:
            raise AnsibleActionFail("dflash_role_arguments: entry_points must be a non-empty list of 'role' or "
                                    f"'role:entry' names; found {entry_points!r}")
        failures: list[str] = []
        deferred: dict[str, list[str]] = {}
        checked: dict[str, int] = {}
        for name in entry_points:
            role, entry, options = entry_spec(name)
            values: dict[str, Any] = {}
            for option in options:
                if option not in task_vars:
                    continue
                try:
                    values[option] = self._templar.template(task_vars[option])
                except AnsibleUndefinedVariable:
                    deferred.setdefault(f"{role}:{entry}", []).append(option)
            errors = validate(options, values)
            checked[f"{role}:{entry}"] = len(values)
            failures += [f"role {role}, entry point {entry}: {message}" for message in errors]
        result.update(changed=False, checked=checked, deferred=deferred)
        if failures:
            result.update(failed=True, argument_errors=failures,
                          msg="Validation of arguments failed (fix the variable in group_vars, host_vars or -e):\n"
                              + "\n".join(failures))
        else:
            result["msg"] = f"arguments of {len(entry_points)} role entry points valid"
        return result
