"""How deep task files include task files, from each playbook (issue 44 asks for at most 4).

A chain starts at a playbook of the project (`deploy_dflash.yml`, `playbooks/*.yml`) and follows every
`import_tasks`/`include_tasks` (a file beside the including one, or under a role's tasks/ when it is a role's), and
every `import_role`/`include_role` (the role's `tasks_from`, else its main.yml), through blocks, rescues and
always sections. The depth of a chain is the number of task files on it: deploy_dflash.yml -> serve_stage.yml is
1. Static imports count as a level too: a reader follows them the same way.

The test holds the deepest chain of today (MOST) so that it only goes down: lower MOST with the change that
shortens it. Pure file reading: no Ansible run, no lab.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Every chain is at most 4 deep. A replica's turn: serve_stage.yml -> serve_replica.yml -> sglang_service's
# converge.yml -> apply.yml (or load, record, rollback); a failed load gate through the gateway: serve_stage.yml
# (whose block around the gateway_load.yml include answers the failure) -> rollback_restarted.yml ->
# rollback_replica.yml -> sglang_service's rollback.yml. The load gate stays an include: as a block, its tasks would
# each be skipped, and each costs, on every run that restarts nothing.
MOST = 4
TARGET = 4  # issue 44
FILE_KEYS = ("import_tasks", "include_tasks")
ROLE_KEYS = ("import_role", "include_role")
BLOCK_SECTIONS = ("block", "rescue", "always")
PLAY_SECTIONS = ("pre_tasks", "tasks", "post_tasks", "handlers")


def tasks_of(items: Any) -> Iterator[dict[str, Any]]:
    for task in items or []:
        if not isinstance(task, dict):
            continue
        yield task
        for section in BLOCK_SECTIONS:
            yield from tasks_of(task.get(section))


def action(task: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        for name in (key, f"ansible.builtin.{key}"):
            if name in task:
                return task[name]
    return None


def role_folder(path: Path) -> Path | None:
    """The role a task file belongs to (roles/<role>/), if any."""
    parts = path.relative_to(ROOT).parts
    return ROOT / "roles" / parts[1] if parts[0] == "roles" else None


def targets(path: Path, tasks: Any) -> Iterator[Path]:
    """The task files the tasks of `path` include or import."""
    for task in tasks_of(tasks):
        name = action(task, FILE_KEYS)
        if isinstance(name, dict):
            name = name.get("file")
        if isinstance(name, str) and "{{" not in name:
            role = role_folder(path)
            beside = path.parent / name
            yield beside if beside.exists() or role is None else role / "tasks" / name
        spec = action(task, ROLE_KEYS)
        if isinstance(spec, dict) and "{{" not in str(spec.get("name")):
            yield ROOT / "roles" / str(spec["name"]) / "tasks" / f"{spec.get('tasks_from', 'main')}.yml"


@cache
def deepest_from(path: Path) -> tuple[Path, ...]:
    """The longest chain of task files starting at the task file `path` (itself included)."""
    below = [deepest_from(target) for target in targets(path, yaml.safe_load(path.read_text()))
             if target.exists()]
    return (path, *max(below, key=len, default=()))


def playbooks() -> list[Path]:
    return [ROOT / "deploy_dflash.yml", *sorted((ROOT / "playbooks").glob("*.yml"))]


def deepest_chains() -> dict[Path, tuple[Path, ...]]:
    chains = {}
    for playbook in playbooks():
        plays = yaml.safe_load(playbook.read_text()) or []
        tasks = [task for play in plays if isinstance(play, dict) for section in PLAY_SECTIONS
                 for task in play.get(section) or []]
        below = [deepest_from(target) for target in targets(playbook, tasks) if target.exists()]
        chains[playbook] = max(below, key=len, default=())
    return chains


def show(playbook: Path, chain: tuple[Path, ...]) -> str:
    return " -> ".join(str(p.relative_to(ROOT)) for p in (playbook, *chain))


def test_no_playbook_includes_deeper_than_today() -> None:
    chains = deepest_chains()
    deeper = {p: c for p, c in chains.items() if len(c) > MOST}
    chains_text = "\n".join(show(p, c) for p, c in deeper.items())
    assert not deeper, f"deeper than MOST ({MOST}; issue 44 wants {TARGET}):\n{chains_text}"


def test_the_deepest_chain_is_named() -> None:
    """MOST is today's figure, not a loose bound: the deepest chain has exactly MOST task files."""
    chains = deepest_chains()
    playbook, chain = max(chains.items(), key=lambda item: len(item[1]))
    assert len(chain) == MOST, f"the deepest chain is now {len(chain)} deep: lower MOST to it\n{show(playbook, chain)}"


def test_a_chain_follows_task_files_and_roles() -> None:
    """The walk itself, on a chain the project has: task files beside each other, then a role's entry point and the
    files the role includes from its own tasks/."""
    chain = deepest_from(ROOT / "playbooks" / "tasks" / "serve_replica.yml")
    names = [str(p.relative_to(ROOT)) for p in chain]
    assert names[:2] == ["playbooks/tasks/serve_replica.yml", "roles/sglang_service/tasks/converge.yml"], names
    assert names[2] in [f"roles/sglang_service/tasks/{step}.yml" for step in ("apply", "load", "record", "rollback")], \
        names
    stage = deepest_from(ROOT / "playbooks" / "tasks" / "serve_stage.yml")
    assert len(chain) == 3  # a replica's turn: the turn, the engine's converge, one of its steps
    assert len(deepest_chains()[ROOT / "deploy_dflash.yml"]) == len(stage) == MOST
