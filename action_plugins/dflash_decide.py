"""Action plugin dflash_decide: a stage's checks and decisions from host_state in one controller task.

A stage that decides from host_state used to spend a task on each step (an assert of its inputs, a set_fact per
comparison, another for the record); every task costs the controller about 0.05-0.1 s, also when nothing differs.
This task takes what the stage decided (computed by the project's filters, templated by Ansible as any task's
arguments) and:

- fails when `problems` (a list of strings) is not empty, with `fail_msg` and every problem, before anything changes;
- otherwise returns the mapping `decided` as the keys of its result, so the stage registers it
  (`register: _stage`, then `_stage.todo`, `_stage.record`), and says `msg` when given: in the result, and printed
  under the task when the stdout callback is the default one or ansible-runner's (which show an ok result's keys
  only with -v); a machine-readable callback (json) keeps its output clean.

It runs nothing on the host and never reports changed. Registered, not set as facts: this project keeps facts under
`ansible_facts` (inject_facts_as_vars = False), and a registered result is a variable of the host like a set_fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible import constants as C
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
# The stdout callbacks that print task results for people: the default one, and ansible-runner's (its events carry
# the default callback's lines). Any other (json, ...) gets the msg in the result only.
HUMAN_CALLBACKS = frozenset({"default", "ansible.builtin.default", "awx_display"})

# Keys Ansible gives a meaning in a task result: a decision must not be named like them.
RESERVED = frozenset({"changed", "failed", "skipped", "msg", "rc", "results", "invocation", "ansible_facts",
                      "warnings", "deprecations", "exception", "diff", "unreachable"})


def decide(args: Mapping[str, Any]) -> dict[str, Any]:
    """The task's result for its (templated) arguments; see the module docstring."""
    unknown = sorted(set(args) - {"problems", "fail_msg", "msg", "decided"})
    if unknown:
        return {"failed": True, "msg": f"dflash_decide: unknown argument(s) {unknown}; expected problems, fail_msg, "
                                       "msg, decided"}
    problems = args.get("problems") or []
    decided = args.get("decided") or {}
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        return {"failed": True, "msg": f"dflash_decide: problems must be a list of strings; found {problems!r}"}
    if not isinstance(decided, Mapping):
        return {"failed": True, "msg": f"dflash_decide: decided must be a mapping; found {type(decided).__name__}"}
    clash = sorted(k for k in decided if k in RESERVED or str(k).startswith(("_ansible", "ansible_")))
    if clash:
        return {"failed": True, "msg": f"dflash_decide: decided may not use the result key(s) {clash}; rename them"}
    if problems:
        prefix = str(args.get("fail_msg") or "").rstrip()
        return {"failed": True, "changed": False, "problems": problems,
                "msg": f"{prefix + ' ' if prefix else ''}{' | '.join(problems)}"}
    result: dict[str, Any] = {"changed": False, **decided}
    if args.get("msg"):
        result["msg"] = str(args["msg"])
    return result


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    """See the module docstring."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        outcome = decide(self._task.args)
        if outcome.get("msg") and not outcome.get("failed") and \
                C.DEFAULT_STDOUT_CALLBACK in HUMAN_CALLBACKS:
            display.display(str(outcome["msg"]))
        return {**result, **outcome}
