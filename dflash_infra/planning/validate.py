"""Step 1 of a plan: check the request and read its parts (GPUs, models, speculative settings, engine).

User mistakes become error sentences, never exceptions, so a play can print all of them at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_infra import catalogue, engine
from dflash_infra.models import ModelConfigError, ModelSpec, model_spec
from dflash_infra.planning import engine_flags, gateway, schema
from dflash_infra.planning.notes import Notes
from dflash_infra.planning.request import (
    DDTREE_PR,
    DEFAULT_MAX_DRAFT_TOKENS,
    KNOWN_OVERRIDES,
    SPEC_ALGORITHMS,
    EngineChoice,
    Gpu,
    Request,
    Speculative,
    is_int,
)

# What a plan must hold per replica to count as useful (overridable per request under `capacity`).
DEFAULT_CAPACITY = {"min_running_requests": 8, "min_kv_cache_tokens": 65536}
@dataclass(frozen=True)
class Validated:
    """The outcome of step 1: the checked request, or None when it was refused (the notes say why)."""

    request: Request | None
    engine: dict[str, str]  # the plan's `engine` section; empty when the release is not supported


def _gpus(raw: Any, errors: list[str]) -> list[Gpu]:
    """The request's GPU list (nvidia-smi's shape); a GPU without name or integer memory is an error."""
    if not isinstance(raw, list) or not raw:
        errors.append("gpus: expected a non-empty list of {name, memory_total_mib}, found "
                      f"{type(raw).__name__ if raw else 'nothing'}")
        return []
    gpus = []
    for i, item in enumerate(raw):
        try:
            gpus.append(Gpu(name=str(item["name"]), memory_total_mib=int(item["memory_total_mib"]),
                            compute_cap=None if item.get("compute_cap") is None else str(item["compute_cap"]),
                            index=int(item["index"]) if item.get("index") is not None else i))
        except (KeyError, TypeError, ValueError) as exc:
            errors.append(f"gpus[{i}]: expected name and integer memory_total_mib, found {item!r} ({exc})")
    return gpus


def _load_config(section: Mapping[str, Any], label: str, base: Path | None) -> dict[str, Any]:
    """A model's config.json: given inline, read from config_path (relative to `base`) or from the catalogue."""
    if "config" in section and section["config"] is not None:
        return dict(section["config"])
    if not section.get("config_path") and section.get("name"):
        try:
            return catalogue.config(str(section["name"]))
        except KeyError as exc:
            raise ModelConfigError(f"{label}: {exc.args[0]}; give `config` or `config_path`") from exc
    if section.get("config_path"):
        path = Path(section["config_path"])
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            loaded: dict[str, Any] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"{label}: cannot read config_path {path}: {exc}") from exc
        return loaded
    raise ModelConfigError(f"{label}: expected `config` (a config.json object), `config_path` or a catalogued "
                           f"`name` ({', '.join(catalogue.known_models())}), found none of them")


def _model(section: Any, label: str, base: Path | None, errors: list[str]) -> tuple[ModelSpec | None, float | None]:
    """A model section's shape and its weight bytes (declared or catalogued; None when neither knows them)."""
    if not isinstance(section, Mapping):
        errors.append(f"{label}: expected an object with config or config_path, found {section!r}")
        return None, None
    try:
        spec = model_spec(_load_config(section, label, base), name=str(section.get("name", label)))
    except ModelConfigError as exc:
        errors.append(str(exc))
        return None, None
    weights = section.get("weights_bytes") or catalogue.weights_bytes(str(section.get("name", "")))
    return spec, float(weights) if weights else None


def autoconfig_problems(model: ModelSpec) -> list[str]:
    """Why transformers' AutoConfig, which SGLang loads every model and draft path with, would refuse this
    config.json (empty when it loads): it needs a `model_type` naming a config class."""
    model_type = model.raw.get("model_type")
    if isinstance(model_type, str) and model_type.strip():
        return []
    return [f"{model.name}: config.json has no `model_type` key (found {model_type!r}); SGLang loads it with "
            "transformers' AutoConfig, which refuses such a file (\"Should have a `model_type` key in its "
            "config.json\"). Published DFlash drafters carry \"model_type\": \"qwen3\" and \"auto_map\": "
            "{\"AutoModel\": \"dflash.DFlashDraftModel\"}; use the published config.json"]


