"""Step 4 of a plan: attention kernels for the GPU generation and the engine command line.

The argv is rendered with the flag table of the request's SGLang release, so a setting that release
does not accept is an error naming the flag, never a silent omission.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash_infra import argv_check, engine
from dflash_infra.planning import engine_flags, gateway
from dflash_infra.planning.notes import Notes
from dflash_infra.planning.request import DDTREE_PR, KNOWN_OVERRIDES, Request, Speculative
from dflash_infra.planning.sizing import MAMBA_FULL_MEMORY_RATIO, Layout
from dflash_infra.planning.topology import Topology

# Kernel settings a request may override (overrides.<name>), in the engine's own words.
KERNEL_OVERRIDES = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                    "draft_attention_backend", "mamba_ssm_dtype")
# Flags rendered beside the settings table: what DDTREE runs with (PR #29907 forces both) and two overrides.
PAGE_SIZE_FLAG = "--page-size"
NO_OVERLAP_FLAG = "--disable-overlap-schedule"
REJECTION_SAMPLING_FLAG = "--speculative-use-rejection-sampling"


@dataclass(frozen=True)
class Kernels:
    """Attention backends and SSM state dtype (setting -> value) and why they were picked."""

    settings: dict[str, Any]
    reason: str

    @property
    def ssm_dtype(self) -> str | None:
        """The mamba SSM state dtype the engine is told to use (None: the model's own)."""
        value = self.settings.get("mamba_ssm_dtype")
        return None if value is None else str(value)


@dataclass(frozen=True)
class Rendered:
    """The engine argv (empty when a flag is refused), the plan's `speculative` section and, behind a gateway,
    one engine argv per replica (each on its own port, without --dp-size) and the gateway's argv."""

    args: list[str]
    speculative: dict[str, Any]
    replicas: list[dict[str, Any]] = field(default_factory=list)
    gateway: dict[str, Any] = field(default_factory=dict)


def _generation_kernels(compute_cap: str | None, hybrid: bool) -> tuple[dict[str, Any], str]:
    """Attention backends per GPU generation: compute capability 12.x (sm_120) has no FlashAttention 3."""
    cc = compute_cap or ""
    if cc.startswith("12.") and hybrid:
        return ({"prefill_attention_backend": "triton", "decode_attention_backend": "flashinfer",
                 "mamba_ssm_dtype": "bfloat16", "draft_attention_backend": "flashinfer"},
                f"sm_{cc.replace('.', '')} has no FlashAttention 3; the known working mix for hybrid GDN "
                "models there is triton prefill + flashinfer decode + bf16 SSM state")
    return ({"draft_attention_backend": "flashinfer"},
            f"compute capability {cc or 'unknown'}: engine default attention backends; flashinfer for the drafter")


def kernel_settings(request: Request) -> Kernels:
    """The kernels for the first GPU's generation, with the request's overrides on top."""
    settings, reason = _generation_kernels(request.gpus[0].compute_cap, request.target.is_hybrid)
    for key in KERNEL_OVERRIDES:
        if request.overrides.get(key):
            settings[key] = request.overrides[key]
    if not request.speculative.enabled:
        settings.pop("draft_attention_backend", None)
    return Kernels(settings, reason)


def speculative_section(spec: Speculative) -> dict[str, Any]:
    """The plan's `speculative` section (empty when speculative decoding is off)."""
    if not spec.enabled:
        return {}
    section = {"mode": spec.mode, "algorithm": spec.algorithm, "block_size": spec.block_size,
               "draft_window": spec.draft_window, "tree_budget": spec.tree_budget,
               "max_draft_tokens": spec.max_draft_tokens, "verify_tokens": spec.verify_tokens}
    if spec.mode == "ddtree":
        section["tree_depth_cap"] = spec.tree_depth_cap
    return section


def extra_flags(request: Request, table: engine.FlagTable,
                notes: Notes | None = None) -> tuple[list[str], list[str], list[str]]:
    """Flags outside sglang_settings.yml: page size 1 and overlap scheduling off for ddtree (PR #29907), the
    page-size and rejection-sampling overrides otherwise, then overrides.engine_flags (engine_flags.py). Returns
    argv, errors and DDTree rules the table has no flag for (the PR's engine forces them itself); an override the
    table cannot spell is an error."""
    spec, overrides = request.speculative, request.overrides
    page = overrides.get("page_size")
    wanted: list[tuple[str, Any, bool]] = []  # flag, value, asked for by an override
    errors: list[str] = []
    if spec.mode == "ddtree":
        wanted += [(PAGE_SIZE_FLAG, 1, page is not None), (NO_OVERLAP_FLAG, True, False)]
    elif page is not None:
        wanted.append((PAGE_SIZE_FLAG, page, True))
    if overrides.get("speculative_use_rejection_sampling") and spec.mode != "ddtree":  # ddtree: refused in validate
        if spec.enabled:
            wanted.append((REJECTION_SAMPLING_FLAG, True, True))
        else:
            errors.append("overrides.speculative_use_rejection_sampling: expected speculative decoding "
                          "(algorithm dflash), found algorithm none; drop the override")
    argv: list[str] = []
    missing: list[str] = []
    for flag, value, asked in wanted:
        if table.accepts(flag):
            argv += [flag] if value is True else [flag, str(value)]
        elif asked:
            errors.append(f"overrides: {flag} {'' if value is True else value} is not accepted by SGLang "
                          f"{table.version}; drop the override or plan for an engine that has the flag")
        else:
            missing.append(flag)
    planner_flags = {PAGE_SIZE_FLAG: "page_size", REJECTION_SAMPLING_FLAG: "speculative_use_rejection_sampling"}
    if spec.mode == "ddtree":
        planner_flags[NO_OVERLAP_FLAG] = engine_flags.DDTREE_OWNED
    owned = engine_flags.owned_flags(request.engine.version, table, planner_flags)
    chosen, chosen_errors, lines = engine_flags.render(overrides.get(engine_flags.OVERRIDE), table, owned,
                                                      KNOWN_OVERRIDES)
    argv += chosen
    errors += chosen_errors
    if notes is not None and lines:
        notes.reasons[engine_flags.OVERRIDE] = (f"{'; '.join(lines)}: overrides.{engine_flags.OVERRIDE}, each "
                                                f"checked against the SGLang {table.version} table")
    return argv, errors, missing


def engine_values(request: Request, topology: Topology, chosen: Layout, context: int,
                  kernels: Kernels) -> dict[str, Any]:
    """Planner setting -> value for the engine (None leaves a setting to the engine's default)."""
    serve, spec = request.serve, request.speculative
    values: dict[str, Any] = {
        "model_path": request.model_path,
        "served_model_name": serve.get("served_model_name"),
        "host": serve.get("host"),
        "port": serve.get("port"),
        "tp_size": topology.tp,
        "dp_size": topology.dp if topology.dp > 1 else None,
        "mem_fraction_static": chosen.fraction,
        "max_running_requests": chosen.max_running,
        "context_length": context,
        "chunked_prefill_size": chosen.chunked_prefill_size,
        "cuda_graph_max_bs": min(chosen.cuda_graph_max_bs, chosen.max_running),
        "mamba_full_memory_ratio": MAMBA_FULL_MEMORY_RATIO if request.target.is_hybrid else None,
        # Prometheus /metrics on the engine's own port (where it listens: loopback behind the gateway).
        "enable_metrics": True,
        **kernels.settings,
    }
    if spec.enabled:
        values.update({
            "speculative_algorithm": spec.algorithm,
            "draft_model_path": request.draft_path,
            "block_size": spec.block_size,
            "draft_window": spec.draft_window,
            "tree_budget": spec.tree_budget,
        })
    return values


def _read_back(args: list[str], values: dict[str, Any], request: Request, label: str) -> list[str]:
    """The argv read back by the release's parser (rebuilt from its flag table): who can reach the engine, what it
    loads and serves and on how many GPUs must be what the plan holds (dflash_infra/argv_check.py)."""
    want = argv_check.expected(values["model_path"], values.get("draft_model_path"),
                               {"host": values.get("host"), "port": values.get("port"),
                                "served_model_name": values.get("served_model_name")},
                               int(values["tp_size"]), values.get("dp_size"))
    return argv_check.problems(args, request.engine.table, want, label)


def render(request: Request, topology: Topology, chosen: Layout, context: int, kernels: Kernels,
           notes: Notes) -> Rendered:
    """The engine argv of the plan; flags the release does not accept are errors and leave the argv empty."""
    spec = request.speculative
    notes.reasons["kernels"] = kernels.reason
    section = speculative_section(spec)
    table = request.engine.table
    extra, extra_errors, missing = extra_flags(request, table, notes)
    if spec.mode == "ddtree":
        verify = spec.verify_tokens
        notes.reasons["speculative"] = (
            f"ddtree ({DDTREE_PR}): block {spec.block_size}, window {spec.draft_window}, tree budget "
            f"{spec.tree_budget} nodes, tree depth at most block_size - 1 = {spec.tree_depth_cap}, verify width "
            f"budget + 1 = {verify} tokens per request (CUDA graphs captured for {verify}), cap "
            f"{spec.max_draft_tokens}; page size 1, overlap scheduling off, no rejection sampling"
            + (f" ({', '.join(missing)} not in the {table.version} table: the engine forces it)" if missing else ""))
    elif spec.enabled:
        notes.reasons["speculative"] = (f"{spec.mode}: block {spec.block_size}, window {spec.draft_window}"
                                        f", verify {spec.verify_tokens} tokens per request"
                                        f", cap {spec.max_draft_tokens}")
    values = engine_values(request, topology, chosen, context, kernels)
    routed = request.gateway
    if routed is not None:  # one engine per replica: no --dp-size, each on its own port where the gateway reaches it
        values.update(host=routed.settings["worker_host"], port=routed.worker_port(0), dp_size=None)
    argv, flag_errors = engine.render_argv(values, request.engine.version, table)
    argv += extra
    if spec.mode == "ddtree":
        flag_errors = [e + f" (ddtree needs an engine build with {DDTREE_PR}, e.g. sglang_version 0.5.23+ddtree "
                       "with that build installed; refusing to fall back to linear DFLASH silently)"
                       if e.startswith("tree_budget") else e for e in flag_errors]
    flag_errors += extra_errors
    notes.errors.extend(flag_errors)
    notes.reasons["args"] = (f"flags as spelled by SGLang {table.version} "
                             + (f"({table.provenance})" if table.provenance else "(extracted flag table)"))
    if flag_errors:
        return Rendered([], section)
    if routed is None:
        read_back = _read_back(argv, values, request, "engine argv")
        notes.errors.extend(read_back)
        return Rendered([] if read_back else argv, section)
    port_errors = gateway.port_problems(routed, topology.dp)
    notes.errors.extend(port_errors)
    if port_errors:
        return Rendered([], section)
    replicas = []
    for index in range(topology.dp):
        replica_values = {**values, "port": routed.worker_port(index)}
        args, _ = engine.render_argv(replica_values, request.engine.version, table)
        args += extra
        read_back = _read_back(args, replica_values, request, f"replica {index}'s engine argv")
        if read_back:
            notes.errors.extend(read_back)
            return Rendered([], section)
        replicas.append(gateway.replica(index, topology.gpu_ids[index * topology.tp:(index + 1) * topology.tp],
                                        routed, args))
    notes.reasons["replicas"] = (f"{topology.dp} engine(s) of tp {topology.tp}, one per GPU group, each its own "
                                 f"process on {routed.settings['worker_host']} behind the gateway")
    return Rendered(argv, section, replicas, gateway.section(routed, topology.dp))
