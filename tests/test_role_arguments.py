"""The roles' argument specs checked in one task (action_plugins/dflash_role_arguments.py), and every role a playbook
imports with `rolespec_validate: false` covered by that task."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import ROOT, run, tool

sys.path.insert(0, str(ROOT / "action_plugins"))
import dflash_role_arguments as role_arguments

ROLE_KEYS = ("ansible.builtin.import_role", "ansible.builtin.include_role")
TASK_KEYS = ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks")
PLAYBOOKS = ["deploy_dflash.yml", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml"))]


def steps(tasks: list[dict[str, Any]], base: Path) -> list[tuple[str, Any]]:
    """Every role import and dflash_role_arguments task of a task list, in order, through imported task files
    and blocks."""
    found: list[tuple[str, Any]] = []
    for task in tasks or []:
        for key in ("block", "rescue", "always"):
            found += steps(task.get(key) or [], base)
        for key in ROLE_KEYS:
            if key in task:
                found.append(("role", task[key]))
        for key in TASK_KEYS:
            if key in task:
                path = base / task[key]
                found += steps(yaml.safe_load(path.read_text()), path.parent)
        if "dflash_role_arguments" in task:
            found.append(("validate", task["dflash_role_arguments"]["entry_points"]))
    return found


def validated_entries(expression: str, run_entry_points: list[str]) -> set[str]:
    """The entry points a dflash_role_arguments task names: its literal list plus the play's dflash_run_entry_points."""
    literal, _, rest = expression.strip("{} ").partition("]")
    names = yaml.safe_load(literal + "]")
    assert rest.strip() == "+ dflash_run_entry_points", expression
    return {n if ":" in n else f"{n}:main" for n in names + run_entry_points}


@pytest.mark.parametrize("entry", PLAYBOOKS)
def test_every_role_imported_without_its_own_validation_is_validated_earlier_in_the_play(entry: str) -> None:
    path = ROOT / entry
    for play in yaml.safe_load(path.read_text()):
        run_entry_points = (play.get("vars") or {}).get("dflash_run_entry_points", [])
        validated: set[str] = set()
        for kind, value in steps(play.get("tasks") or [], path.parent):
            if kind == "validate":
                validated |= validated_entries(value, run_entry_points)
                continue
            if value.get("rolespec_validate", True):
                continue
            role, entry_point = value["name"], value.get("tasks_from", "main")
            specs = role_arguments.role_specs(role)
            if entry_point not in specs:
                continue  # an entry point without a spec has nothing to validate
            # Covered by a validated entry point of the same role whose options include all of this one's.
            options = set(specs[entry_point].get("options") or {})
            covering = [e for e in validated if e.split(":")[0] == role
                        and options <= set(specs[e.split(":")[1]].get("options") or {})]
            assert covering, f"{entry}: {role}:{entry_point} is imported with rolespec_validate: false, but no " \
                             f"dflash_role_arguments task before it validates it (validated: {sorted(validated)})"
        # A listed entry point exists (the action fails on one that does not, too).
        for name in run_entry_points:
            role_arguments.entry_spec(name)


def test_a_mistyped_value_is_refused_before_any_host_is_contacted_naming_role_and_option(ansible_env) -> None:
    """Production host names do not resolve here, and nothing tries to: the refusal comes before any connection. The
    other group_vars values pass; only the options computed from the host's state or the plan are left for later."""
    proc = run([tool("ansible-playbook"), "deploy_dflash.yml", "-l", "pro6000", "-v", "-e", "sglang_engine_index=maybe",
                "-e", '{"training_stop_match": {"train.py": 1}}'], env=ansible_env)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "Validation of arguments failed" in out, proc.stdout[-3000:]
    # Every wrong option at once, each named with its role and entry point.
    assert "role sglang_engine, entry point main: argument 'sglang_engine_index' is of type str" in out, out[-3000:]
    assert "role training_stop, entry point main: argument 'training_stop_match' is of type dict" in out, out[-3000:]
    assert "UNREACHABLE" not in proc.stdout and "unreachable=0" in proc.stdout
    assert "TASK [host_state" not in proc.stdout
    block = proc.stdout[proc.stdout.index("TASK [Check the arguments of every role"):]
    result = block[block.index("=>") + 2:block.index("    msg:")]
    shown = yaml.safe_load(textwrap.dedent(result.strip("\n")))
    assert set(shown["checked"]) == {"host_state:main", "preflight:main", "nvidia_userspace:plan", "serving_plan:main",
                                     "preflight:serving", "model_sync:check", "training_stop:main",
                                     "sglang_engine:main", "sglang_service:main", "smg_gateway:main",
                                     "model_sync:promote", "deploy_summary:main"}
    assert all(count > 0 for count in shown["checked"].values()), shown
    deferred = {option for options in shown["deferred"].values() for option in options}
    # The engine's read-only paths are the model versions the host holds (host_state), so they wait for it too.
    assert deferred and all(o.endswith(("_state", "_plan", "_lock_status", "_required_argv", "_models",
                                        "_venv_problems", "_read_only_paths")) for o in deferred), deferred


def test_validate_leaves_out_only_what_is_absent_and_checks_the_rest() -> None:
    options = {"a": {"type": "int", "required": True}, "b": {"type": "list", "elements": "str", "required": True}}
    assert role_arguments.validate(options, {"a": 3}) == []
    assert role_arguments.validate(options, {"a": "three"})
    errors = role_arguments.validate(options, {"a": 1, "b": {"x": 1}})
    assert errors and "b" in errors[0]
    assert options["b"]["required"] is True  # the spec itself is not changed


def test_an_unknown_role_or_entry_point_is_named() -> None:
    from ansible.errors import AnsibleActionFail
    with pytest.raises(AnsibleActionFail, match="role 'no_such_role' has no"):
        role_arguments.entry_spec("no_such_role")
    with pytest.raises(AnsibleActionFail, match=r"has no entry point 'nope' in its argument specs \(it has"):
        role_arguments.entry_spec("host_state:nope")
