"""SGLang's own start-up memory lines, read from its log, next to the planner's prediction.

Every real deploy then measures the planner: the engine prints what it actually allocated
(`Load weight end ... mem usage=`, `KV Cache is allocated ... #tokens: N`, the mamba/SSM pool,
`Memory pool end. avail mem=`) and the record keeps both figures and their difference.
Formats: sglang/srt/model_executor/model_runner.py, mem_cache/memory_pool.py and
mem_cache/kv_cache_configurator.py of 0.5.23 (older releases print the same lines with fewer fields).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# Relative difference above which a measured figure is reported against the planner's prediction.
DEFAULT_TOLERANCE = 0.15

# `[2026-09-12 00:22:48 DP1 TP0] ` -> rank " DP1 TP0"; lines without a prefix belong to rank "".
_PREFIX = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?P<rank>(?: [A-Z]{2,4}\d+)*)\] ")
_F = r"\d+(?:\.\d+)?"
_NUM = f"({_F})"
_LOAD_END = re.compile(r"Load weight end\.(?P<body>.*)")
_TYPE = re.compile(r"\btype=(\w+)")
_MEM_USAGE = re.compile(r"mem usage=" + _NUM + r" GB")
_AVAIL = re.compile(r"avail mem=" + _NUM + r" GB")
_KV = re.compile(r"(?:(?P<label>[A-Za-z][\w-]*) )?KV Cache is allocated\.(?: dtype: (?P<dtype>[\w.]+),)? "
                 r"#tokens: (?P<tokens>\d+), (?:K size: (?P<k>" + _F + r") GB, V size: (?P<v>"
                 + _F + r") GB|KV size: (?P<kv>" + _F + r") GB)")
_MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<slots>\d+), "
                    r"conv_state size: (?P<conv>" + _F + r")GB, ssm_state size: (?P<ssm>"
                    + _F + r")GB(?: intermediate_ssm_state_cache size: (?P<iss>" + _F
                    + r")GB)?(?: intermediate_conv_window_cache size: (?P<icw>" + _F + r")GB)?")
_POOL_END = re.compile(r"Memory pool end\. avail mem=" + _NUM + r" GB")


@dataclass
class WeightLoad:
    """One `Load weight end` line: the model class and the GiB its weights took on this GPU."""

    model_type: str | None
    mem_usage_gib: float | None
    avail_gib: float | None


@dataclass
class KvPool:
    """One `KV Cache is allocated` line (the target's pool first, then the drafter's)."""

    tokens: int
    size_gib: float
    dtype: str | None = None
    label: str | None = None


@dataclass
class MambaPool:
    """The `Mamba Cache is allocated` line of a hybrid (linear-attention) model."""

    slots: int
    conv_gib: float
    ssm_gib: float
    intermediate_ssm_gib: float = 0.0
    intermediate_conv_gib: float = 0.0

    @property
    def total_gib(self) -> float:
        return self.conv_gib + self.ssm_gib + self.intermediate_ssm_gib + self.intermediate_conv_gib


@dataclass
class RankMemory:
    """What one scheduler (one GPU) logged at start-up, in log order."""

    rank: str
    weights: list[WeightLoad] = field(default_factory=list)
    kv_pools: list[KvPool] = field(default_factory=list)
    mamba: MambaPool | None = None
    pool_end_avail_gib: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The figures the deployment record keeps for this rank (GiB per GPU, tokens)."""
        weights = [w.mem_usage_gib for w in self.weights if w.mem_usage_gib is not None]
        return {
            "rank": self.rank.strip() or None,
            "weights_gib": round(sum(weights), 2) if weights else None,
            "weight_loads": [asdict(w) for w in self.weights],
            "kv_cache_tokens": self.kv_pools[0].tokens if self.kv_pools else None,
            "kv_pool_gib": round(sum(p.size_gib for p in self.kv_pools), 2) if self.kv_pools else None,
            "kv_pools": [asdict(p) for p in self.kv_pools],
            "mamba_pool_gib": round(self.mamba.total_gib, 2) if self.mamba else None,
            "mamba": ({**asdict(self.mamba), "total_gib": round(self.mamba.total_gib, 2)} if self.mamba else None),
            "avail_after_pool_gib": self.pool_end_avail_gib[-1] if self.pool_end_avail_gib else None,
        }