def dflash_problems(target: ModelSpec, draft: ModelSpec, spec: Mapping[str, Any]) -> list[str]:
    """Why this drafter cannot draft for this target with these settings (empty when it can)."""
    problems = autoconfig_problems(draft)
    if not draft.is_dflash_drafter:
        problems.append(f"{draft.name}: architecture {draft.architecture} is not a DFlash drafter "
                        f"(expected DFlashDraftModel)")
    dcfg = draft.raw.get("dflash_config") or {}
    layers = dcfg.get("target_layer_ids") or []
    bad = [i for i in layers if not 0 <= int(i) < target.num_layers]
    if bad:
        problems.append(f"{draft.name}: target_layer_ids {bad} lie outside the target's "
                        f"{target.num_layers} layers (0..{target.num_layers - 1})")
    declared = draft.raw.get("num_target_layers")
    if declared is not None and int(declared) != target.num_layers:
        problems.append(f"{draft.name}: trained for a {declared}-layer target, {target.name} has "
                        f"{target.num_layers} layers")
    mask = dcfg.get("mask_token_id")
    if mask is not None and not 0 <= int(mask) < target.vocab_size:
        problems.append(f"{draft.name}: mask_token_id {mask} is outside the target vocabulary "
                        f"of {target.vocab_size}")
    if draft.vocab_size != target.vocab_size:
        problems.append(f"{draft.name}: vocab {draft.vocab_size} differs from the target's {target.vocab_size} "
                        "(the drafter borrows the target's embedding and LM head)")
    if draft.hidden_size != target.hidden_size:
        problems.append(f"{draft.name}: hidden size {draft.hidden_size} differs from the target's "
                        f"{target.hidden_size} (the drafter reads the target's hidden states)")
    return problems


def speculative_problems(spec: Mapping[str, Any]) -> list[str]:
    """Block size, draft window and tree budget against each other and the deployment's cap."""
    problems: list[str] = []
    cap = int(spec.get("max_draft_tokens") or DEFAULT_MAX_DRAFT_TOKENS)
    raw_block = spec.get("block_size")
    window = spec.get("draft_window")
    budget = spec.get("tree_budget")
    if raw_block is None or int(raw_block) < 1:
        problems.append(f"speculative.block_size: expected an integer >= 1, found {raw_block!r}")
        return problems
    block = int(raw_block)
    if block > cap:
        problems.append(f"speculative.block_size {block} exceeds the deployment's max_draft_tokens {cap}")
    if window is not None:
        if int(window) < block:
            problems.append(f"speculative.draft_window {window} is smaller than block_size {block} "
                            "(SGLang requires window >= block size)")
        if int(window) > cap:
            problems.append(f"speculative.draft_window {window} exceeds the deployment's max_draft_tokens {cap}")
    if budget is not None:
        if not is_int(budget) or int(budget) < 1:
            problems.append(f"speculative.tree_budget: expected an integer >= 1, found {budget!r}")
        elif int(budget) > cap:
            problems.append(f"speculative.tree_budget {budget} exceeds the deployment's max_draft_tokens {cap}")
    return problems


