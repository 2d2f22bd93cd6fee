"""The lists of docs/architecture.md and README.md's repository layout, held against the tree both ways: everything
listed exists, and everything in the tree is listed.

What each list is, and what it is held against:

- docs/architecture.md, "Playbooks": the first cell of each table row (a backticked path) against every playbook of
  the repository root (a top-level .yml file whose plays have `hosts` or `import_playbook`), every
  `playbooks/*.yml` and every shared task file `playbooks/tasks/*.yml`.
- "Roles (`roles/`)": the first cell of each row against the folders of `roles/`. The third cell's backticked
  names (paths left out) are the role's entry points. A role's entry points are, exactly: the entry points of its
  `meta/argument_specs.yml`, plus every `tasks_from` that a file outside the role (deploy_dflash.yml,
  playbooks/, another role's tasks) names in an `include_role` or `import_role` of it. Task files a role includes
  only from its own files are not entry points. Every entry point listed is a file `roles/<role>/tasks/<name>.yml`.
- "Modules (`library/`) ...": the first cell of each row against `library/*.py`; every `module_utils/<package>/`
  named in the section against the packages of `module_utils/`.
- "Action and callback plugins": the first backticked path of each bullet against `action_plugins/*.py`,
  `callback_plugins/*.py`.
- "Filter plugins (`filter_plugins/`)": every backticked `<name>.py` against `filter_plugins/*.py`.
- "The library (`dflash_infra/`)": the backticked names of each row's first cell against the modules
  (`dflash_infra/*.py` but `__init__.py`) and folders of `dflash_infra/`.
- README.md, "Architecture", the layout block: every entry's path (its first word) exists. The entries
  `playbooks/`, `roles/`, `library/`, `module_utils/`, `action_plugins/`, `callback_plugins/`
  and `filter_plugins/` list names: what follows the entry's last colon, with parenthesised notes dropped, split
  at commas and semicolons, each item one name. They are held against the same folders as above (`playbooks/`:
  a bare name is `playbooks/<name>.yml` and those are all of `playbooks/*.yml`; a path under it must exist).

Pure file reading: no Ansible run, no lab.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
ROLE_KEYS = {f"{prefix}{verb}_role" for prefix in ("", "ansible.builtin.") for verb in ("include", "import")}
BACKTICKED = re.compile(r"`([^`]+)`")
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def sections(path: Path) -> dict[str, str]:
    """Each heading's text (without its #s) -> the lines under it up to the next heading."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            current = found.setdefault(heading.group(1).strip(), [])
            continue
        if current is not None:
            current.append(line)
    return {title: "\n".join(lines) for title, lines in found.items()}


