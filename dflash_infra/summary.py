"""The last words of every run, per host: what this run did and what it found, one line per concern.

Built from the run's facts (host_state, the plan, the roles' results, the deployment record) by the
deploy_summary role; a line is left out when its stage did not run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _short(digest: Any) -> str:
    return str(digest)[:16] if digest else "not verified"


def failure_message(result: Any, task: Any = None, default: str = "") -> str:
    """What a rescue may say of the task that failed (its ansible_failed_result and ansible_failed_task): the task's
    message (`default` when it has none), or only its name where its output is hidden: Ansible does not apply a task's
    no_log to ansible_failed_result, which holds the raw result (stderr, arguments, a key written to a file)."""
    if not isinstance(result, Mapping):
        return default
    if result.get("_ansible_no_log"):
        name = task.get("name") if isinstance(task, Mapping) else None
        return f"{f'the task [{name}]' if name else 'a task'} failed; its output is hidden (no_log)"
    return str(result["msg"]) if "msg" in result else default


def host_line(host: str, groups: Sequence[str], check_mode: bool) -> str:
    named = [g for g in groups if g not in ("proxmox_containers", "all", "ungrouped")]
    return f"{host} ({', '.join(named)}){' [check mode: nothing was changed]' if check_mode else ''}:"


def gpu_lines(state: Mapping[str, Any]) -> list[str]:
    if "identity" not in state:
        return ["GPUs: not probed (offline plan)"]
    gpus = (state.get("identity") or {}).get("gpus") or []
    km = state.get("kernel_module") or {}
    name = gpus[0].get("name") if gpus else "none"
    out = [f"GPUs: {len(gpus)} x {name}, kernel module {km.get('version') or 'not loaded'} ({km.get('flavor') or '-'})"]
    if state.get("driver"):
        out.append(f"driver: {state['driver'].get('reason')}")
    return out


def proxmox_lines(proxmox: Mapping[str, Any]) -> list[str]:
    out = []
    if proxmox.get("audit"):
        out.append(f"container: {proxmox.get('status') or '?'} on {proxmox.get('node')}, GPU passthrough "
                   f"{proxmox['audit'].get('status')}")
    if proxmox.get("snapshot"):
        snap = proxmox["snapshot"]
        out.append(f"snapshot: {snap.get('name')} before {snap.get('stage')} "
                   "(back to it: playbooks/rollback.yml -e dflash_rollback=container)")
    return out


def plan_line(plan: Mapping[str, Any]) -> str:
    if not plan:
        return "plan: not computed in this run"
    return (f"plan: tp {plan.get('tp_size')} x dp {plan.get('dp_size')} on GPUs {plan.get('gpu_ids')}, "
            f"mem_fraction_static {plan.get('mem_fraction_static')}, max_running_requests "
            f"{plan.get('max_running_requests')}, context {plan.get('context_length')}")


def training_line(record: Mapping[str, Any] | None, record_path: str, check_mode: bool) -> str | None:
    """`record` is training_stop's record of what it stopped ({} when nothing ran; None: the stage did not run)."""
    if record is None:
        return None
    processes = record.get("processes") or []
    if not processes:
        return "training: none running"
    verb = "would stop" if check_mode else "stopped"
    return f"training: {verb} {len(processes)} process(es), record {record_path}"


def models_line(models: Mapping[str, Mapping[str, Any]], model_root: str, synced_this_run: bool | None) -> str | None:
    if not models:
        return None
    listed = ", ".join(f"{key} manifest {_short(m.get('manifest_sha256'))}" for key, m in models.items())
    if synced_this_run is None:
        return f"models: {listed} at {model_root}"
    return f"models: {listed} {'synced and verified' if synced_this_run else 'verified'} at {model_root}"


def engine_line(engine: Mapping[str, Any] | None, check_mode: bool) -> str | None:
    if not engine:
        return None
    prefix = "would install " if check_mode and not engine.get("probed") else ""
    lock = engine.get("lock") or {}
    locked = (f", locked by {lock.get('file')} ({lock.get('packages')} packages, sha256 {str(lock.get('sha256'))[:16]})"
              if lock.get("file") else "")
    return f"engine: {prefix}{engine.get('name')} {engine.get('version')} at {engine.get('venv')}{locked}"


def serving_lines(record: Mapping[str, Any] | None, url: str, model_name: str, unit: str) -> list[str]:
    if not record:
        return []
    gates = record.get("gates") or {}
    return [f"serving: {url}/v1 ({model_name}), unit {unit}, record deployed_at {record.get('deployed_at') or '?'}",
            f"gates: {gates.get('state') or '?'} ({gates.get('detail') or ''})", *load_lines(record.get("load"), "")]


