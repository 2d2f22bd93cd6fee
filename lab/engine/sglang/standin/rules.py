"""LAB STAND-IN: the start-up checks of SGLang 0.5.23 that a DFLASH deployment meets after parsing.

Mirrors `_handle_dflash` and `_resolve_dflash_draft_attention_backend` of the real
`sglang/srt/arg_groups/speculative_hook.py` (0.5.23): same order, same ValueError texts, same
defaults (block size from the drafter config else 16, max_running_requests 48). Model directories are
checked the way transformers' config loading fails for a local path (OSError texts of
`transformers.utils.hub.cached_file`). Everything else the real resolution does is out of scope.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

# sglang/srt/arg_groups/choices.py DRAFT_ATTENTION_BACKEND_CHOICES (0.5.23).
DRAFT_ATTENTION_BACKEND_CHOICES = ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu")
PLATFORM = "CudaSRTPlatform"
DFLASH_MAX_RUNNING_REQUESTS = 48
DFLASH_DEFAULT_BLOCK_SIZE = 16


# Algorithms that run the DFLASH drafter: DFLASH itself and DDTREE (SGLang PR #29907, in the variant's table only:
# the tree search over the same drafter's block, with the same start-up rules).
DRAFTER_ALGORITHMS = ("DFLASH", "DDTREE")
DDTREE_PR = "SGLang PR #29907"


@dataclass
class Resolved:
    """What the stand-in needs after resolution: parallelism, models, speculative settings."""

    tp_size: int
    dp_size: int
    model_path: str
    served_model_name: str
    target_config: dict[str, Any]
    draft_path: str | None = None
    draft_config: dict[str, Any] | None = None
    algorithm: str | None = None
    num_draft_tokens: int | None = None
    tree_budget: int | None = None  # DDTREE (the variant's table only): tree nodes verified per step
    draft_window: int | None = None
    draft_attention_backend: str | None = None
    max_running_requests: int | None = None
    context_length: int = 0
    warnings: list[str] = field(default_factory=list)


def load_model_config(path: str) -> dict[str, Any]:
    """config.json of a local model directory; the OSError transformers raises when there is none."""
    if not os.path.isdir(path):
        raise OSError(
            f"Incorrect path_or_model_id: '{path}'. Please provide either the path to a local folder "
            "or the repo_id of a model on the Hub."
        )
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise OSError(
            f"{path} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{path}/tree/None' for available files."
        )
    with open(config, encoding="utf-8") as fh:
        return json.load(fh)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly vision-language) config."""
    return config.get("text_config") or config


def context_length(config: dict[str, Any], override: int | None) -> int:
    """--context-length, else the model's max_position_embeddings."""
    if override:
        return int(override)
    text = text_config(config)
    return int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 4096)


def drafter_block_size(config: dict[str, Any] | None) -> int | None:
    """parse_dflash_draft_config(...).resolve_block_size(): dflash_config.block_size, else block_size."""
    if not config:
        return None
    value = (config.get("dflash_config") or {}).get("block_size", config.get("block_size"))
    return None if value is None else int(value)


def _get(args: dict[str, Any], name: str, default: Any = None) -> Any:
    value = args.get(name, default)
    return default if value is None else value


