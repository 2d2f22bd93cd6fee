"""`dflash-infra` as its contract says: JSON out, exit 0 / 2, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import ROOT, run, tool

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia" / "h200-test-machine"


def cli(*args: str, stdin: str | None = None):
    return run([tool("dflash-infra"), *args], input=stdin)


def test_plan_pro6000_exits_0_with_json() -> None:
    proc = cli("plan", "examples/pro6000.yml")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("tp_size", "dp_size", "gpu_ids", "mem_fraction_static", "max_running_requests", "context_length",
                "per_gpu", "kv_cache_tokens", "args", "warnings", "errors"):
        assert key in result
    assert set(result["per_gpu"]) >= {"weights_gib", "kv_pool_gib", "mamba_pool_gib", "reserved_gib"}


def test_plan_with_errors_exits_2_and_still_prints_json(tmp_path: Path) -> None:
    req = (ROOT / "examples" / "pro6000.yml").read_text() + "overrides: {tp_size: 3}\n"
    proc = cli("plan", "-", stdin=req.replace("../dflash_infra", str(ROOT / "dflash_infra")))
    assert proc.returncode == 2
    assert "tp 3" in " ".join(json.loads(proc.stdout)["errors"])


def test_plan_draft_window_32_exits_2() -> None:
    req = (ROOT / "examples" / "eval.yml").read_text().replace("draft_window: 16", "draft_window: 32")
    proc = cli("plan", "-", stdin=req.replace("../dflash_infra", str(ROOT / "dflash_infra")))
    assert proc.returncode == 2
    assert any("draft_window 32" in e for e in json.loads(proc.stdout)["errors"])


def test_plan_table_format() -> None:
    proc = cli("plan", "examples/eval.yml", "--format", "table")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0].split()[:3] == ["setting", "value", "reason"]
    assert "tp_size" in proc.stdout and "engine argv:" in proc.stdout


def test_plan_bad_yaml_is_one_line_exit_2() -> None:
    proc = cli("plan", "-", stdin="gpus: [unclosed\n")
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "<stdin>" in proc.stderr and "YAML" in proc.stderr


def test_parse_gpus_with_header_and_units() -> None:
    proc = cli("parse", "gpus", str(FIXTURES / "query-gpu-header.csv"))
    assert proc.returncode == 0, proc.stderr
    gpus = json.loads(proc.stdout)
    assert gpus[0]["name"] == "NVIDIA H200" and gpus[0]["memory_total_mib"] == 143771


def test_parse_headerless_gpus_with_fields(tmp_path: Path) -> None:
    f = tmp_path / "gpus.csv"
    f.write_text("NVIDIA RTX A6000, 49140, 8.6\nNVIDIA RTX A6000, 49140, 8.6\n")
    proc = cli("parse", "gpus", str(f), "--fields", "name,memory.total,compute_cap")
    assert proc.returncode == 0, proc.stderr
    assert [g["compute_cap"] for g in json.loads(proc.stdout)] == ["8.6", "8.6"]


def test_parse_apps_driver_nvml() -> None:
    apps = json.loads(cli("parse", "apps", str(FIXTURES / "query-compute-apps.csv")).stdout)
    assert apps[0]["pid"] == 446 and apps[0]["used_memory_mib"] == 10758
    driver = json.loads(cli("parse", "driver", str(FIXTURES / "proc-driver-nvidia-version.txt")).stdout)
    assert driver["version"] == "580.159.04" and driver["flavor"] == "open"
    nvml = json.loads(cli("parse", "nvml", str(FIXTURES / "nvidia-smi.txt")).stdout)
    assert nvml["status"] == "ok"


def test_parse_mismatch_text(tmp_path: Path) -> None:
    f = tmp_path / "smi.txt"
    f.write_text("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n")
    nvml = json.loads(cli("parse", "nvml", str(f)).stdout)
    assert nvml["status"] == "mismatch" and nvml["library_version"] == "580.159"


def test_parse_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "junk.csv"
    f.write_text("this is not, a gpu list\n")
    proc = cli("parse", "gpus", str(f))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "junk.csv" in proc.stderr


def test_parse_gpu_info_lists_one_gpu_per_file(tmp_path: Path) -> None:
    h200 = FIXTURES / "proc-driver-nvidia-gpus-0000_00_06.0-information.txt"
    second = tmp_path / "information"
    second.write_text(h200.read_text().replace("0000:00:06.0", "0000:00:07.0").replace("Minor: \t 0", "Minor: \t 1"))
    proc = cli("parse", "gpu-info", str(h200), str(second))
    assert proc.returncode == 0, proc.stderr
    gpus = json.loads(proc.stdout)
    assert [(g["name"], g["bus_location"], g["device_minor"]) for g in gpus] == [
        ("NVIDIA H200", "0000:00:06.0", 0), ("NVIDIA H200", "0000:00:07.0", 1)]
    assert gpus[0]["uuid"] == "GPU-ee3729f3-f3e0-707b-4478-8312f077d0e1" and gpus[0]["excluded"] is False


def test_parse_gpu_info_bad_file_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "information"
    bad.write_text("Model: \t\t NVIDIA H200\nDevice Minor: \t zero\n")
    proc = cli("parse", "gpu-info", str(FIXTURES / "proc-driver-nvidia-gpus-0000_00_06.0-information.txt"), str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and str(bad) in proc.stderr and "missing IRQ:" in proc.stderr


def test_parse_one_file_kinds_refuse_several(tmp_path: Path) -> None:
    proc = cli("parse", "driver", str(FIXTURES / "proc-driver-nvidia-version.txt"), str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("dflash-infra: parse driver: expected one input file, found 2 "
                                   "(only gpu-info reads several)")


def test_parse_missing_file_exit_2() -> None:
    proc = cli("parse", "driver", "/nonexistent/version")
    assert proc.returncode == 2 and "/nonexistent/version" in proc.stderr


def test_bench_compare_prints_two_deployments_side_by_side(tmp_path: Path) -> None:
    row = {"concurrency": 4, "requests": 32, "failed": 0, "output_tokens_per_s": 300.0, "requests_per_s": 2.0,
           "accept_length_mean": 4.5, "verify_ct": 400}
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    # A deployment record as the load gate writes it (`load`: inputs and figures), and a bare list of figures.
    before.write_text(json.dumps({"plan": {}, "load": {"inputs": {"requests": 32}, "figures": [row]}}))
    after.write_text(json.dumps([{**row, "output_tokens_per_s": 330.0}]))
    out = cli("bench", "compare", str(before), str(after))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].split() == ["before.json", "after.json", "ratio"]
    assert [line.split()[-3:] for line in out.stdout.splitlines() if "output tok/s" in line] == [
        ["300.0", "330.0", "1.10"]]
    empty = tmp_path / "record.json"
    empty.write_text(json.dumps({"plan": {}}))
    refused = cli("bench", "compare", str(empty), str(after))
    assert refused.returncode == 2 and "expected a deployment record with `load` figures" in refused.stderr
