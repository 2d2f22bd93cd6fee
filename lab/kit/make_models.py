#!/usr/bin/env python3
"""Write the lab's model fixtures: Qwen3.6-27B (target) and Qwen3.6-27B-DFlash (drafter).

The config files are the real published ones (lab/kit/models/, byte-exact). The weights
are real safetensors files (JSON header + data) with realistic tensor names and the real
shard names of the published target, but small, deterministic pseudo-random content of a
configurable total size (a few MB by default, several GB for sync benchmarks). The target's
model.safetensors.index.json carries the real metadata.total_size (55562855904), so tools
that read the index see the real model's numbers. Stand-in weights: they load as
safetensors but do not form a working model.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

KIT = Path(__file__).resolve().parent
MODELS_SRC = KIT / "models"
TARGET = "Qwen3.6-27B"
DRAFT = "Qwen3.6-27B-DFlash"
CHUNK = 8 << 20
STAND_IN = "dflash-lab stand-in weights: valid safetensors, not a working model"


@dataclass(frozen=True)
class Tensor:
    """One tensor entry: name, dtype and byte length (shape is [bytes / itemsize])."""

    name: str
    nbytes: int
    dtype: str = "BF16"


def target_tensor_names() -> list[str]:
    """The target's tensor names: 64 hybrid layers, MTP head, vision tower (1199 in all)."""
    cfg = json.loads((MODELS_SRC / TARGET / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    lm = "model.language_model"
    names = [f"{lm}.embed_tokens.weight"]
    dense = [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")] + [
        "input_layernorm.weight", "post_attention_layernorm.weight"]
    full = [f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
    linear = [f"linear_attn.{p}" for p in (
        "in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
        "conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight")]
    for i, kind in enumerate(text["layer_types"]):
        names += [f"{lm}.layers.{i}.{t}" for t in (full if kind == "full_attention" else linear) + dense]
    names += [f"{lm}.norm.weight", "lm_head.weight"]
    names += [f"mtp.{p}.weight" for p in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")]
    names += [f"mtp.layers.0.{t}" for t in full + dense]
    block = [f"{p}.{w}" for p in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
             for w in ("weight", "bias")]
    names += ["model.visual.patch_embed.proj.weight", "model.visual.patch_embed.proj.bias",
              "model.visual.pos_embed.weight"]
    for i in range(int(vision["depth"])):
        names += [f"model.visual.blocks.{i}.{t}" for t in block]
    names += [f"model.visual.merger.{p}" for p in (
        "norm.weight", "norm.bias", "linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias")]
    return names


def draft_tensor_names() -> list[str]:
    """The drafter's tensor names (it borrows the target's embedding and LM head)."""
    cfg = json.loads((MODELS_SRC / DRAFT / "config.json").read_text())
    per_layer = [f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")] + [
        f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")] + [
        "input_layernorm.weight", "post_attention_layernorm.weight"]
    names = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    for i in range(int(cfg["num_hidden_layers"])):
        names += [f"layers.{i}.{t}" for t in per_layer]
    return names


def split_bytes(total: int, weights: list[int]) -> list[int]:
    """Split total into even byte counts (bf16) proportional to weights, each at least 2."""
    wsum = sum(weights)
    parts = [max(2, (total * w // wsum) // 2 * 2) for w in weights]
    parts[-1] = max(2, parts[-1] + (total - sum(parts)) // 2 * 2)
    return parts


def header_bytes(tensors: list[Tensor]) -> bytes:
    """Safetensors header: u64 length + JSON, space-padded to 8 bytes like the reference writer."""
    meta: dict = {"__metadata__": {"format": "pt", "dflash_lab": STAND_IN}}
    offset = 0
    for t in tensors:
        meta[t.name] = {"dtype": t.dtype, "shape": [t.nbytes // 2], "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(path: Path, tensors: list[Tensor], seed: str) -> int:
    """Write one shard with deterministic content; returns its size in bytes."""
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as fh:
        fh.write(header_bytes(tensors))
        remaining = sum(t.nbytes for t in tensors)
        while remaining:
            n = min(CHUNK, remaining)
            fh.write(rng.randbytes(n))
            remaining -= n
    tmp.replace(path)
    return path.stat().st_size


def make_target(out: Path, total_bytes: int) -> dict:
    """Target directory: configs, index with the real total_size, 15 real-named shards."""
    published = json.loads((MODELS_SRC / "published-files.json").read_text())[TARGET]
    shards = published["shards"]
    names = target_tensor_names()
    # Contiguous runs of tensors per shard, sized like the published shards.
    counts = [max(1, round(len(names) * s["bytes"] / sum(x["bytes"] for x in shards))) for s in shards]
    counts[-1] = len(names) - sum(counts[:-1])
    shard_bytes = split_bytes(total_bytes, [s["bytes"] for s in shards])
    d = out / TARGET
    d.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "generation_config.json"):
        shutil.copyfile(MODELS_SRC / TARGET / f, d / f)
    weight_map: dict[str, str] = {}
    start = 0
    written = 0
    for shard, count, nbytes in zip(shards, counts, shard_bytes, strict=True):
        chunk = names[start:start + count]
        start += count
        tensors = [Tensor(n, b) for n, b in zip(chunk, split_bytes(nbytes, [1] * len(chunk)), strict=True)]
        written += write_safetensors(d / shard["file"], tensors, f"{TARGET}/{shard['file']}")
        weight_map.update({t.name: shard["file"] for t in tensors})
    index = {"metadata": {"total_size": published["index_metadata_total_size"]}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"name": TARGET, "path": str(d), "tensors": len(weight_map), "bytes": written}


def make_draft(out: Path, total_bytes: int) -> dict:
    """Drafter directory: config and one model.safetensors."""
    d = out / DRAFT
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(MODELS_SRC / DRAFT / "config.json", d / "config.json")
    names = draft_tensor_names()
    tensors = [Tensor(n, b) for n, b in zip(names, split_bytes(total_bytes, [1] * len(names)), strict=True)]
    written = write_safetensors(d / "model.safetensors", tensors, f"{DRAFT}/model.safetensors")
    return {"name": DRAFT, "path": str(d), "tensors": len(names), "bytes": written}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory that receives <model>/ folders")
    parser.add_argument("--target-bytes", type=int, default=4 << 20, help="target weights, bytes (default 4 MiB)")
    parser.add_argument("--draft-bytes", type=int, default=1 << 20, help="drafter weights, bytes (default 1 MiB)")
    parser.add_argument("--models", default=f"{TARGET},{DRAFT}", help="which models to write")
    args = parser.parse_args(argv)
    wanted = {m.strip() for m in args.models.split(",") if m.strip()}
    unknown = wanted - {TARGET, DRAFT}
    if unknown:
        print(f"make_models: unknown model(s) {sorted(unknown)}; expected {TARGET} and/or {DRAFT}", file=sys.stderr)
        return 2
    started = time.monotonic()
    results = []
    if TARGET in wanted:
        results.append(make_target(args.out, args.target_bytes))
    if DRAFT in wanted:
        results.append(make_draft(args.out, args.draft_bytes))
    for r in results:
        print(f"make_models: {r['name']}: {r['tensors']} tensors, {r['bytes']} bytes in {r['path']}")
    print(f"make_models: done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
