#!/usr/bin/python
"""Ansible module dflash_training: stop the training job that holds the GPUs, or start it again from its record."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_training
short_description: Stop the training job holding the GPUs safely, or resume it from its record
description:
  - C(state=stopped) finds the job (the processes of I(unit), else those whose command line matches I(match), else
    the pid in I(pidfile) when that process is older than the file), never a process of the serving engine
    (I(protect_match), I(protect_units)). It writes the record (I(record_path), 0600, the replaced one kept as a
    backup), stops the job (unit mode through systemctl stop and disable; otherwise SIGTERM, I(term_timeout_s),
    SIGKILL, checking each pid's start time so a recycled pid is never signalled), disables I(boot_units), and
    waits until no process but the engine holds the GPUs in I(gpu_ids) (nvidia-smi, I(gpu_free_retries) x
    I(gpu_free_delay_s)). Nothing running is a no-op.
  - C(state=resumed) reads the record and refuses while another process holds the job's GPUs (naming each systemd
    unit once with its pids, and each other pid), unless I(force). It starts the unit again, or the recorded
    command line as a transient systemd unit (systemd-run) in its cwd, as its user, with its kept environment and
    log; enables the boot units again; keeps the record as C(<name>.resumed-<UTC stamp>.json) and removes the
    active one, so a second run is a no-op.
  - Under check mode both say what they would do and change nothing.
options:
  state:
    description: stopped or resumed.
    type: str
    required: true
    choices: [stopped, resumed]
  host:
    description: The host's name in messages and the record; empty for this machine's host name.
    type: str
    default: ""
  record_path:
    description: The record of the stopped job.
    type: path
    default: /var/lib/dflash-infra/stopped-training.json
  unit:
    description: (stopped) systemd unit that runs the job; empty when it was started by hand.
    type: str
    default: ""
  match:
    description: (stopped) Python regular expressions searched in each process's command line.
    type: list
    elements: str
    default: []
  pidfile:
    description: (stopped) Pid file of the job, used when the unit and the match find nothing; empty for none.
    type: str
    default: ""
  protect_match:
    description: (stopped) Command-line patterns of processes that are never stopped (the serving engine).
    type: list
    elements: str
    default: []
  protect_units:
    description: (stopped) systemd units whose processes are never stopped and may hold GPUs afterwards.
    type: list
    elements: str
    default: []
  env_keep:
    description: (stopped) Environment variables whose values are recorded (glob patterns); other names only.
    type: list
    elements: str
  term_timeout_s:
    description: (stopped) Seconds to wait after SIGTERM before SIGKILL.
    type: float
    default: 60
  kill_timeout_s:
    description: (stopped) Seconds to wait after SIGKILL before reporting survivors.
    type: float
    default: 15
  boot_units:
    description: (stopped) Units that start the job at boot; disabled when it is stopped (the resume enables them).
    type: list
    elements: str
    default: []
  disable_unit:
    description: (stopped) Also disable I(unit) in unit mode, so a reboot does not restart the job.
    type: bool
    default: true
  env_file:
    description: (stopped) The job's environment file, recorded for the resume.
    type: str
    default: ""
  resume_command:
    description: (stopped) argv that starts the job again; empty for the recorded command line.
    type: list
    elements: str
    default: []
  gpu_ids:
    description: (stopped) GPU indexes that must be free afterwards; empty for all.
    type: list
    elements: int
    default: []
  nvidia_smi:
    description: The nvidia-smi command.
    type: str
    default: nvidia-smi
  verify_gpus:
    description:
      - (stopped) Read nvidia-smi before the stop (the GPUs the job holds, for the record) and wait until the GPUs
        are free after it. False on a host whose nvidia-smi cannot run (a driver/library mismatch): the job is
        still found and stopped, and its GPUs are checked once the driver is aligned (training_stop tasks_from gpus).
    type: bool
    default: true
  gpu_free_retries:
    description: (stopped) How many times the GPU check is repeated before it fails.
    type: int
    default: 15
  gpu_free_delay_s:
    description: (stopped) Seconds between GPU checks.
    type: float
    default: 2
  force:
    description: (resumed) Start the job even while other processes hold its GPUs.
    type: bool
    default: false
  stop_hints:
    description: (resumed) systemd unit -> the command that stops it properly, named when that unit holds the GPUs.
    type: dict
    default: {}
author: dflash-infra
"""

EXAMPLES = r"""
- name: Stop the training job and verify the GPUs are free
  dflash_training:
    state: stopped
    match: ['(^|/)python3?\s+/root/train\.py(\s|$)']
    protect_units: [sglang-qwen.service]
    gpu_ids: [0, 1]

- name: Resume it
  dflash_training:
    state: resumed
"""