def handle_dflash(args: dict[str, Any], resolved: Resolved) -> None:
    """_handle_dflash of SGLang 0.5.23: raise its ValueError on a violation, fill the defaults."""
    attn_dp = int(_get(args, "attn_dp_size", 1)) > 1 or bool(args.get("enable_dp_attention"))
    if attn_dp and not args.get("enable_dp_lm_head"):
        raise ValueError("DFLASH with dp attention requires --enable-dp-lm-head.")
    if int(_get(args, "pp_size", 1)) != 1:
        raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
    if args.get("speculative_draft_model_path") is None:
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    for name in ("speculative_num_steps", "speculative_eagle_topk"):
        if args.get(name) is not None and int(args[name]) != 1:
            resolved.warnings.append(
                f"DFLASH only supports {name} == 1; overriding {name}={args[name]} to 1.")

    num_draft_tokens = args.get("speculative_num_draft_tokens")
    block_size = args.get("speculative_dflash_block_size")
    if block_size is not None:
        if int(block_size) <= 0:
            raise ValueError(
                "DFLASH requires --speculative-dflash-block-size to be positive, "
                f"got {block_size}."
            )
        if num_draft_tokens is not None and int(num_draft_tokens) != int(block_size):
            raise ValueError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                "but they differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={num_draft_tokens}, "
                f"speculative_dflash_block_size={block_size}."
            )
        num_draft_tokens = int(block_size)

    if num_draft_tokens is None:
        inferred = drafter_block_size(_try_draft_config(args["speculative_draft_model_path"], resolved))
        if inferred is None:
            inferred = DFLASH_DEFAULT_BLOCK_SIZE
            resolved.warnings.append(
                f"speculative_num_draft_tokens is not set; defaulting to {inferred} for DFLASH.")
        num_draft_tokens = inferred
    resolved.num_draft_tokens = int(num_draft_tokens)

    window = args.get("speculative_draft_window_size")
    if window is not None:
        if window < resolved.num_draft_tokens:
            raise ValueError(
                "--speculative-draft-window-size must be >= "
                "--speculative-num-draft-tokens (block_size). "
                f"window_size={window}, block_size={resolved.num_draft_tokens}."
            )
        resolved.draft_window = int(window)

    resolved.draft_attention_backend = draft_attention_backend(args, resolved)
    if args.get("max_running_requests") is None:
        resolved.max_running_requests = DFLASH_MAX_RUNNING_REQUESTS
        resolved.warnings.append(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests.")
    else:
        resolved.max_running_requests = int(args["max_running_requests"])


def _try_draft_config(path: str, resolved: Resolved) -> dict[str, Any] | None:
    """The drafter config for block-size inference; a failure is the real warning, not an error."""
    try:
        return load_model_config(path)
    except (OSError, ValueError) as e:
        resolved.warnings.append(
            "Failed to infer DFLASH block_size from draft model config; "
            f"defaulting speculative_num_draft_tokens to 16. Error: {e}")
        return None


def draft_attention_backend(args: dict[str, Any], resolved: Resolved) -> str:
    """_resolve_dflash_draft_attention_backend on CUDA: unsupported backends fall back to flashinfer."""
    backend = (args.get("speculative_draft_attention_backend") or args.get("decode_attention_backend")
               or args.get("attention_backend"))
    if backend is None:
        return "flashinfer"
    if backend not in DRAFT_ATTENTION_BACKEND_CHOICES:
        resolved.warnings.append(
            f"DFLASH draft worker does not support attention_backend {backend!r} on {PLATFORM}. "
            "Falling back to 'flashinfer'.")
        return "flashinfer"
    return str(backend)


def resolve(args: dict[str, Any]) -> Resolved:
    """Parsed args -> Resolved, raising the real server's errors in its order."""
    model_path = str(args["model_path"])
    target_config = load_model_config(model_path)
    resolved = Resolved(
        tp_size=int(_get(args, "tp_size", 1)),
        dp_size=int(_get(args, "dp_size", 1)),
        model_path=model_path,
        served_model_name=str(args.get("served_model_name") or model_path),
        target_config=target_config,
        algorithm=args.get("speculative_algorithm"),
        max_running_requests=args.get("max_running_requests"),
        context_length=context_length(target_config, args.get("context_length")),
    )
    if resolved.algorithm in DRAFTER_ALGORITHMS:
        handle_dflash(args, resolved)
        resolved.draft_path = str(args["speculative_draft_model_path"])
        resolved.draft_config = load_model_config(resolved.draft_path)
    if resolved.algorithm == "DDTREE":
        block = int(resolved.num_draft_tokens or DFLASH_DEFAULT_BLOCK_SIZE)
        budget = args.get("speculative_ddtree_budget")
        resolved.tree_budget = block - 1 if budget is None else int(budget)
        resolved.warnings.append(
            f"lab stand-in: DDTREE ({DDTREE_PR}) modelled: tree budget {resolved.tree_budget}, verify width "
            f"{resolved.tree_budget + 1} tokens per request, the DFLASH drafter's block {block}; the speed model is "
            "the stand-in's own (server.spec_metrics), not a measurement")
    elif resolved.algorithm:
        resolved.warnings.append(
            f"lab stand-in: speculative algorithm {resolved.algorithm} is accepted but not modelled; "
            "only DFLASH start-up rules are checked")
    return resolved
