"""Controller-side checks of synced models over the JSON the dflash_model_sync module returns: the published
manifest, the planner's DFlash checks on the synced config.json files, and the weight bytes the plan uses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dflash_infra import model_checks
from helpers import ROOT

DATA = ROOT / "dflash_infra/data/models"
MODELS = {"target": {"name": "Qwen3.6-27B", "path": "/m/T"}, "draft": {"name": "Qwen3.6-27B-DFlash", "path": "/m/D"}}


def manifest(files: list[tuple[str, int, str]]) -> dict[str, Any]:
    return {"files": [{"path": p, "size": s, "sha256": h} for p, s, h in files]}


def published_like(name: str) -> list[tuple[str, int, str]]:
    entry = json.loads((DATA / "published-files.json").read_text())[name]
    files = [(s["file"], s["bytes"], s["sha256"]) for s in entry.get("shards", [])]
    if entry.get("index_sha256"):
        files.append(("model.safetensors.index.json", 100, entry["index_sha256"]))
    return files


def test_published_check_passes_the_published_files_and_names_a_bad_shard() -> None:
    good = published_like("Qwen3.6-27B")
    assert model_checks.published_problems("Qwen3.6-27B", manifest(good)) == []
    bad = [(p, s, "0" * 64) if p.startswith("model-00003") else (p, s, h) for p, s, h in good]
    problems = model_checks.published_problems("Qwen3.6-27B", manifest(bad))
    assert len(problems) == 1 and "model-00003-of-00015.safetensors sha256" in problems[0]
    short = manifest([f for f in good if not f[0].startswith("model-00015")])
    assert "model-00015-of-00015.safetensors is missing" in model_checks.published_problems("Qwen3.6-27B", short)[0]


def test_published_check_of_the_drafter_uses_parameters_and_the_hash_prefix() -> None:
    data = 1730213120 * 2
    ok = manifest([("model.safetensors", data + 9000, "e0c050b3" + "0" * 56)])
    assert model_checks.published_problems("Qwen3.6-27B-DFlash", ok) == []
    lab = manifest([("model.safetensors", 1054296, "ab" * 32)])
    problems = model_checks.published_problems("Qwen3.6-27B-DFlash", lab)
    assert any("does not start with the published e0c050b3" in p for p in problems)
    assert any("parameters need 3460426240 bytes" in p for p in problems)
    assert "no published manifest" in model_checks.published_problems("Unknown", ok)[0]
    with pytest.raises(ValueError, match="expected a manifest object with a `files` list"):
        model_checks.published_problems("Qwen3.6-27B-DFlash", {"nope": 1})


def test_human_bytes() -> None:
    assert [model_checks.human_bytes(n) for n in (0, 1023, 1024, 55562855904, 3 << 40)] == [
        "0 B", "1023 B", "1.00 KiB", "51.75 GiB", "3.00 TiB"]


def test_synced_models_run_the_planner_checks_and_take_weights_from_the_index() -> None:
    target = json.loads((DATA / "Qwen3.6-27B/config.json").read_text())
    draft = json.loads((DATA / "Qwen3.6-27B-DFlash/config.json").read_text())
    models = MODELS
    described = [{"path": "/m/T", "present": True, "config": target, "index_total_size": 55562855904},
                 {"path": "/m/D", "present": True, "config": draft, "weights_file_bytes": 3460500000}]
    out = model_checks.synced_models(described, models, {"Qwen3.6-27B": {"manifest_sha256": "ab"}},
                                     {"algorithm": "dflash"})
    assert out["problems"] == []
    assert out["models"]["target"]["weights_bytes"] == 55562855904
    assert out["models"]["target"]["manifest_sha256"] == "ab"
    assert out["models"]["draft"]["weights_bytes"] == 3460500000
    assert out["summary"] == "Qwen3.6-27B 51.75 GiB, Qwen3.6-27B-DFlash 3.22 GiB"
    bad = dict(draft, dflash_config=dict(draft["dflash_config"], target_layer_ids=[1, 99]))
    described[1] = dict(described[1], config=bad)
    assert any("target_layer_ids [99]" in p for p in model_checks.synced_models(described, models, {}, {})["problems"])


@pytest.mark.parametrize("model_type", [None, "", 3])
def test_a_drafter_config_autoconfig_would_refuse_is_refused_naming_the_key(model_type: Any) -> None:
    """SGLang loads every draft path with transformers' AutoConfig, which refuses a config.json without
    `model_type` (tests/test_sglang_resolution.py shows the real one refusing it): the synced drafter is refused
    before the engine starts, naming the key and what published drafters carry."""
    target = json.loads((DATA / "Qwen3.6-27B/config.json").read_text())
    draft = json.loads((DATA / "Qwen3.6-27B-DFlash/config.json").read_text())
    assert (draft["model_type"], draft["auto_map"]) == ("qwen3", {"AutoModel": "dflash.DFlashDraftModel"})
    if model_type is None:
        draft.pop("model_type")
    else:
        draft["model_type"] = model_type
    described = [{"path": "/m/T", "present": True, "config": target, "index_total_size": 55562855904},
                 {"path": "/m/D", "present": True, "config": draft, "weights_file_bytes": 3460500000}]
    [problem] = model_checks.synced_models(described, MODELS, {}, {"algorithm": "dflash"})["problems"]
    assert problem.startswith("Qwen3.6-27B-DFlash: config.json has no `model_type` key")
    assert "AutoConfig" in problem and '"model_type": "qwen3"' in problem


def test_plan_models_take_the_synced_config_and_index_bytes_and_compare_by_content() -> None:
    models = MODELS
    before_sync = model_checks.plan_models(models, None)
    assert before_sync["target"]["config"] == json.loads((DATA / "Qwen3.6-27B/config.json").read_text())
    assert before_sync["target"]["weights_bytes"] == 55562855904
    # A sync that found the catalogued files gives the same inputs, so a plan made before the sync stands.
    same = {k: {"name": v["name"], "config": v["config"], "weights_bytes": v["weights_bytes"]}
            for k, v in before_sync.items()}
    assert model_checks.plan_models(models, same) == before_sync
    # A different drafter checkpoint at the destination changes the inputs: its bytes come from the synced files.
    other = dict(same, draft=dict(same["draft"], weights_bytes=3_000_000_000))
    after = model_checks.plan_models(models, other)
    assert after["draft"]["weights_bytes"] == 3_000_000_000 and after != before_sync
    # A synced entry of another model (a renamed catalogue) is not taken for this one.
    assert model_checks.plan_models(models, {"target": dict(same["target"], name="Qwen3.5-27B")}) == before_sync