RETURN = r"""
found:
  description: (stopped) The job as found, {mode, notes, roots, descendants, protected}.
  returned: state=stopped
  type: dict
record:
  description: The record of the stopped job (written by the stop, read by the resume); null when none.
  returned: always
  type: dict
stop:
  description: (stopped, signal modes) terminated, killed, already_gone, survivors pids and seconds.
  returned: state=stopped
  type: dict
holders:
  description: Processes holding the checked GPUs (pid, process_name, gpu, used_memory_mib) at the last look.
  returned: when nvidia-smi was read
  type: list
commands:
  description: (resumed) The commands that start the job again (systemctl, or the systemd-run argv).
  returned: state=resumed with a record
  type: list
unit:
  description: (resumed) The unit the job runs in afterwards.
  returned: state=resumed with a record
  type: str
kept_record:
  description: (resumed) Where the resumed record is kept.
  returned: state=resumed with a record
  type: str
msg:
  description: Lines saying what was (or, under check mode, would be) done.
  returned: always
  type: list
"""

import re
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule

if TYPE_CHECKING:
    from dflash_training.errors import TrainingError
    from dflash_training.job import ResumeOptions, StopOptions, resume_job, stop_job
    from dflash_training.selection import DEFAULT_ENV_KEEP
else:
    from ansible.module_utils.dflash_training.errors import TrainingError
    from ansible.module_utils.dflash_training.job import ResumeOptions, StopOptions, resume_job, stop_job
    from ansible.module_utils.dflash_training.selection import DEFAULT_ENV_KEEP

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {"type": "str", "required": True, "choices": ["stopped", "resumed"]},
    "host": {"type": "str", "default": ""},
    "record_path": {"type": "path", "default": "/var/lib/dflash-infra/stopped-training.json"},
    "unit": {"type": "str", "default": ""},
    "match": {"type": "list", "elements": "str", "default": []},
    "pidfile": {"type": "str", "default": ""},
    "protect_match": {"type": "list", "elements": "str", "default": []},
    "protect_units": {"type": "list", "elements": "str", "default": []},
    "env_keep": {"type": "list", "elements": "str"},
    "term_timeout_s": {"type": "float", "default": 60.0},
    "kill_timeout_s": {"type": "float", "default": 15.0},
    "boot_units": {"type": "list", "elements": "str", "default": []},
    "disable_unit": {"type": "bool", "default": True},
    "env_file": {"type": "str", "default": ""},
    "resume_command": {"type": "list", "elements": "str", "default": []},
    "gpu_ids": {"type": "list", "elements": "int", "default": []},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "verify_gpus": {"type": "bool", "default": True},
    "gpu_free_retries": {"type": "int", "default": 15},
    "gpu_free_delay_s": {"type": "float", "default": 2.0},
    "force": {"type": "bool", "default": False},
    "stop_hints": {"type": "dict", "default": {}},
}


def problems(p: dict[str, Any]) -> list[str]:
    """What is wrong with the parameters, each as what was expected and what was found."""
    out = []
    for option in ("match", "protect_match"):
        for pattern in p[option]:
            try:
                re.compile(pattern)
            except re.error as exc:
                out.append(f"{option}: expected Python regular expressions, found {pattern!r} ({exc})")
    for option in ("term_timeout_s", "kill_timeout_s", "gpu_free_retries", "gpu_free_delay_s"):
        if p[option] < 0:
            out.append(f"{option}: expected a number of at least 0, found {p[option]}")
    if any(g < 0 for g in p["gpu_ids"]):
        out.append(f"gpu_ids: expected GPU indexes (0 or more), found {p['gpu_ids']}")
    return out


def stop_options(p: dict[str, Any], host: str) -> StopOptions:
    env_keep = list(DEFAULT_ENV_KEEP) if p["env_keep"] is None else p["env_keep"]
    return StopOptions(host=host, record_path=Path(p["record_path"]), unit=p["unit"], match=p["match"],
                       pidfile=p["pidfile"], protect_match=p["protect_match"], protect_units=p["protect_units"],
                       env_keep=env_keep, term_timeout_s=p["term_timeout_s"], kill_timeout_s=p["kill_timeout_s"],
                       boot_units=p["boot_units"], disable_unit=p["disable_unit"], env_file=p["env_file"],
                       resume_command=p["resume_command"], gpu_ids=p["gpu_ids"], nvidia_smi=p["nvidia_smi"],
                       gpu_free_retries=p["gpu_free_retries"], gpu_free_delay_s=p["gpu_free_delay_s"],
                       verify_gpus=p["verify_gpus"])


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    wrong = problems(p)
    if wrong:
        module.fail_json(msg="dflash_training: " + "; ".join(wrong) + ". Nothing was changed.")
    host = p["host"] or socket.gethostname()
    now = datetime.now(UTC)
    try:
        if p["state"] == "stopped":
            result = stop_job(stop_options(p, host), module.check_mode, now)
        else:
            result = resume_job(ResumeOptions(host, Path(p["record_path"]), p["nvidia_smi"], p["force"],
                                              {str(k): str(v) for k, v in (p["stop_hints"] or {}).items()}),
                                module.check_mode, now)
    except (TrainingError, OSError) as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
