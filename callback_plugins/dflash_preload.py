"""Callback plugin dflash_preload: prepare the controller's main process for the task workers it forks.

Ansible runs every task in a worker process forked from the main one. Two things make those forks cheaper:

- A filter plugin the main process has not loaded is loaded again in each worker (and with it the planner library
  it adapts), which cost about 0.1 s per task that uses a filter. Loaded here, at start-up, the plugins and the
  library are inherited by every fork.
- Python's cyclic garbage collector, run in a worker, walks every object the worker inherited and so copies the
  memory it shares with the main process (copy-on-write), for a process that lives one task. Before each task is
  forked, everything the main process holds is frozen out of the collector (`gc.freeze()`), and the youngest
  generation is collected after 50,000 allocations instead of 700: a worker allocates briefly and exits.

It prints nothing and changes no result. Measured (docs/architecture.md, Why a no-op is fast): a no-op deploy on the
lab takes 5.66 s without the preload against 4.19 s with it, five paired runs: it saves 26 %. The collector's
settings save 8 % of a no-op's time (0.92x paired, nine runs; 0.88x its CPU) and 19 % of the controller's CPU in
a roll of four replicas through the gateway and back (0.815x paired, three runs; 0.89x its time).
"""

from __future__ import annotations

import gc
from typing import Any

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader

DOCUMENTATION = """
name: dflash_preload
type: aggregate
short_description: Load the filter plugins once and keep the collector out of forked workers
description:
  - Loads every filter plugin (ansible.builtin's and the configured filter_plugins folders) in the main process,
    so forked workers inherit them instead of loading them per task. Freezes what the main process holds out of
    the garbage collector before each task forks, with a larger first generation. Prints nothing.
requirements:
  - enable it in ansible.cfg (callbacks_enabled)
"""


class CallbackModule(CallbackBase):  # type: ignore[misc]  # ansible ships no type information
    """Preloads the filter plugins when Ansible loads its callbacks (once per run, in the main process)."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dflash_preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for _ in filter_loader.all():
            pass
        gc.set_threshold(50_000, 20, 20)

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        """A task's workers fork next: what the main process holds now stays out of their collector."""
        gc.freeze()

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        gc.freeze()
