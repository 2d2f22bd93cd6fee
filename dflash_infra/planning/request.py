"""The validated request: what step 1 (planning/validate.py) hands to topology, sizing and argv.

Every later step reads these types and their derived values (e.g. `Speculative.verify_tokens`), computed here once;
none of them calls back into validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from dflash_infra import engine
from dflash_infra.models import ModelSpec
from dflash_infra.planning.gateway import Gateway

KNOWN_OVERRIDES = ("tp_size", "dp_size", "mem_fraction_static", "max_running_requests", "context_length",
                   "attention_backend", "prefill_attention_backend", "decode_attention_backend",
                   "draft_attention_backend", "mamba_ssm_dtype", "chunked_prefill_size", "page_size",
                   "speculative_use_rejection_sampling", "engine_flags")
SPEC_ALGORITHMS = {"dflash": "DFLASH", "ddtree": "DDTREE", "none": None}
# The SGLang change that adds DDTree (`--speculative-algorithm DDTREE`, `--speculative-ddtree-budget`); open, in
# no release. Its rules: page size 1, overlap scheduling off, no rejection sampling, verify width = budget + 1.
DDTREE_PR = "SGLang PR #29907"
# Drafted tokens per step a deployment allows when the request does not say (speculative.max_draft_tokens).
DEFAULT_MAX_DRAFT_TOKENS = 16


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    name: str
    memory_total_mib: int
    compute_cap: str | None = None
    index: int | None = None


@dataclass(frozen=True)
class Speculative:
    """The request's speculative-decoding section with its mode checked; values as the request wrote them."""

    mode: str  # "dflash" | "ddtree" | "none"
    settings: Mapping[str, Any]

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def algorithm(self) -> str | None:
        """SGLang's --speculative-algorithm for the mode."""
        return SPEC_ALGORITHMS[self.mode]

    @property
    def block_size(self) -> int:
        return int(self.settings.get("block_size") or 0) if self.enabled else 0

    @property
    def draft_window(self) -> Any:
        return self.settings.get("draft_window")

    @property
    def tree_budget(self) -> Any:
        """The draft tree's budget; only ddtree builds trees."""
        return self.settings.get("tree_budget") if self.mode == "ddtree" else None

    @property
    def max_draft_tokens(self) -> int:
        return int(self.settings.get("max_draft_tokens") or DEFAULT_MAX_DRAFT_TOKENS)

    @property
    def verify_tokens(self) -> int:
        """Tokens the target verifies per running request and step (0 without speculative decoding).

        The block for linear DFLASH; the tree budget plus its root for DDTree (PR #29907's verify width, with
        CUDA graphs captured for that many tokens per request). The KV reserve of a decode step, the SSM
        scratch of hybrid models and the verify graphs' token count all scale with it.
        """
        if not self.enabled:
            return 0
        if self.mode == "ddtree" and is_int(self.tree_budget):
            return int(self.tree_budget) + 1
        return self.block_size

    @property
    def tree_depth_cap(self) -> int:
        """The deepest a draft tree can grow: one DFlash pass drafts block_size - 1 tokens after the root."""
        return max(self.block_size - 1, 0)


def is_int(value: Any) -> TypeGuard[int]:
    """An integer, not a bool (YAML reads `yes` as True)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EngineChoice:
    """The SGLang release a request names and the flag table its command line is checked against."""

    version: str  # as the request wrote it, e.g. '0.5.23+lab'
    release: str  # the public release of that version, e.g. '0.5.23'
    table: engine.FlagTable

    def describe(self) -> dict[str, str]:
        """The plan's `engine` section."""
        return {"name": "sglang", "version": self.version, "flag_table": self.table.version}


@dataclass(frozen=True)
class Request:
    """A request that passed every check: what the later steps plan from."""

    gpus: list[Gpu]
    target: ModelSpec
    target_weights: float | None  # declared or catalogued bytes; None: estimated from the config
    draft: ModelSpec | None  # the drafter when speculative decoding is on, else None
    draft_weights: float | None
    speculative: Speculative
    engine: EngineChoice
    overrides: dict[str, Any]
    capacity: dict[str, Any]
    model_path: Any  # the target's `path` (or its name): the engine's --model-path
    draft_path: Any  # the drafter's `path` (or its name) when speculative decoding is on
    context_length: Any  # the context length asked for (override first), None for the model's maximum
    serve: Mapping[str, Any]  # served model name, host and port (the gateway's, when there is one)
    gateway: Gateway | None = None  # one engine per replica behind the SGLang Model Gateway (planning/gateway.py)
