"""callback_plugins/dflash_preload.py as Ansible runs it: a real ansible-playbook on localhost whose task worker
reports what it inherited from the main process (a filter, templated in the worker, reads the garbage collector's
state there).

With the project's ansible.cfg the worker's collector has the main process's objects frozen out of it and a first
generation of 50,000 allocations; with the plugin left out (the same run, callbacks_enabled empty) it has Python's
defaults, so the test can tell the two apart.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import ROOT, ansible_environment, run, tool

PLAYBOOK = """\
- name: Report the task worker's garbage collector
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The collector as the worker sees it
      ansible.builtin.debug:
        msg: "GC={{ 0 | worker_gc | to_json }}"
"""

FILTER = '''\
import gc


def worker_gc(_):
    return {"frozen": gc.get_freeze_count(), "threshold": list(gc.get_threshold())}


class FilterModule:
    def filters(self):
        return {"worker_gc": worker_gc}
'''


def worker_gc(tmp_path: Path, preload: bool) -> dict[str, object]:
    """The task worker's collector, in a run with the project's ansible.cfg (or that file without the plugin)."""
    (tmp_path / "filters").mkdir(exist_ok=True)
    (tmp_path / "filters" / "worker_gc.py").write_text(FILTER)
    (tmp_path / "gc.yml").write_text(PLAYBOOK)
    config = (ROOT / "ansible.cfg").read_text()
    assert "\ncallbacks_enabled = dflash_preload\n" in config
    if not preload:
        config = config.replace("\ncallbacks_enabled = dflash_preload\n", "\n")
    (tmp_path / "ansible.cfg").write_text(config.replace("= callback_plugins", f"= {ROOT / 'callback_plugins'}"))
    env = ansible_environment()
    env.update(ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_FILTER_PLUGINS=f"{ROOT / 'filter_plugins'}:{tmp_path / 'filters'}",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_LOCALHOST_WARNING="False")
    result = run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(tmp_path / "gc.yml")], env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if "GC=" in line)
    return json.loads(line.split("GC=", 1)[1].rstrip("'\""))


def test_the_task_worker_inherits_a_frozen_heap_and_a_larger_first_generation(tmp_path: Path) -> None:
    preloaded = worker_gc(tmp_path, preload=True)
    assert preloaded["frozen"] > 10_000, preloaded  # the main process's objects: plugins, play, variables
    assert preloaded["threshold"] == [50_000, 20, 20], preloaded

    bare = worker_gc(tmp_path, preload=False)
    assert bare["frozen"] == 0 and bare["threshold"][0] == 700, bare
