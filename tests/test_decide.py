"""action_plugins/dflash_decide.py: a stage's checks and decisions in one controller task."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import HOST_PYTHON, ROOT, run, tool

sys.path.insert(0, str(ROOT / "action_plugins"))
import dflash_decide


def test_no_problem_returns_the_decision_as_result_keys() -> None:
    result = dflash_decide.decide({"problems": [], "msg": "fine", "decided": {"todo": {"any": False}, "sha": "ab"}})
    assert result == {"changed": False, "msg": "fine", "todo": {"any": False}, "sha": "ab"}


def test_problems_fail_with_the_message_and_every_problem() -> None:
    result = dflash_decide.decide({"problems": ["keys are wrong", "no workers"], "fail_msg": "ct200: gw:",
                                   "decided": {"todo": {}}})
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == "ct200: gw: keys are wrong | no workers"
    assert "todo" not in result


def test_refuses_what_it_cannot_mean() -> None:
    assert "unknown argument(s) ['that']" in dflash_decide.decide({"that": []})["msg"]
    assert "list of strings" in dflash_decide.decide({"problems": "one"})["msg"]
    assert "list of strings" in dflash_decide.decide({"problems": [1]})["msg"]
    assert "must be a mapping" in dflash_decide.decide({"decided": ["x"]})["msg"]
    clash = dflash_decide.decide({"decided": {"changed": True, "ansible_facts": {}, "ok": 1}})
    assert clash["failed"] and "['ansible_facts', 'changed']" in clash["msg"]


def test_in_a_play_the_decision_is_registered_and_a_problem_stops_the_play(tmp_path: Path, ansible_env) -> None:
    (tmp_path / "play.yml").write_text("""- hosts: localhost
  gather_facts: false
  vars:
    workers: [a, b]
  tasks:
    - name: Decide
      dflash_decide:
        problems: "{{ [] if workers | length > 0 else ['no workers'] }}"
        fail_msg: "{{ inventory_hostname }}:"
        msg: "{{ inventory_hostname }} decided on {{ workers | length }} workers"
        decided:
          count: "{{ workers | length }}"
          todo: {any: "{{ workers | length > 1 }}"}
      register: decision
    - name: Write what was registered
      ansible.builtin.copy:
        content: "{{ {'count': decision.count, 'todo': decision.todo, 'changed': decision.changed} | to_json }}"
        dest: "{{ playbook_dir }}/decision.json"
        mode: "0644"
      when: decision.todo.any
""")
    argv = [tool("ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", f"ansible_python_interpreter={HOST_PYTHON}", str(tmp_path / "play.yml")]
    proc = run(argv, env=ansible_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "localhost decided on 2 workers" in proc.stdout  # the msg is said, as a debug task would
    quiet = run(argv, env={**ansible_env, "ANSIBLE_STDOUT_CALLBACK": "json"})  # and kept out of machine output
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["stats"]["localhost"]["failures"] == 0, quiet.stdout
    assert json.loads((tmp_path / "decision.json").read_text()) == {"count": 2, "todo": {"any": True},
                                                                    "changed": False}
    (tmp_path / "decision.json").unlink()
    proc = run([*argv, "-e", '{"workers": []}'], env=ansible_env)
    assert proc.returncode == 2
    assert "localhost: no workers" in proc.stdout
    assert "decided on" not in proc.stdout  # a failure says its problems, not the msg
    assert not (tmp_path / "decision.json").exists()
