"""Every wait of the deploy ends on its last attempt and lets the check after it say why (stop 52's note).

A probe that answers "waiting" exits 0 (sglang-ready, smg-ctl ready), so an `until` that simply runs out fails its
task with no message ("did not come up healthy: " and nothing after it). Each wait in roles/ therefore also ends
when `<register>.attempts` passes the task's own `retries`, and what follows it (an assert, or the rollback's
outcome) words the state the probe last answered. Read from the files; no Ansible run.
"""

from __future__ import annotations

import re

from test_task_names import ROOT, tasks_of

WAITS = {  # the waits of the deploy, and the registered result the task after each reads
    "roles/smg_gateway/tasks/gate.yml": "_smg_gateway_gate",
    "roles/sglang_service/tasks/converge.yml": "_sglang_service_gate",
    "roles/sglang_service/tasks/rollback.yml": "_sglang_service_restored_gate",
}


def role_waits() -> dict[str, dict[str, object]]:
    """file:line -> task, of every task with an `until` in the roles' task files."""
    return {f"{path.relative_to(ROOT)}:{task['__line__']}": task for path in sorted(ROOT.glob("roles/*/tasks/*.yml"))
            for task in tasks_of(path) if "until" in task}


def ends_on_its_last_attempt(task: dict[str, object]) -> bool:
    """The until is true at the last attempt: it reads `<register>.attempts` against the task's retries."""
    register, retries = str(task.get("register", "")), str(task.get("retries", ""))
    name = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", retries)
    until = str(task["until"])
    return bool(register and name and re.search(
        rf"\b{re.escape(register)}\.attempts\b.*>\s*{re.escape(name.group(1))}\b", until, re.DOTALL))


def test_the_walk_finds_every_wait_of_the_deploy() -> None:
    assert {place.split(":")[0] for place in role_waits()} == set(WAITS)


def test_every_wait_ends_on_its_last_attempt_and_is_read_after_it() -> None:
    for place, task in role_waits().items():
        assert ends_on_its_last_attempt(task), f"{place}: the until does not end the wait on its last attempt"
        assert task.get("register") == WAITS[place.split(":")[0]], place


def test_a_wait_that_only_runs_out_is_found() -> None:
    """The rule fails a plain `until` and one compared with another count."""
    base = {"name": "Wait", "ansible.builtin.command": {"argv": ["probe"]}, "register": "_w",
            "retries": "{{ _n }}", "delay": 1}
    plain = {**base, "until": "(_w.stdout | from_json).state != 'waiting'"}
    other = {**base, "until": "(_w.stdout | from_json).state != 'waiting' or _w.attempts | int > _m | int"}
    good = {**base, "until": "(_w.stdout | from_json).state != 'waiting' or _w.attempts | default(1) | int > _n | int"}
    assert [ends_on_its_last_attempt(t) for t in (plain, other, good)] == [False, False, True]