def _rank_and_message(line: str) -> tuple[str, str]:
    """Split a log line (journal prefix, SGLang's `[time rank]` prefix) into its rank and message."""
    match = _PREFIX.search(line)
    if match:
        return match.group("rank"), line[match.end():]
    return "", line


def parse_startup(text: str) -> dict[str, RankMemory]:
    """Every rank's start-up memory lines, keyed by rank label in the order the ranks first appear."""
    ranks: dict[str, RankMemory] = {}
    for line in text.splitlines():
        rank, message = _rank_and_message(line)
        load = _LOAD_END.search(message)
        kv = _KV.search(message)
        mamba = _MAMBA.search(message)
        pool_end = _POOL_END.search(message)
        if not (load or kv or mamba or pool_end):
            continue
        mem = ranks.setdefault(rank, RankMemory(rank))
        if load:
            body = load.group("body")
            usage, avail, kind = _MEM_USAGE.search(body), _AVAIL.search(body), _TYPE.search(body)
            mem.weights.append(WeightLoad(kind.group(1) if kind else None,
                                          float(usage.group(1)) if usage else None,
                                          float(avail.group(1)) if avail else None))
        elif kv:
            size = (float(kv.group("k")) + float(kv.group("v"))) if kv.group("k") else float(kv.group("kv"))
            mem.kv_pools.append(KvPool(int(kv.group("tokens")), round(size, 2), kv.group("dtype"), kv.group("label")))
        elif mamba:
            mem.mamba = MambaPool(int(mamba.group("slots")), float(mamba.group("conv")), float(mamba.group("ssm")),
                                  float(mamba.group("iss") or 0.0), float(mamba.group("icw") or 0.0))
        elif pool_end:
            mem.pool_end_avail_gib.append(float(pool_end.group(1)))
    return ranks


def engine_memory(text: str) -> dict[str, Any]:
    """The record's `engine_memory`: the first rank's figures (every GPU of a plan is alike) and all ranks."""
    ranks = parse_startup(text)
    if not ranks:
        return {"found": False, "ranks": []}
    summaries = [r.summary() for r in ranks.values()]
    return {"found": True, **{k: v for k, v in summaries[0].items() if k != "rank"},
            "rank": summaries[0]["rank"], "ranks": summaries}


# Planner figure -> engine figure compared per GPU.
COMPARED = (
    ("weights_gib", "per_gpu.weights_gib"),
    ("kv_cache_tokens", "kv_cache_tokens"),
    ("kv_pool_gib", "per_gpu.kv_pool_gib"),
    ("mamba_pool_gib", "per_gpu.mamba_pool_gib"),
)


def _lookup(plan: Mapping[str, Any], dotted: str) -> Any:
    value: Any = plan
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def compare(measured: Mapping[str, Any], plan: Mapping[str, Any],
            tolerance: float = DEFAULT_TOLERANCE) -> tuple[list[dict[str, Any]], list[str]]:
    """Planned vs measured per figure, and a warning sentence for each that differs by more than tolerance."""
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    for name, plan_key in COMPARED:
        planned, actual = _lookup(plan, plan_key), measured.get(name)
        if planned is None or actual is None:
            continue
        planned, actual = float(planned), float(actual)
        diff = (actual - planned) / planned if planned else (0.0 if actual == 0 else float("inf"))
        within = abs(diff) <= tolerance
        rows.append({"figure": name, "planned": planned, "measured": actual,
                     "difference": round(diff, 4) if diff != float("inf") else None, "within_tolerance": within})
        if not within:
            pct = f"{diff:+.1%}" if diff != float("inf") else "planned 0"
            warnings.append(f"{name}: the planner predicted {planned:g}, the engine logged {actual:g} ({pct}, "
                            f"tolerance {tolerance:.0%}); check the memory model in dflash_infra/planner.py "
                            "against this host")
    return rows, warnings


def measure(text: str, plan: Mapping[str, Any], tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """engine_memory(text) with the comparison to the plan and its warnings (the record's shape)."""
    measured = engine_memory(text)
    if not measured["found"]:
        return {**measured, "comparison": [], "tolerance": tolerance,
                "warnings": ["the engine's start-up memory lines were not found in its log; nothing was measured"]}
    rows, warnings = compare(measured, plan, tolerance)
    return {**measured, "comparison": rows, "tolerance": tolerance, "warnings": warnings}


__all__ = ["DEFAULT_TOLERANCE", "KvPool", "MambaPool", "RankMemory", "WeightLoad", "compare",
           "engine_memory", "measure", "parse_startup"]
