"""lookup_plugins/dflash_template.py: the built-in template lookup without its deep copy of every variable."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from ansible.plugins.lookup import template as builtin

from helpers import HOST_PYTHON, ROOT, run, tool

sys.path.insert(0, str(ROOT / "lookup_plugins"))
import dflash_template

TEMPLATE = """{{ ansible_managed | comment }}
# {{ template_path | basename }}
{% for name, value in (settings | dictsort) %}
{{ name }}={{ value }}
{% endfor %}
ExecStart={{ argv | join(' \\\\\\n    ') }}
"""


def test_renders_what_the_builtin_lookup_renders(tmp_path: Path, ansible_env) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "unit.j2").write_text(TEMPLATE)
    (tmp_path / "play.yml").write_text("""- hosts: localhost
  gather_facts: false
  vars:
    settings: {B: 2, A: "x y"}
    argv: [/usr/bin/python3, -m, sglang.launch_server, --port, "30001"]
    big: "{{ range(2000) | map('string') | list }}"
  tasks:
    - ansible.builtin.copy:
        content: "{{ lookup('dflash_template', 'unit.j2') }}"
        dest: "{{ playbook_dir }}/ours.txt"
        mode: "0644"
    - ansible.builtin.copy:
        content: "{{ lookup('ansible.builtin.template', 'unit.j2') }}"
        dest: "{{ playbook_dir }}/builtin.txt"
        mode: "0644"
""")
    proc = run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local",
                "-e", f"ansible_python_interpreter={HOST_PYTHON}", str(tmp_path / "play.yml")], env=ansible_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = (tmp_path / "ours.txt").read_text()
    assert ours == (tmp_path / "builtin.txt").read_text()
    assert "A=x y\nB=2\n" in ours and "# unit.j2" in ours and "--port \\\n    30001" in ours


def test_the_builtin_deep_copy_is_back_after_a_render_that_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def failing_run(self, terms, variables=None, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(builtin.deepcopy)
        raise RuntimeError("render failed")

    monkeypatch.setattr(builtin.LookupModule, "run", failing_run)
    with pytest.raises(RuntimeError, match="render failed"):
        dflash_template.LookupModule().run(["x.j2"], {})
    assert seen == [copy.copy]  # shallow while it ran
    assert builtin.deepcopy is copy.deepcopy  # and the built-in's own again after
