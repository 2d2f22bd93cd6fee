"""Every task of the project has a name, and no name is longer than 80 characters (issue 44).

The files walked:

- playbooks: `deploy_dflash.yml` (every top-level .yml file whose plays have `hosts` or `import_playbook`),
  `playbooks/*.yml`, `tests/lab/playbooks/*.yml`, and molecule's scenarios (`molecule/**/*.yml` but `molecule.yml`:
  create, destroy, prepare, converge, side_effect, verify);
- task files: `playbooks/tasks/**/*.yml`, `roles/*/tasks/**/*.yml`, `roles/*/handlers/**/*.yml`, and the task files
  of molecule's scenarios (a file of `molecule/` whose items are not plays).

In a playbook, every play's `pre_tasks`, `tasks`, `post_tasks` and `handlers`; in a task file, every item; and in
both, the tasks inside each `block`, `rescue` and `always`, the block itself included. A name is measured as
written (a name with Jinja by its source text: `{{ sglang_service_name }}` counts 25 characters), since that is
what the file holds and, for a literal name, what the play prints after `TASK [`.

Pure file reading: no Ansible run, no lab.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
PLAY_SECTIONS = ("pre_tasks", "tasks", "post_tasks", "handlers")
BLOCK_SECTIONS = ("block", "rescue", "always")
PLAY_KEYS = {"hosts", "import_playbook", "ansible.builtin.import_playbook"}
TASK_GLOBS = ("playbooks/tasks/**/*.yml", "roles/*/tasks/**/*.yml", "roles/*/handlers/**/*.yml")
PLAYBOOK_GLOBS = ("playbooks/*.yml", "tests/lab/playbooks/*.yml")


class LineLoader(yaml.SafeLoader):
    """A safe loader that notes, in `__line__`, the line each mapping starts on."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def load(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=LineLoader)  # a safe loader that adds line numbers


def is_playbook(content: Any) -> bool:
    return isinstance(content, list) and bool(content) and all(
        isinstance(play, dict) and PLAY_KEYS & play.keys() for play in content)


def project_files() -> list[Path]:
    """Every file of the project that holds tasks, playbooks and task files alike (see the module's docstring)."""
    found = [path for path in sorted(ROOT.glob("*.yml")) if is_playbook(load(path))]
    for pattern in (*PLAYBOOK_GLOBS, *TASK_GLOBS):
        found += sorted(ROOT.glob(pattern))
    found += sorted(path for path in ROOT.glob("molecule/**/*.yml") if path.name != "molecule.yml")
    return list(dict.fromkeys(found))


def within(tasks: Any) -> Iterator[dict[str, Any]]:
    """Each task of a list, then the tasks of its block, rescue and always, depth first."""
    for task in tasks or []:
        assert isinstance(task, dict), f"expected a task (a mapping), found {task!r}"
        yield task
        for section in BLOCK_SECTIONS:
            yield from within(task.get(section))


def tasks_of(path: Path) -> Iterator[dict[str, Any]]:
    content = load(path)
    if is_playbook(content):
        for play in content:
            for section in PLAY_SECTIONS:
                yield from within(play.get(section))
    else:
        assert isinstance(content, list), f"{path.relative_to(ROOT)}: expected a list of tasks or plays"
        yield from within(content)


def every_task(paths: list[Path] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file:line, task) of every task of `paths` (every file of the project by default)."""
    for path in project_files() if paths is None else paths:
        for task in tasks_of(path):
            yield f"{path.relative_to(path.parent if paths else ROOT)}:{task['__line__']}", task


def too_long(paths: list[Path] | None = None) -> list[str]:
    return [f"{place}: {len(name)} characters: {name}" for place, task in every_task(paths)
            if len(name := str(task.get("name") or "")) > LIMIT]


def test_the_walk_finds_the_projects_tasks() -> None:
    """The walk reaches every kind of file it is meant to (an empty glob would pass the tests below)."""
    where = {place.split(":")[0] for place, _ in every_task()}
    for expected in ("deploy_dflash.yml", "playbooks/serve.yml", "playbooks/tasks/serve_replica.yml",
                     "roles/sglang_service/tasks/converge.yml", "molecule/sglang_service/verify.yml",
                     "molecule/nvidia_userspace_common/reset.yml", "tests/lab/playbooks/verify_aligned.yml"):
        assert expected in where, f"no task found in {expected}"
    assert sum(1 for _ in every_task()) > 400


def test_every_task_has_a_name() -> None:
    unnamed = [place for place, task in every_task() if not str(task.get("name") or "").strip()]
    assert not unnamed, "tasks without a name:\n" + "\n".join(unnamed)


def test_no_task_name_is_longer_than_80_characters() -> None:
    long = too_long()
    assert not long, f"{len(long)} task name(s) longer than {LIMIT} characters:\n" + "\n".join(long)


def test_the_walk_reaches_into_blocks_and_measures_a_name_as_written(tmp_path: Path) -> None:
    """A play's handlers and the rescue and always of a block in a block are walked; Jinja counts as written."""
    jinja = "Restart the replica that the plan names first, whatever it is, {{ sglang_service_name }}"
    play = [{"hosts": "all", "tasks": [
        {"name": "Serve", "block": [{"name": "Inner", "block": [{"name": "ok", "ansible.builtin.ping": {}}],
                                     "rescue": [{"name": "r" * 81, "ansible.builtin.ping": {}}]}],
         "always": [{"name": jinja, "ansible.builtin.ping": {}}]}],
        "handlers": [{"name": "h" * 82, "ansible.builtin.ping": {}}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    assert [line.split(": ")[1] for line in too_long([path])] == ["81 characters", f"{len(jinja)} characters",
                                                                "82 characters"]
    assert len(jinja) == 88
