"""What would fit when a request does not: computed with the same memory model the plan uses, so an operator is
told the nearest request that plans instead of only why this one does not.

Three answers, each for the host's TP sizes that split both models' heads: the largest draft block (verify width)
that fits at that TP, with the running requests and context it leaves; whether it fits without speculative
decoding; and the smallest TP that fits the request as given (on more GPUs of this kind than the host has).
"""

from __future__ import annotations

import dataclasses

from dflash_infra.planning.request import Request
from dflash_infra.planning.sizing import Layout, MemoryModel

# The largest TP looked at for "the smallest TP that fits" (a box of 16 GPUs).
MAX_TP = 16


def _tps(request: Request, upto: int) -> list[int]:
    """Powers of two up to `upto` that split both models' attention heads."""
    out, tp = [], 1
    while tp <= upto:
        if not request.target.tp_problems(tp) and not (request.draft and request.draft.tp_problems(tp)):
            out.append(tp)
        tp *= 2
    return out


def _holds(request: Request, lay: Layout) -> str:
    """What a layout that fits holds: its running requests and the context the plan would give (sizing.context_length:
    the KV pool beside the decode reserve, rounded down to 1024, at most the model's maximum)."""
    context = lay.kv_tokens_free // 1024 * 1024
    if request.target.max_position_embeddings:
        context = min(context, request.target.max_position_embeddings)
    return f"{lay.max_running} running request(s), context up to {context} tokens"


def largest_block(request: Request, model: MemoryModel, tp: int) -> tuple[int, Layout] | None:
    """The largest verify width below the request's that fits at `tp` (None when none does)."""
    for verify in range(model.verify_tokens - 1, 0, -1):
        lay = dataclasses.replace(model, verify_tokens=verify).layout(tp)
        if not lay.problems:
            return verify, lay
    return None


def _block_words(request: Request, verify: int) -> str:
    """The request's own words for a verify width: the block for dflash, the tree budget for ddtree."""
    spec = request.speculative
    if spec.mode == "ddtree":
        return f"speculative.tree_budget {verify - 1}" if verify > 1 else "no draft tree"
    return f"speculative.block_size {verify} (draft_window >= {verify})"


def suggestions(request: Request, model: MemoryModel, tps: list[int] | None = None) -> list[str]:
    """Sentences naming the nearest requests that fit, best first; empty when nothing nearby fits. `tps` are the TP
    sizes that were refused (the override's, else every one the host allows)."""
    out: list[str] = []
    host_tps = _tps(request, len(request.gpus))
    for tp in host_tps if tps is None else tps:
        if request.speculative.enabled and model.verify_tokens > 1:
            found = largest_block(request, model, tp)
            if found:
                verify, lay = found
                out.append(f"at tp {tp}: {_block_words(request, verify)} fits: {_holds(request, lay)}")
        if request.speculative.enabled:
            plain = dataclasses.replace(model, draft=None, draft_weights=0.0, verify_tokens=0).layout(tp)
            if not plain.problems:
                out.append(f"at tp {tp}: speculative.algorithm none fits: {_holds(request, plain)}")
    for tp in _tps(request, MAX_TP):
        if tps is None and tp in host_tps:
            continue  # every TP of the host was refused
        lay = model.layout(tp)
        if not lay.problems:
            where = ("on this host" if tp <= len(request.gpus) else
                     f"on {tp} GPUs of {model.gpu_mib} MiB, the host has {len(request.gpus)}")
            out.append(f"the request as given fits at tp {tp} ({where}): {_holds(request, lay)}")
            break
    return out