def ddtree_problems(spec: Mapping[str, Any], overrides: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Errors and warnings of a ddtree request against the rules of PR #29907."""
    errors: list[str] = []
    warnings: list[str] = []
    budget = spec.get("tree_budget")
    raw_block = spec.get("block_size")
    block = int(raw_block) if is_int(raw_block) else 0
    if budget is None:
        errors.append(f"speculative.tree_budget: ddtree needs an explicit tree budget (an integer >= 1, <= "
                      f"max_draft_tokens), found none; {DDTREE_PR}'s default, block_size - 1"
                      + (f" = {block - 1}" if block > 1 else "") + ", is the plain linear chain, so set a "
                      "measured budget or use algorithm dflash")
    elif isinstance(budget, int) and block > 1 and budget == block - 1:
        warnings.append(f"speculative.tree_budget {budget} = block_size - 1: the tree is the plain linear chain "
                        f"({DDTREE_PR}'s default) and only adds DDTree's costs (page size 1, no overlap "
                        "scheduling); use algorithm dflash or a larger budget measured against it")
    page = overrides.get("page_size")
    if is_int(page) and page != 1:
        errors.append(f"overrides.page_size: ddtree needs page size 1 ({DDTREE_PR}), found {page!r}; drop the "
                      "override or use algorithm dflash")
    if overrides.get("speculative_use_rejection_sampling"):
        errors.append(f"overrides.speculative_use_rejection_sampling: {DDTREE_PR} refuses "
                      "--speculative-use-rejection-sampling with DDTREE (trees are verified greedily against the "
                      "target); drop the override or use algorithm dflash")
    return errors, warnings


def _speculative(request: Mapping[str, Any], target: ModelSpec | None, draft: ModelSpec | None,
                 notes: Notes) -> Speculative:
    """The speculative section checked on its own and, with both models read, against the drafter."""
    spec = dict(request.get("speculative") or {"algorithm": "none"})
    mode = str(spec.get("algorithm", "dflash")).lower()
    if mode not in SPEC_ALGORITHMS:
        notes.errors.append(f"speculative.algorithm: expected one of {', '.join(SPEC_ALGORITHMS)}, found {mode!r}")
        mode = "none"
    checked = Speculative(mode, spec)
    if checked.enabled:
        notes.errors.extend(speculative_problems(spec))
        if mode == "ddtree":
            errors, warnings = ddtree_problems(spec, request.get("overrides") or {})
            notes.errors.extend(errors)
            notes.warnings.extend(warnings)
        elif spec.get("tree_budget") is not None:
            notes.warnings.append(f"speculative.tree_budget {spec['tree_budget']} is ignored: algorithm {mode} "
                                  "drafts a linear chain; set algorithm ddtree on an engine with DDTree to use it")
        if draft is None and not request.get("draft"):
            notes.errors.append("draft: speculative decoding needs a drafter model (SGLang requires "
                                "--speculative-draft-model-path)")
    if target is not None and draft is not None and checked.enabled:
        notes.errors.extend(dflash_problems(target, draft, spec))
        block_cfg = draft.raw.get("block_size")
        if block_cfg is not None and spec.get("block_size") and int(block_cfg) != int(spec["block_size"]):
            notes.warnings.append(f"speculative.block_size {spec['block_size']} differs from the drafter's trained "
                                  f"block_size {block_cfg}; acceptance will drop")
    return checked


def _engine(request: Mapping[str, Any], speculative: bool, notes: Notes) -> EngineChoice | None:
    """The release named by `sglang_version` (a supported one), with the installed engine's options when given."""
    version = str(request.get("sglang_version") or "")
    try:
        release = engine.release_of(version)
        table = engine.flag_table(version)
        if request.get("engine_options"):
            table = engine.FlagTable.from_options(release, request["engine_options"])
    except (KeyError, ValueError):
        known = (*engine.supported_releases(), *engine.derived_tables())
        notes.errors.append(f"sglang_version: expected one of {', '.join(known)}, "
                            f"found {version or 'nothing'!r}")
        return None
    rel = engine.parse_version(release)
    if speculative and rel < engine.DFLASH_SINCE:
        notes.errors.append(f"SGLang {version} has no DFLASH (needs >= 0.5.11)")
    elif speculative and rel < engine.DRAFT_SLIDING_WINDOW_SINCE:
        notes.warnings.append(f"SGLang {version} runs the drafter's sliding-window layers as full attention "
                              "(fixed in 0.5.15); acceptance will be lower")
    if table.provenance:
        notes.warnings.append(f"flag table {table.version}: {table.provenance}")
    return EngineChoice(version, release, table)


def validate_request(request: Any, base: Path | None, notes: Notes) -> Validated:
    """Check a request (relative config paths resolve against `base`); every mistake becomes an error."""
    request, problems = schema.check_request(request)
    if problems:
        notes.errors.extend(problems)
        return Validated(None, {})
    overrides = dict(request.get("overrides") or {})
    for key in sorted(set(overrides) - set(KNOWN_OVERRIDES)):
        notes.errors.append(f"overrides.{key}: unknown override; known: {', '.join(KNOWN_OVERRIDES)}")
    page = overrides.get("page_size")
    if page is not None and (not is_int(page) or int(page) < 1):
        notes.errors.append(f"overrides.page_size: expected an integer >= 1, found {page!r}")
    notes.errors.extend(engine_flags.shape_problems(overrides.get(engine_flags.OVERRIDE)))
    capacity = {**DEFAULT_CAPACITY, **(request.get("capacity") or {})}

    gpus = _gpus(request.get("gpus"), notes.errors)
    target, target_weights = _model(request.get("target"), "target", base, notes.errors)
    draft, draft_weights = (None, None)
    if request.get("draft"):
        draft, draft_weights = _model(request.get("draft"), "draft", base, notes.errors)
    speculative = _speculative(request, target, draft, notes)
    routed = gateway.validate(request.get("gateway"), request.get("serve") or {}, notes.errors)
    choice = _engine(request, speculative.enabled, notes)
    described = choice.describe() if choice is not None else {}
    if notes.errors or not gpus or target is None or choice is None:
        return Validated(None, described)

    drafter = draft if speculative.enabled else None
    return Validated(Request(
        gpus=gpus,
        target=target,
        target_weights=target_weights,
        draft=drafter,
        draft_weights=draft_weights,
        speculative=speculative,
        engine=choice,
        overrides=overrides,
        capacity=capacity,
        model_path=(request.get("target") or {}).get("path") or target.name,
        draft_path=((request.get("draft") or {}).get("path") or drafter.name) if drafter is not None else None,
        context_length=overrides.get("context_length") or request.get("context_length"),
        serve=request.get("serve") or {},
        gateway=routed,
    ), described)