def load_lines(load: Mapping[str, Any] | None, indent: str) -> list[str]:
    """The load gate's figures of a deployment record, one line per concurrency (none when it did not run)."""
    out = []
    for f in (load or {}).get("figures") or []:
        line = (f"{indent}load at concurrency {f.get('concurrency')}: {f.get('requests')} requests, {f.get('failed')} "
                f"failed, {f.get('output_tokens_per_s')} output tok/s, {f.get('requests_per_s')} req/s")
        if f.get("accept_length_mean") is not None:
            line += f", acceptance length {f['accept_length_mean']} (verify count {f.get('verify_ct')})"
        if f.get("ttft_ms_p50") is not None:
            line += f", TTFT p50/p99 {f['ttft_ms_p50']}/{f.get('ttft_ms_p99')} ms"
        if f.get("itl_ms_p50") is not None:
            line += f", ITL p50/p99 {f['itl_ms_p50']}/{f.get('itl_ms_p99')} ms"
        out.append(line)
    return out


def replica_lines(replicas: Sequence[Mapping[str, Any]], url: str, model_name: str, gateway_unit: str,
                  gateway: Mapping[str, Any] | None = None, check_mode: bool = False,
                  gateway_load: Mapping[str, Any] | None = None) -> list[str]:
    """Serving through the gateway: the endpoint and the gateway's release and lock, the load gate's figures
    through it (this run's, else the last recorded), then each replica with its GPUs, what this run did and its
    gate; under --check what a run would do to it (`would`: start, roll or nothing), and no gate."""
    if not replicas:
        return []
    out = [f"serving: {url}/v1 ({model_name}) through {gateway_unit}, {len(replicas)} replica(s)"]
    if gateway:
        lock = gateway.get("lock") or {}
        out.append(f"gateway: smg {gateway.get('smg')} at {gateway.get('venv')}, locked by {lock.get('file')} "
                   f"({lock.get('packages')} packages, sha256 {str(lock.get('sha256'))[:16]})")
    if not check_mode:
        out += load_lines(gateway_load, "  through the gateway, ")
    for r in sorted(replicas, key=lambda r: int(r.get("index") or 0)):
        gates = r.get("gates") or {}
        gpus = ",".join(str(g) for g in r.get("gpu_ids") or [])
        head = f"replica {r.get('index')}: {r.get('name')} on GPUs {gpus} at {r.get('url')}, "
        if check_mode:
            would = {"start": "would start", "roll": "would be drained, restarted and added back"}
            out.append(head + would.get(str(r.get("would") or ""), "unchanged") + " (check mode)")
            continue
        did = ("drained, restarted and added back" if r.get("drained") else "unchanged" if not r.get("restarted")
               else "started" if r.get("action") == "start" else "restarted")
        if not r.get("restarted") and r.get("gated_again"):
            did += f", gated again and recorded as {r['gated_again']}"
        out.append(head + f"{did}; gates {gates.get('state') or '?'} ({gates.get('detail') or ''})")
        out += load_lines(r.get("load"), "  ")
    return out


def lines(*, host: str, groups: Sequence[str], check_mode: bool, state: Mapping[str, Any], plan: Mapping[str, Any],
          proxmox: Mapping[str, Any], training: Mapping[str, Any] | None, training_record_path: str,
          models: Mapping[str, Mapping[str, Any]], model_root: str, synced_this_run: bool | None,
          engine: Mapping[str, Any] | None, record: Mapping[str, Any] | None, url: str, model_name: str,
          unit: str, replicas: Sequence[Mapping[str, Any]] = (), gateway_unit: str = "",
          gateway: Mapping[str, Any] | None = None, gateway_load: Mapping[str, Any] | None = None) -> list[str]:
    """Every line of one host's summary, in the order of the deploy's stages."""
    out: list[str | None] = [host_line(host, groups, check_mode), *gpu_lines(state), *proxmox_lines(proxmox),
                             plan_line(plan), training_line(training, training_record_path, check_mode),
                             models_line(models, model_root, synced_this_run), engine_line(engine, check_mode),
                             *(replica_lines(replicas, url, model_name, gateway_unit, gateway, check_mode,
                                             gateway_load) if replicas
                               else serving_lines(record, url, model_name, unit))]
    return [line for line in out if line]
