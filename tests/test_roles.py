"""Role contracts: every role's defaults and argument specs agree, a required option has no default (so the
spec check fires, and a role called without it names it), and every role variable carries its role's prefix."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import ROOT, tool

ROLES = sorted(p.parents[1].name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def specs(role: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return data["argument_specs"]


def defaults(role: str) -> dict[str, Any]:
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def test_every_role_has_an_argument_spec() -> None:
    assert sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir()) == ROLES


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_the_spec_agree(role: str) -> None:
    options: dict[str, Any] = {}
    for spec in specs(role).values():
        options.update(spec.get("options") or {})
    values = defaults(role)
    for name, value in values.items():
        assert name in options, f"{role}: defaults/main.yml sets {name}, which no entry point's spec lists"
        assert options[name].get("default") == value, f"{role}: {name} defaults to {value!r}, the spec says " \
                                                      f"{options[name].get('default')!r}"
    for entry, spec in specs(role).items():
        for name, option in (spec.get("options") or {}).items():
            if "default" in option:
                assert values.get(name) == option["default"], \
                    f"{role} {entry}: {name}'s default is not defaults/main.yml's"


@pytest.mark.parametrize("role", ROLES)
def test_a_required_option_has_no_default(role: str) -> None:
    values = defaults(role)
    for entry, spec in specs(role).items():
        for name, option in (spec.get("options") or {}).items():
            if option.get("required"):
                assert "default" not in option and name not in values, \
                    f"{role} {entry}: {name} is required and has a default, so the spec check could never fire"


@pytest.mark.parametrize("role", ROLES)
def test_role_variables_carry_the_role_prefix(role: str) -> None:
    names = set(defaults(role))
    vars_file = ROOT / "roles" / role / "vars" / "main.yml"
    if vars_file.exists():
        names |= set(yaml.safe_load(vars_file.read_text()) or {})
    for spec in specs(role).values():
        names |= set(spec.get("options") or {})
    wrong = sorted(n for n in names if not re.match(rf"^_?{role}_", n))
    assert wrong == [], f"{role}: variables without the prefix {role}_: {wrong}"


REQUIRED = {role: sorted(n for n, o in (specs(role)["main"].get("options") or {}).items() if o.get("required"))
            for role in ROLES}


@pytest.mark.parametrize("role", [r for r in ROLES if REQUIRED[r]])
def test_a_role_called_without_its_required_options_names_them(role: str, tmp_path: Path) -> None:
    # From an empty folder, with an inventory of its own: no group_vars set the role's inputs.
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_FILTER_PLUGINS=str(ROOT / "filter_plugins"),
               ANSIBLE_LIBRARY=str(ROOT / "library"), ANSIBLE_MODULE_UTILS=str(ROOT / "module_utils"),
               ANSIBLE_ACTION_PLUGINS=str(ROOT / "action_plugins"), ANSIBLE_LOOKUP_PLUGINS=str(ROOT / "lookup_plugins"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    playbook = tmp_path / "call.yml"
    playbook.write_text(f"- hosts: localhost\n  gather_facts: false\n  roles: [{role}]\n")
    proc = subprocess.run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"missing required arguments: {', '.join(REQUIRED[role])}" in out, out[-3000:]
