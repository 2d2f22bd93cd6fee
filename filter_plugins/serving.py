"""Ansible filters of the sglang_engine, sglang_service and smg_gateway roles; thin adapters over dflash_infra.serving
dflash_infra.loadgate and dflash_infra.parsers.engine_log, no logic of their own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import loadgate, rollout, serving
    from dflash_infra.ansible_filters import as_filters
    from dflash_infra.parsers import engine_log
    from dflash_infra.planning import gateway
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import loadgate, rollout, serving
    from dflash_infra.ansible_filters import as_filters
    from dflash_infra.parsers import engine_log
    from dflash_infra.planning import gateway


def dflash_serving_record(plan: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The deployment record for a plan (keyword arguments as serving.record takes them)."""
    return serving.record(plan=plan, **kwargs)


class FilterModule:
    """dflash_serving_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_serving_flags_from_help": serving.flags_from_help,
            "dflash_serving_argv_flags": serving.argv_flags,
            "dflash_serving_driver_problems": serving.driver_problems,
            "dflash_serving_base_url": serving.base_url,
            "dflash_engine_status": serving.engine_status,
            "dflash_engine_problems": serving.engine_problems,
            "dflash_service_todo": serving.service_todo,
            "dflash_service_done": serving.service_done,
            "dflash_service_converged": serving.service_converged,
            "dflash_not_as_recorded": serving.not_as_recorded,
            "dflash_serving_paths": serving.service_paths,
            "dflash_serving_exec_start": serving.exec_start_lines,
            "dflash_serving_environment": serving.systemd_environment,
            "dflash_systemd_text": serving.systemd_text,
            "dflash_engine_env_text": serving.engine_env_text,
            "dflash_key_file_text": serving.key_file_text,
            "dflash_key_problems": serving.key_problems,
            "dflash_keys_problems": serving.keys_problems,
            "dflash_secret_files": serving.secret_files,
            "dflash_tls_text": serving.tls_text,
            "dflash_gateway_tls_parts": serving.gateway_tls_parts,
            "dflash_engine_tls_paths": serving.engine_tls_paths,
            "dflash_engine_tls_todo": serving.engine_tls_todo,
            "dflash_engine_tls_problem": serving.engine_tls_problem,
            "dflash_environment_problems": serving.environment_inputs_problems,
            "dflash_serving_record": dflash_serving_record,
            "dflash_serving_rolled_back": serving.rolled_back_record,
            "dflash_serving_engine_memory": engine_log.measure,
            "dflash_serving_comparison_line": serving.comparison_line,
            "dflash_gateway_paths": serving.gateway_paths,
            "dflash_gateway_exec_start": serving.gateway_exec_start_lines,
            "dflash_gateway_todo": serving.gateway_todo,
            "dflash_gateway_record": serving.gateway_record,
            "dflash_gateway_restore_url": serving.gateway_restore_url,
            "dflash_gateway_restore_workers": serving.gateway_restore_workers,
            "dflash_gateway_key_first": serving.gateway_key_first,
            "dflash_gateway_section": gateway.checked_section,
            "dflash_gateway_with_workers": gateway.with_workers,
            "dflash_gateway_topology": rollout.gateway_topology,
            "dflash_replica_slots": rollout.slots,
            "dflash_replica_state_inputs": rollout.state_inputs,
            "dflash_replica_plan": rollout.replica_plan,
            "dflash_rollout_wanted": rollout.wanted,
            "dflash_rollout": rollout.rollout,
            "dflash_rollout_lines": rollout.summary_lines,
            "dflash_gateway_reconcile": rollout.reconcile,
            "dflash_rollout_turns": rollout.turns,
            "dflash_rollout_tls_leftovers": rollout.tls_leftovers,
            "dflash_rollout_converged_notes": rollout.converged_notes,
            "dflash_rollback_turns": rollout.rollback_turns,
            "dflash_rollback_models": rollout.rollback_models,
            "dflash_snapshot_problems": rollout.snapshot_problems,
            "dflash_snapshot_unit_problem": serving.snapshot_unit_problem,
            "dflash_present_units": rollout.present_units,
            "dflash_load_figures": loadgate.run_figures,
            "dflash_load_endpoint_concurrency": loadgate.endpoint_concurrency,
            "dflash_load_restart_problem": loadgate.restart_problem,
            "dflash_load_restarts_problem": loadgate.restarts_problem,
            "dflash_load_gateway_run": loadgate.gateway_run,
            "dflash_load_verdict": loadgate.verdict,
        })
