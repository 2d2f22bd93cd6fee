"""One model for role inputs (docs/architecture.md, The wiring): a role's inputs are set once, in
group_vars/all/<role>.yml; a playbook (playbooks/, its tasks/, deploy_dflash.yml) sets a role's input with `vars:`
only where this short list allows it, each with its reason: what changes per call. A new one fails here until it is
either moved to group_vars or listed with its reason; a listed one no longer used fails too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from helpers import ROOT

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())

# (file, task or play name, role inputs it sets) -> why it varies per call rather than per host.
ALLOWED: dict[tuple[str, str, tuple[str, ...]], str] = {
    ("playbooks/align_driver.yml", "Snapshot the container before the alignment changes packages",
     ("proxmox_guest_stage",)): "the snapshot's stage names this call",
    ("deploy_dflash.yml", "Snapshot the container before the driver alignment changes packages",
     ("proxmox_guest_stage",)): "the snapshot's stage names this call",
    ("playbooks/tasks/serve_stage.yml", "Snapshot the container before the engine is installed or upgraded",
     ("proxmox_guest_stage",)): "the snapshot's stage names this call",
    ("playbooks/canary.yml", "Plan the candidate (the planner's checks, as for any plan)",
     ("serving_plan_fact", "serving_plan_speculative", "serving_plan_overrides")):
        "the candidate is planned beside the inventory's plan, from the candidate's settings",
    ("playbooks/canary.yml", "Check the installed engine takes the candidate's flags",
     ("sglang_engine_required_argv",)): "the candidate's command line, not the inventory's",
    ("playbooks/canary.yml", "Put the canary replica on the candidate (drained, restarted, gated, added back)",
     ("sglang_service_environment_overlay", "sglang_service_load_gate")):
        "the candidate's environment and the canary's load gate, for that replica only",
    ("playbooks/canary.yml", "Promote the candidate to the other replicas, one at a time",
     ("sglang_service_environment_overlay",)): "the candidate's environment, for the promoted replicas",
    ("playbooks/canary.yml", "Put the canary replica back on the baseline", ("sglang_service_load_gate",)):
        "the canary's load gate, for that replica",
    ("playbooks/status.yml", "Read the host, the gateway's workers and the deploy lock in one round trip",
     ("host_state_files",)): "the read-only view reads the deploy lock's heartbeat too",
    ("playbooks/status.yml", "Render the units the plan would give the host, on the controller",
     ("sglang_service_engine", "sglang_service_candidates")):
        "rendered on the controller for every replica, with the engine the host's lock names (none is installed)",
    ("playbooks/tasks/serve_replica.yml", "Take the turn of replica {{ _serve_index }}",
     ("sglang_service_name", "sglang_service_paths", "sglang_service_plan", "sglang_service_done")):
        "one replica's unit name, paths and plan per turn",
    ("playbooks/tasks/rollback_replica.yml",
     "Roll the replica back and add it to the gateway, {{ _rollback_turn.name }}",
     ("sglang_service_name", "sglang_service_paths")): "one replica's unit name and paths per turn",
    ("playbooks/tasks/rollout_decide.yml", "Find the running replicas that already match the host (they take no turn)",
     ("sglang_service_candidates",)): "every replica's candidate unit, compared at once",
}


def _playbooks() -> list[Path]:
    return [*sorted((ROOT / "playbooks").rglob("*.yml")), ROOT / "deploy_dflash.yml"]


def _inputs(variables: Any) -> tuple[str, ...]:
    return tuple(k for k in (variables or {}) if any(k.startswith(f"{role}_") for role in ROLES))


def _walk(tasks: Any, rel: str, out: dict[tuple[str, str, tuple[str, ...]], int]) -> None:
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in ("block", "rescue", "always"):
            _walk(task.get(key), rel, out)
        keys = _inputs(task.get("vars"))
        if keys:
            out[(rel, str(task.get("name")), keys)] = out.get((rel, str(task.get("name")), keys), 0) + 1


def role_inputs_set_in_playbooks() -> dict[tuple[str, str, tuple[str, ...]], int]:
    """Every place a playbook sets a role's input with vars: (a play's, a block's or a task's)."""
    out: dict[tuple[str, str, tuple[str, ...]], int] = {}
    for path in _playbooks():
        rel = str(path.relative_to(ROOT))
        for item in yaml.safe_load(path.read_text()) or []:
            if isinstance(item, dict) and "hosts" in item:
                keys = _inputs(item.get("vars"))
                if keys:
                    out[(rel, f"play: {item.get('name')}", keys)] = 1
                for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                    _walk(item.get(section), rel, out)
            else:
                _walk([item], rel, out)
    return out


def test_playbooks_set_role_inputs_only_where_the_list_allows_it_with_a_reason() -> None:
    found = role_inputs_set_in_playbooks()
    new = sorted(set(found) - set(ALLOWED))
    assert not new, ("role inputs set with vars: in a playbook; set them in group_vars/all/<role>.yml, or list them "
                     "in ALLOWED with what changes per call:\n" + "\n".join(map(str, new)))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, "listed in ALLOWED but no longer set there (remove them):\n" + "\n".join(map(str, stale))
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_scan_sees_a_role_input_set_by_a_block_and_by_a_play(tmp_path: Path) -> None:
    tasks: list[dict[str, Any]] = [{"name": "b", "vars": {"sglang_service_name": "x", "other": 1},
                                    "block": [{"name": "t", "vars": {"model_sync_models": {}}}]}]
    out: dict[tuple[str, str, tuple[str, ...]], int] = {}
    _walk(tasks, "f.yml", out)
    assert out == {("f.yml", "b", ("sglang_service_name",)): 1, ("f.yml", "t", ("model_sync_models",)): 1}
    assert _inputs({"dflash_models": {}, "_sglang_service_x": 1}) == ()