def section(path: Path, start: str) -> str:
    """The one section of `path` whose heading starts with `start`."""
    matching = [text for title, text in sections(path).items() if title.startswith(start)]
    assert len(matching) == 1, f"{path.relative_to(ROOT)}: expected one heading starting {start!r}, found " \
                               f"{len(matching)}"
    return matching[0]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every markdown table in `text`, as lists of cells (header and separator rows left out)."""
    rows: list[list[str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        if re.match(r"^\|[\s|:-]+\|$", line):
            continue
        if i + 1 < len(lines) and re.match(r"^\|[\s|:-]+\|$", lines[i + 1]):
            continue  # a header row
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def first_backticked(cell: str, where: str) -> str:
    names = BACKTICKED.findall(cell)
    assert names, f"{where}: expected a backticked name in {cell!r}"
    return names[0]


def files(folder: str, pattern: str = "*.py") -> set[str]:
    return {p.name for p in (ROOT / folder).glob(pattern) if p.is_file() and p.name != "__init__.py"}


def compare(what: str, listed: set[str], tree: set[str], tree_where: str) -> None:
    missing, unlisted = sorted(listed - tree), sorted(tree - listed)
    assert not missing and not unlisted, (
        f"{what}: listed but not in {tree_where}: {missing or 'none'}; in {tree_where} but not listed: "
        f"{unlisted or 'none'}")


# The tree ----------------------------------------------------------------------------------------------------------


def top_level_playbooks() -> set[str]:
    found = set()
    for path in ROOT.glob("*.yml"):
        content = yaml.safe_load(path.read_text())
        if isinstance(content, list) and content and all(
                isinstance(play, dict) and ("hosts" in play or "import_playbook" in play
                                            or "ansible.builtin.import_playbook" in play) for play in content):
            found.add(path.name)
    return found


def tree_playbooks() -> set[str]:
    return (top_level_playbooks() | {f"playbooks/{name}" for name in files("playbooks", "*.yml")}
            | {f"playbooks/tasks/{name}" for name in files("playbooks/tasks", "*.yml")})


def tree_roles() -> set[str]:
    return {p.name for p in (ROOT / "roles").iterdir() if p.is_dir()}


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def role_calls() -> Iterator[tuple[Path, str, str]]:
    """(file, role, tasks_from) of every include_role/import_role, and every play's `roles:` entry, in the root's
    playbooks, playbooks/*.yml, playbooks/tasks/*.yml and the roles' tasks and handlers."""
    paths = [ROOT / name for name in sorted(top_level_playbooks())]
    for pattern in ("playbooks/*.yml", "playbooks/tasks/*.yml", "roles/*/tasks/*.yml", "roles/*/handlers/*.yml"):
        paths += sorted(ROOT.glob(pattern))
    for path in paths:
        for node in walk(yaml.safe_load(path.read_text())):
            for key in ROLE_KEYS & node.keys():
                call = node[key]
                if isinstance(call, dict) and "name" in call:
                    yield path, str(call["name"]), str(call.get("tasks_from", "main"))
            roles = node.get("roles") if "hosts" in node else None
            for entry in roles if isinstance(roles, list) else []:
                name = entry if isinstance(entry, str) else entry.get("role", entry.get("name"))
                yield path, str(name), "main"


def tree_entry_points() -> dict[str, set[str]]:
    """Each role's entry points: its argument specs, plus the tasks_from other files name (see the module's
    docstring)."""
    found: dict[str, set[str]] = {}
    for role in tree_roles():
        spec_file = ROOT / "roles" / role / "meta" / "argument_specs.yml"
        specs = yaml.safe_load(spec_file.read_text()) if spec_file.is_file() else None
        found[role] = set((specs or {}).get("argument_specs") or {})
    for path, role, tasks_from in role_calls():
        where = path.relative_to(ROOT)
        assert "{{" not in role and "{{" not in tasks_from, \
            f"{where}: a templated role or tasks_from ({role}, {tasks_from}) cannot be checked against the docs"
        if where.parts[:2] == ("roles", role):
            continue
        found.setdefault(role, set()).add(Path(tasks_from).stem)
    return found


def tree_module_utils() -> set[str]:
    return {p.name for p in (ROOT / "module_utils").iterdir() if (p / "__init__.py").is_file()}


def tree_library() -> set[str]:
    return files("dflash_infra") | {f"{p.name}/" for p in (ROOT / "dflash_infra").iterdir()
                                    if p.is_dir() and p.name != "__pycache__"}


# docs/architecture.md ----------------------------------------------------------------------------------------------


def doc_roles() -> dict[str, set[str]]:
    where = "docs/architecture.md, Roles"
    listed: dict[str, set[str]] = {}
    for row in table_rows(section(ARCHITECTURE, "Roles (`roles/`)")):
        assert len(row) == 3, f"{where}: expected 3 cells (role, owns, entry points), found {len(row)}: {row}"
        listed[first_backticked(row[0], where)] = {n for n in BACKTICKED.findall(row[2]) if NAME.match(n)}
    return listed


def test_every_playbook_and_shared_task_file_is_listed_and_every_one_listed_exists() -> None:
    where = "docs/architecture.md, Playbooks"
    listed = {first_backticked(row[0], where) for row in table_rows(section(ARCHITECTURE, "Playbooks"))}
    compare(where, listed, tree_playbooks(), "the tree (root playbooks, playbooks/, playbooks/tasks/)")


def test_every_role_is_listed_and_every_role_listed_exists() -> None:
    compare("docs/architecture.md, Roles", set(doc_roles()), tree_roles(), "roles/")


def test_each_roles_entry_points_are_listed_and_exist() -> None:
    listed, tree = doc_roles(), tree_entry_points()
    problems = []
    for role in sorted(set(listed) & set(tree)):
        missing, unlisted = sorted(listed[role] - tree[role]), sorted(tree[role] - listed[role])
        if missing or unlisted:
            problems.append(f"{role}: listed but not an entry point (no spec, no tasks_from from outside the "
                            f"role): {missing or 'none'}; entry points not listed: {unlisted or 'none'}")
        absent = sorted(n for n in listed[role] if not (ROOT / "roles" / role / "tasks" / f"{n}.yml").is_file())
        if absent:
            problems.append(f"{role}: listed entry points without roles/{role}/tasks/<name>.yml: {absent}")
    assert not problems, "docs/architecture.md, Roles, entry points:\n" + "\n".join(problems)


def test_every_module_is_listed_and_every_module_listed_exists() -> None:
    where = "docs/architecture.md, Modules"
    text = section(ARCHITECTURE, "Modules (`library/`)")
    compare(where, {first_backticked(row[0], where) for row in table_rows(text)},
            {Path(name).stem for name in files("library")}, "library/")
    compare(f"{where}, module_utils packages", set(re.findall(r"`module_utils/([a-z0-9_]+)/`", text)),
            tree_module_utils(), "module_utils/")


def test_every_action_lookup_and_callback_plugin_is_listed_and_every_one_listed_exists() -> None:
    where = "docs/architecture.md, Action and callback plugins"
    bullets = [line for line in section(ARCHITECTURE, "Action and callback plugins").splitlines()
               if line.startswith("- ")]
    tree = {f"{folder}/{name}" for folder in ("action_plugins", "callback_plugins")
            for name in files(folder)}
    compare(where, {first_backticked(line, where) for line in bullets}, tree,
            "action_plugins/, callback_plugins/")


def test_every_filter_plugin_is_listed_and_every_one_listed_exists() -> None:
    text = section(ARCHITECTURE, "Filter plugins (`filter_plugins/`)")
    listed = {name for name in BACKTICKED.findall(text) if re.match(r"^[a-z0-9_]+\.py$", name)}
    compare("docs/architecture.md, Filter plugins", listed, files("filter_plugins"), "filter_plugins/")


def test_every_library_module_is_listed_and_every_one_listed_exists() -> None:
    where = "docs/architecture.md, The library"
    listed = {name for row in table_rows(section(ARCHITECTURE, "The library (`dflash_infra/`)"))
              for name in BACKTICKED.findall(row[0])}
    compare(where, listed, tree_library(), "dflash_infra/ (modules but __init__.py, folders)")


# README.md's layout block ------------------------------------------------------------------------------------------

LAYOUT_LISTS = {
    "playbooks/": None,
    "roles/": tree_roles,
    "library/": lambda: {Path(n).stem for n in files("library")},
    "module_utils/": lambda: {f"{n}/" for n in tree_module_utils()},
    "action_plugins/": lambda: {Path(n).stem for n in files("action_plugins")},
    "callback_plugins/": lambda: {Path(n).stem for n in files("callback_plugins")},
    "filter_plugins/": lambda: {Path(n).stem for n in files("filter_plugins")},
}


def layout() -> dict[str, str]:
    """README.md's layout block: each entry's path -> its text (continuation lines joined)."""
    entries: dict[str, str] = {}
    current: str | None = None
    for line in section(README, "Architecture").splitlines():
        entry = re.match(r"^ {4}(\S+) {2,}(\S.*)$", line)
        if entry:
            current = entry.group(1)
            entries[current] = entry.group(2)
        elif current and re.match(r"^ {5,}\S", line):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def layout_names(entry: str, text: str) -> set[str]:
    """The names an entry lists: after its last colon, parenthesised notes dropped, split at commas and
    semicolons."""
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    items = [item.strip() for item in re.split(r"[,;]", text.rpartition(":")[2]) if item.strip()]
    odd = [item for item in items if not re.match(r"^[a-z0-9_./]+$", item)]
    assert not odd, f"README.md layout, {entry}: expected a list of names, found items that are not one: {odd}"
    return set(items)


def test_every_path_of_the_readme_layout_exists() -> None:
    absent = sorted(path for path in layout() if not (ROOT / path).exists())
    assert not absent, f"README.md layout: entries whose path is not in the tree: {absent}"


@pytest.mark.parametrize("entry", sorted(LAYOUT_LISTS))
def test_each_readme_layout_list_names_what_its_folder_holds(entry: str) -> None:
    entries = layout()
    assert entry in entries, f"README.md layout: expected an entry {entry}, found {sorted(entries)}"
    listed = layout_names(entry, entries[entry])
    tree_of = LAYOUT_LISTS[entry]
    if tree_of is None:
        paths = {name for name in listed if "/" in name}
        absent = sorted(p for p in paths if not (ROOT / "playbooks" / p).is_file())
        assert not absent, f"README.md layout, playbooks/: listed paths not under playbooks/: {absent}"
        compare("README.md layout, playbooks/", listed - paths, {Path(n).stem for n in files("playbooks", "*.yml")},
                "playbooks/*.yml")
    else:
        compare(f"README.md layout, {entry}", listed, tree_of(), entry)
