#!/usr/bin/python
"""Ansible module dflash_gateway_worker: take a worker out of the SGLang Model Gateway, put it back, or remove it, on
the gateway's host (the rollout's drain and add, spelled once)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_gateway_worker
short_description: Drain a worker out of the SGLang Model Gateway, add it back, or remove it (on the gateway's host)
description:
  - Runs on the host of the gateway (delegate_to it), through its control plane on that host, with the control-plane
    key read there from I(gateway.credentials) (root only): the key never travels and is never printed.
  - C(state=drained) takes the worker out (DELETE /workers/{id}: no new request; smg removes it after its drain
    settle time), then waits until the engine itself has no request running or waiting (its /v1/loads, with the
    worker's API key), so that the restart that follows cuts no generation short.
  - C(state=present) adds the worker (POST /workers, with its API key) unless it is one already, then waits until the
    gateway says it is ready and healthy. C(state=absent) removes a worker the plan no longer has and waits until it
    is gone (no wait on its engine).
  - The worker's API key comes from I(gateway.key_file) when given (a worker of another host: the endpoint's key, from
    the gateway's credentials), else from I(env_file) (the engine's environment file on this host).
  - Under check mode it only looks (GET /workers) and says whether it would change anything.
  - The work itself is module_utils/dflash_gateway/ctl.py, the same code the host runs as smg-ctl.
options:
  gateway:
    description: The gateway as its host reaches it.
    type: dict
    required: true
    suboptions:
      url: {description: "The gateway's URL on its host (http://127.0.0.1:30000, say).", type: str, required: true}
      credentials: {description: The gateway's credentials folder (its control-plane key)., type: path, required: true}
      key_file: {description: The workers' API key from this file instead of I(env_file)., type: path}
  worker: {description: "The worker's URL, as the gateway lists it.", type: str, required: true}
  state: {description: What the worker must be., type: str, choices: [drained, present, absent], required: true}
  env_file: {description: "The engine's environment file (its API key, SGLANG_API_KEY).", type: path}
  wait: {description: Seconds until it gives up., type: float, default: 120}
  step: {description: Seconds between looks while it waits., type: float, default: 0.5}
  timeout: {description: Seconds per HTTP call., type: float, default: 5}
"""

RETURN = r"""
state: {description: "done, or failed (with C(detail) and C(msg) naming the worker).", type: str, returned: always}
detail: {description: What happened or what was found., type: str, returned: always}
"""

import argparse
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dflash_gateway import ctl

ACTIONS = {"drained": ctl.drain, "present": ctl.add, "absent": ctl.remove}


def look(gateway: ctl.Gateway, worker: str, state: str) -> dict[str, Any]:
    """Check mode: whether the worker is listed decides whether the state would change anything."""
    listed = gateway.worker(worker) is not None
    would = listed != (state == "present")
    return {"state": "done", "changed": would,
            "detail": f"{worker} is {'a' if listed else 'not a'} worker of {gateway.url}"
                      + (f"; it would be {state}" if would else "")}


def run(params: dict[str, Any], check: bool) -> dict[str, Any]:
    options = params["gateway"]
    credentials = Path(options["credentials"])
    gateway = ctl.Gateway(options["url"], credentials / ctl.CONTROL_KEY, params["timeout"])
    args = argparse.Namespace(
        worker=params["worker"], wait=params["wait"], step=params["step"], credentials=credentials,
        env_file=Path(params["env_file"]) if params["env_file"] else None,
        key_file=Path(options["key_file"]) if options.get("key_file") else None)
    try:
        if check:
            return look(gateway, params["worker"], params["state"])
        out: dict[str, Any] = ACTIONS[params["state"]](gateway, args)
    except (OSError, ctl.GatewayError) as exc:
        out = {"state": "failed", "changed": False, "detail": str(exc)}
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gateway": {"type": "dict", "required": True, "options": {
                "url": {"type": "str", "required": True},
                "credentials": {"type": "path", "required": True},
                "key_file": {"type": "path"},
            }},
            "worker": {"type": "str", "required": True},
            "state": {"type": "str", "required": True, "choices": sorted(ACTIONS)},
            "env_file": {"type": "path"},
            "wait": {"type": "float", "default": 120.0},
            "step": {"type": "float", "default": 0.5},
            "timeout": {"type": "float", "default": 5.0},
        },
        supports_check_mode=True,
    )
    out = run(module.params, module.check_mode)
    result = {"changed": bool(out.get("changed")), "state": out["state"], "detail": out["detail"]}
    if out["state"] != "done":
        module.fail_json(msg=f"{module.params['worker']} ({module.params['state']}): {out['detail']}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
