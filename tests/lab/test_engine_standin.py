"""The lab's SGLang engine stand-in (lab/engine): built wheel, parser, DFLASH rules, logs, HTTP, failures.

Everything runs against the wheel as the lab installs it: built by lab/engine/build_wheel.sh into
.cache/lab/wheelhouse, installed with pip --no-index into a fresh venv. Servers bind to 127.0.0.1
on a free port. No lab containers are needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra.planner import plan_dict

pytestmark = pytest.mark.standin

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "lab" / "engine" / "build_wheel.sh"
WHEELHOUSE = REPO / ".cache" / "lab" / "wheelhouse"
MODELS = REPO / "dflash_infra" / "data" / "models"
VERSION = "0.5.23+lab"
TS = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: DP\d+)?(?: TP\d+)?\]"
# SGLang 0.5.23 log formats (model_runner.py, memory_pool.py, kv_cache_configurator.py, http_server.py).
FORMATS = {
    "load_end": rf"^{TS} Load weight end\. elapsed=\d+\.\d\d s, type=\w+, avail mem=\d+\.\d\d GB, "
                r"mem usage=\d+\.\d\d GB\.$",
    "kv": rf"^{TS} KV Cache is allocated\. dtype: torch\.\w+, #tokens: \d+, K size: \d+\.\d\d GB, "
          r"V size: \d+\.\d\d GB$",
    "pool_end": rf"^{TS} Memory pool end\. avail mem=\d+\.\d\d GB$",
    "mamba": rf"^{TS} Mamba Cache is allocated\. max_mamba_cache_size: \d+, conv_state size: \d+\.\d\dGB, "
             r"ssm_state size: \d+\.\d\dGB intermediate_ssm_state_cache size: \d+\.\d\dGB "
             r"intermediate_conv_window_cache size: \d+\.\d\dGB $",
    "ready": rf"^{TS} The server is fired up and ready to roll!$",
}


@dataclass
class Proc:
    """A running stand-in: its process, port, stderr log file and GPU registration folder."""

    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    procs_dir: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Fixtures: wheel, venv, model directories, planner argv
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def wheel() -> Path:
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run([str(BUILD)], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"build_wheel.sh failed:\n{proc.stdout}{proc.stderr}"
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path == WHEELHOUSE / f"sglang-{VERSION}-py3-none-any.whl" and path.is_file()
    return path


@pytest.fixture(scope="session")
def venv_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the stand-in installed from the wheelhouse, as the engine role does."""
    venv = tmp_path_factory.mktemp("engine-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--find-links",
                          str(WHEELHOUSE), f"sglang=={VERSION}"], capture_output=True, text=True, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Target and drafter directories holding the real config.json files."""
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for key, name in (("target", "Qwen3.6-27B"), ("draft", "Qwen3.6-27B-DFlash")):
        (root / name).mkdir()
        shutil.copy(MODELS / name / "config.json", root / name / "config.json")
        dirs[key] = root / name
    return dirs


@pytest.fixture(scope="session")
def plan() -> dict[str, Any]:
    request = yaml.safe_load((REPO / "examples" / "pro6000.yml").read_text())
    result = plan_dict(request, base=REPO / "examples")
    assert not result["errors"], result["errors"]
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_flag(argv: list[str], flag: str, value: str | None) -> list[str]:
    """argv with `flag` set to `value` (appended if absent) or removed (value None)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out if value is None else [*out, flag, value]


@pytest.fixture(scope="session")
def planner_argv(plan: dict[str, Any], model_dirs: dict[str, Path]) -> list[str]:
    """The planner's engine argv for examples/pro6000.yml, pointed at local model dirs and loopback."""
    argv = list(plan["args"])
    for flag, value in (("--model-path", str(model_dirs["target"])),
                        ("--speculative-draft-model-path", str(model_dirs["draft"])), ("--host", "127.0.0.1")):
        assert flag in argv, f"expected {flag} in the planner argv {argv}"
        argv[argv.index(flag) + 1] = value
    return argv


@pytest.fixture(scope="session")
def gpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab GPU profile like /etc/dflash-lab/gpu-profile.json for ct200 (8 GPUs of 97887 MiB)."""
    path = tmp_path_factory.mktemp("profile") / "gpu-profile.json"
    path.write_text(json.dumps({"gpu_model": {"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                                              "memory_total_mib": 97887},
                                "gpus": [{"index": i} for i in range(8)]}))
    return path


def run_standin(python: Path, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "sglang.launch_server", *argv], capture_output=True, text=True,
                          env=env, check=False)


def start(python: Path, argv: list[str], tmp: Path, gpu_profile: Path, extra_env: dict[str, str] | None = None,
          port: int | None = None) -> Proc:
    procs_dir = tmp / "gpu-procs"
    procs_dir.mkdir(exist_ok=True)
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_") and k != "CUDA_VISIBLE_DEVICES"}
    env.update(DFLASH_LAB_GPU_PROFILE=str(gpu_profile), DFLASH_LAB_GPU_PROCS=str(procs_dir), **(extra_env or {}))
    log = tmp / f"standin-{port}.log"
    with log.open("wb") as fh:
        popen = subprocess.Popen([str(python), "-m", "sglang.launch_server", *set_flag(argv, "--port", str(port))],
                                 stdout=fh, stderr=subprocess.STDOUT, env=env)
    return Proc(popen, port, log, procs_dir)


def http(url: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_listening(proc: Proc) -> None:
    """Until the stand-in logs that uvicorn listens (or exits)."""
    while "Uvicorn running on" not in proc.text():
        assert proc.popen.poll() is None, f"stand-in exited with {proc.popen.returncode}:\n{proc.text()[-3000:]}"
        time.sleep(0.05)


def wait_ready(proc: Proc) -> None:
    """Until /health answers 200 (or the process exits)."""
    while True:
        assert proc.popen.poll() is None, f"stand-in exited with {proc.popen.returncode}:\n{proc.text()[-3000:]}"
        try:
            if http(proc.url("/health"))[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.05)


def stop(proc: Proc) -> int:
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
    return proc.popen.wait()


@pytest.fixture(scope="module")
def served(venv_python: Path, planner_argv: list[str], tmp_path_factory: pytest.TempPathFactory,
           gpu_profile: Path) -> Iterator[Proc]:
    """One stand-in started with the planner's argv, ready, for the HTTP tests."""
    proc = start(venv_python, planner_argv, tmp_path_factory.mktemp("served"), gpu_profile)
    wait_ready(proc)
    yield proc
    stop(proc)


# ---------------------------------------------------------------------------------------------
# Wheel and installation
# ---------------------------------------------------------------------------------------------

def test_wheel_carries_the_real_flag_table_and_says_it_is_a_stand_in(wheel: Path) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        table = json.loads(zf.read("sglang/standin/data/0.5.23.json"))
        metadata = zf.read(f"sglang-{VERSION}.dist-info/METADATA").decode()
    committed = json.loads((REPO / "dflash_infra" / "data" / "sglang" / "0.5.23.json").read_text())
    assert table == committed
    assert "sglang/launch_server.py" in names
    assert "Summary: LAB STAND-IN for SGLang" in metadata and "Never use in production" in metadata


def test_build_is_idempotent(wheel: Path) -> None:
    before = wheel.stat().st_mtime_ns
    proc = subprocess.run([str(BUILD)], cwd=REPO, env=dict(os.environ, PYTHON=sys.executable),
                          capture_output=True, text=True, check=True)
    assert "up to date" in proc.stdout
    assert wheel.stat().st_mtime_ns == before


def test_installed_in_a_fresh_venv_help_runs(venv_python: Path) -> None:
    proc = run_standin(venv_python, ["--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")
    assert "--speculative-draft-window-size" in proc.stdout
    version = subprocess.run([str(venv_python), "-c", "import sglang; print(sglang.__version__, sglang.STANDIN)"],
                             capture_output=True, text=True, check=True)
    assert version.stdout.split() == [VERSION, "True"]


# ---------------------------------------------------------------------------------------------
# Parser and start-up rules
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "message"), [
    (["--speculative-dflash-draft-window-size", "16"],
     "sglang serve: error: unrecognized arguments: --speculative-dflash-draft-window-size 16"),
    (["--cuda-graph-max-bs", "8"],
     "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill"),
    (["--mamba-scheduler-strategy", "auto"],
     "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy auto"),
    (["--tp-size", "two"],
     "sglang serve: error: argument --tp-size/--tensor-parallel-size: invalid int value: 'two'"),
])
def test_flags_0523_does_not_accept_exit_2_with_argparse_message(
        venv_python: Path, planner_argv: list[str], extra: list[str], message: str) -> None:
    proc = run_standin(venv_python, planner_argv + extra)
    assert proc.returncode == 2
    assert "usage: sglang serve [-h] --model-path MODEL_PATH" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == message


@pytest.mark.parametrize(("change", "last_line"), [
    ({"--speculative-draft-window-size": "8"},
     "ValueError: --speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
     "window_size=8, block_size=16."),
    ({"--pp-size": "2"}, "ValueError: Currently DFLASH speculative decoding only supports pp_size == 1."),
    ({"--speculative-draft-model-path": None},
     "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path."),
    ({"--speculative-dflash-block-size": "0"},
     "ValueError: DFLASH requires --speculative-dflash-block-size to be positive, got 0."),
    ({"--speculative-num-draft-tokens": "8"},
     "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they "
     "differ. For DFLASH they must match. speculative_num_draft_tokens=8, speculative_dflash_block_size=16."),
    ({"--model-path": "/nonexistent/Qwen3.6-27B"},
     "OSError: Incorrect path_or_model_id: '/nonexistent/Qwen3.6-27B'. Please provide either the path to a "
     "local folder or the repo_id of a model on the Hub."),
])
def test_dflash_startup_rules_exit_1_with_the_real_error(
        venv_python: Path, planner_argv: list[str], change: dict[str, str | None], last_line: str) -> None:
    argv = planner_argv
    for flag, value in change.items():
        argv = set_flag(argv, flag, value)
    proc = run_standin(venv_python, argv)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last):" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == last_line


def test_model_dir_without_config_json_fails_like_transformers(
        venv_python: Path, planner_argv: list[str], tmp_path: Path) -> None:
    proc = run_standin(venv_python, set_flag(planner_argv, "--speculative-draft-model-path", str(tmp_path)))
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1] == (
        f"OSError: {tmp_path} does not appear to have a file named config.json. Checkout "
        f"'https://huggingface.co/{tmp_path}/tree/None' for available files.")


# ---------------------------------------------------------------------------------------------
# Start-up log and HTTP surface (planner argv: tp 2 x dp 4 on the 8-GPU profile)
# ---------------------------------------------------------------------------------------------

def test_formats_match_real_sglang_log_lines() -> None:
    """The patterns used below match real SGLang lines captured from GPU machines."""
    real = (REPO / "tests" / "fixtures" / "sglang-logs" / "club3090-1261.log").read_text().splitlines()
    assert all(re.match(FORMATS["kv"], line) for line in real if "KV Cache is allocated" in line)
    assert all(re.match(FORMATS["pool_end"], line) for line in real if "Memory pool end" in line)
    assert sum(1 for line in real if "KV Cache is allocated" in line) == 4


def test_startup_log_lines_in_sglang_formats(served: Proc, plan: dict[str, Any]) -> None:
    lines = served.text().splitlines()
    for name, pattern in FORMATS.items():
        hits = [line for line in lines if re.match(pattern, line)]
        assert hits, f"no {name} line matching {pattern!r} in:\n" + "\n".join(lines[-40:])
    tp0 = [line for line in lines if line.startswith("[") and " DP0 TP0] " in line]
    kv = [int(re.search(r"#tokens: (\d+)", line).group(1)) for line in tp0 if "KV Cache is allocated" in line]
    assert len(kv) == 2 and kv[0] == kv[1] > 0  # target pool, then the drafter's pool of the same slots
    pool_end = [float(re.search(r"avail mem=([\d.]+)", line).group(1)) for line in tp0 if "Memory pool end" in line]
    gpu_gib = 97887 / 1024
    # What the static pool leaves free is GPU * (1 - mem_fraction_static), as in SGLang.
    assert pool_end[-1] == pytest.approx(gpu_gib * (1 - plan["mem_fraction_static"]), abs=0.05)
    loads = [line for line in lines if "Load weight end." in line and "type=Qwen3_5ForConditionalGeneration" in line]
    assert len(loads) == 8
    assert any(f"max_running_requests={plan['max_running_requests']}, context_len={plan['context_length']}" in line
               for line in tp0)


def test_health_and_models(served: Proc) -> None:
    status, body = http(served.url("/health"))
    assert (status, body) == (200, b"")
    status, body = http(served.url("/v1/models"))
    models = json.loads(body)
    assert status == 200 and models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["object"], card["owned_by"], card["root"], card["max_model_len"]) == (
        "Qwen3.6-27B", "model", "sglang", "Qwen3.6-27B", 262144)


def test_generate_returns_speculative_metadata(served: Proc) -> None:
    body = {"text": "Explain speculative decoding.", "sampling_params": {"max_new_tokens": 64}}
    status, raw = http(served.url("/generate"), body)
    assert status == 200
    out = json.loads(raw)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == len(out["output_ids"]) == 64
    assert meta["finish_reason"] == {"type": "length", "length": 64}
    assert meta["spec_verify_ct"] > 0
    assert meta["spec_accept_length"] == pytest.approx(64 / meta["spec_verify_ct"])
    assert 1.0 <= meta["spec_accept_length"] <= 16
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 15
    assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
    again = json.loads(http(served.url("/generate"), body)[1])
    assert again["text"] == out["text"] and again["meta_info"]["spec_verify_ct"] == meta["spec_verify_ct"]


SPEC_DETAIL_KEYS = ["spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                    "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                    "spec_correct_drafts_histogram", "spec_cap_lens_histogram"]  # SpecTokensDetails of 0.5.23


def test_openai_routes_return_the_speculative_figures_where_0523_puts_them(served: Proc) -> None:
    chat = {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "Explain speculative decoding."}],
            "max_tokens": 64, "temperature": 0}
    plain = json.loads(http(served.url("/v1/chat/completions"), chat)[1])
    assert "meta_info" not in plain["choices"][0] and "sglext" not in plain  # neither unless asked
    asked = json.loads(http(served.url("/v1/chat/completions"),
                            {**chat, "return_meta_info": True, "return_spec_tokens_details": True})[1])
    meta, details = asked["choices"][0]["meta_info"], asked["sglext"]["spec_tokens_details"]
    assert list(asked["choices"][0]) == ["index", "message", "logprobs", "finish_reason", "matched_stop", "meta_info"]
    assert meta["completion_tokens"] == 64 and meta["spec_accept_length"] == pytest.approx(64 / meta["spec_verify_ct"])
    assert list(details) == SPEC_DETAIL_KEYS
    assert (details["spec_accept_length"], details["spec_verify_ct"]) == (meta["spec_accept_length"],
                                                                          meta["spec_verify_ct"])
    assert (details["spec_cap_length"], details["spec_cap_lens_histogram"]) == (0.0, [])  # not in meta: defaults
    # /v1/completions has no meta_info on its choices in 0.5.23 (CompletionResponseChoice); sglext it has.
    completion = json.loads(http(served.url("/v1/completions"),
                                 {"model": "Qwen3.6-27B", "prompt": "Explain speculative decoding.", "max_tokens": 64,
                                  "return_meta_info": True, "return_spec_tokens_details": True})[1])
    assert "meta_info" not in completion["choices"][0]
    assert completion["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0
    status, raw = http(served.url("/v1/chat/completions"), {**chat, "return_meta_info": True, "stream": True})
    assert (status, json.loads(raw)) == (400, {
        "object": "error", "message": "return_meta_info is not supported with streaming. Please set stream=false "
        "when using return_meta_info=true.", "type": "BadRequest", "param": None, "code": 400})


# Reads JSON answers on stdin as {"kind": ..., "answer": ...}; prints each as SGLang 0.5.23's own response model
# serializes it after validating it (what the real server would have sent for the same values).
REAL_SHAPE = """
import json, sys
from sglang.srt.entrypoints.openai.protocol import ChatCompletionResponse, CompletionResponse
models = {"chat": ChatCompletionResponse, "completion": CompletionResponse}
print(json.dumps([models[item["kind"]].model_validate(item["answer"]).model_dump(mode="json")
                  for item in json.load(sys.stdin)]))
"""


def real_0523_python() -> Path:
    """The Python of the cached SGLang 0.5.23 parser venv (tools/sglang_parser_env.sh); skips when it is missing."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import sglang_real
    finally:
        sys.path.pop(0)
    try:
        return Path(sglang_real.launcher("0.5.23"))
    except sglang_real.ParserEnvMissing as e:
        pytest.skip(str(e))


@pytest.mark.sglang_parser
def test_openai_answers_are_shaped_as_the_real_0523_response_models_serialize_them(served: Proc) -> None:
    python = real_0523_python()
    asks = {"return_meta_info": True, "return_spec_tokens_details": True, "max_tokens": 16}
    answers = [
        {"kind": "chat", "answer": json.loads(http(served.url("/v1/chat/completions"), {
            "model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}], **asks})[1])},
        {"kind": "chat", "answer": json.loads(http(served.url("/v1/chat/completions"), {
            "model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})[1])},
        {"kind": "completion", "answer": json.loads(http(served.url("/v1/completions"), {
            "model": "Qwen3.6-27B", "prompt": "hi", **asks})[1])},
    ]
    proc = subprocess.run([str(python), "-c", REAL_SHAPE], input=json.dumps(answers), capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for item, real in zip(answers, json.loads(proc.stdout), strict=True):
        assert item["answer"] == real, item["kind"]


# Reads the stand-in's /v1/loads answers on stdin ({"include": [...] | null, "loads": [...]}); prints what 0.5.23
# answers for the same values: each load rebuilt as its LoadSnapshot (load_snapshot.py) and given back by to_dict,
# and the prometheus text of v1_loads.py's own _format_loads_prometheus (its source, run without FastAPI).
REAL_LOADS = """
import ast, json, sys
from pathlib import Path
import msgspec
import sglang.srt.managers.load_snapshot as ls
source = Path(ls.__file__).parent.parent / "entrypoints" / "v1_loads.py"
tree = ast.parse(source.read_text())
fmt = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_format_loads_prometheus")
space = {"Response": lambda content, media_type: (content, media_type)}
exec(compile(ast.Module([fmt], []), str(source), "exec"), space)
out = []
for item in json.load(sys.stdin):
    include = set(item["include"]) if item["include"] else None
    snaps = []
    for load in item["loads"]:
        sections = {"speculative": ls.SpeculativeMetrics(**load.pop("speculative"))} if "speculative" in load else {}
        snaps.append(ls.LoadSnapshot(**load, **sections))
    text, media = space["_format_loads_prometheus"](snaps, include)
    out.append({"core_keys": list(ls._CORE_KEYS), "loads": [s.to_dict(include) for s in snaps], "prometheus": text,
                "media_type": media})
try:
    ls.LoadSnapshot().to_dict({"core", "bogus"})
except ValueError as e:
    out.append(str(e))
print(json.dumps(out))
"""


@pytest.mark.sglang_parser
def test_loads_are_what_0523_answers_and_count_the_requests_in_flight(served: Proc) -> None:
    """GET /v1/loads, which smg-ctl's drain reads until the engine has nothing running or waiting: the stand-in's
    loads are what 0.5.23's LoadSnapshot gives back for the same values (every core key, the speculative section,
    the include filter, the 400 of an unknown section, the prometheus text), and a request being answered counts."""
    python = real_0523_python()
    idle = json.loads(http(served.url("/v1/loads"))[1])
    assert idle["version"] == VERSION and idle["num_accelerators"] == 2 and idle["accelerator"], idle
    core = json.loads(http(served.url("/v1/loads?include=core"))[1])["loads"]
    late = threading.Thread(target=http, args=(served.url("/generate"),
                                               {"text": "hi", "sampling_params": {"max_new_tokens": 400}}))
    late.start()
    try:
        while not (busy := json.loads(http(served.url("/v1/loads?include=core"))[1])["loads"])[0]["num_running_reqs"]:
            assert late.is_alive(), "the request ended before /v1/loads counted it"
    finally:
        late.join()
    after = json.loads(http(served.url("/v1/loads?include=core"))[1])["loads"]
    assert (busy[0]["num_running_reqs"], busy[0]["num_waiting_reqs"], after[0]["num_running_reqs"]) == (1, 0, 0)
    spec = json.loads(http(served.url("/v1/loads?include=spec"))[1])["loads"]  # nothing changes in between
    status, prom = http(served.url("/v1/loads?format=prometheus&include=spec"))
    status_bad, bad = http(served.url("/v1/loads?include=core,bogus"))
    asked = [{"include": None, "loads": idle["loads"]}, {"include": ["core"], "loads": core},
             {"include": ["core"], "loads": busy}, {"include": ["spec"], "loads": spec}]
    proc = subprocess.run([str(python), "-c", REAL_LOADS], input=json.dumps(asked), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *real, invalid = json.loads(proc.stdout)
    for item, answer in zip(asked, real, strict=True):
        assert item["loads"] == answer["loads"], item["include"]
        assert list(item["loads"][0])[:len(answer["core_keys"])] == answer["core_keys"]
    assert "speculative" in idle["loads"][0] and "speculative" not in core[0]
    assert (status_bad, json.loads(bad)) == (400, {"detail": invalid})
    # The prometheus text of 0.5.23 for the same snapshot, but for the time it was taken.
    untimed = [line for line in prom.decode().splitlines() if not line.startswith("sglang_timestamp")]
    assert status == 200 and untimed == [line for line in real[3]["prometheus"].splitlines()
                                         if not line.startswith("sglang_timestamp")], prom.decode()


# Reads the events of a streamed chat answer on stdin ({"kind": role|content|finish|sglext|usage, "event": ...});
# prints each as 0.5.23's serving_chat.py writes it for the same values (sse_utils.build_sse_content for the choice
# chunks, ChatCompletionStreamResponse.model_dump_json for the sglext and usage chunks).
REAL_STREAM = """
import json, sys
from sglang.srt.entrypoints.openai.protocol import ChatCompletionStreamResponse, SglExt, SpecTokensDetails, UsageInfo
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
out = []
for item in json.load(sys.stdin):
    e = item["event"]
    head = dict(chunk_id=e["id"], created=e["created"], model=e["model"], index=0)
    if item["kind"] in ("role", "content", "finish"):
        c = e["choices"][0]
        d = c["delta"]
        out.append(build_sse_content(**head, role=d.get("role"), content=d.get("content"),
                                     reasoning_content=d["reasoning_content"], finish_reason=c["finish_reason"],
                                     matched_stop=c["matched_stop"]))
    else:
        extra = ({"sglext": SglExt(spec_tokens_details=SpecTokensDetails(**e["sglext"]["spec_tokens_details"]))}
                 if item["kind"] == "sglext" else {"usage": UsageInfo(**e["usage"])})
        out.append("data: " + ChatCompletionStreamResponse(id=e["id"], created=e["created"], model=e["model"],
                                                           choices=[], **extra).model_dump_json() + "\\n\\n")
print(json.dumps(out))
"""


def stream_events(raw: bytes) -> list[str]:
    """The server-sent events of a stream, each as sent (`data: ...\\n\\n`)."""
    return [event + "\n\n" for event in raw.decode().split("\n\n") if event]


def test_a_streamed_chat_answer_sends_one_chunk_per_step_then_finish_sglext_usage_and_done(served: Proc) -> None:
    body = {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "Explain speculative decoding."}],
            "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True},
            "return_spec_tokens_details": True}
    status, raw = http(served.url("/v1/chat/completions"), body)
    events = stream_events(raw)
    assert status == 200 and events[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    role, *contents, finish, sglext, usage = chunks
    assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    details = sglext["sglext"]["spec_tokens_details"]
    # One content chunk per verify step (several tokens each); together they are the whole answer.
    assert len(contents) == details["spec_verify_ct"] > 1
    text = "".join(c["choices"][0]["delta"]["content"] for c in contents)
    assert len(text.split()) == usage["usage"]["completion_tokens"] == 64
    assert finish["choices"][0]["finish_reason"] == "length" and usage["choices"] == []
    assert details["spec_accept_length"] == pytest.approx(64 / details["spec_verify_ct"])
    # Without the two asks: neither the sglext nor the usage chunk.
    plain = stream_events(http(served.url("/v1/chat/completions"), {**body, "stream_options": None,
                                                                    "return_spec_tokens_details": False})[1])
    assert not any('"sglext"' in e or '"usage"' in e for e in plain) and plain[-1] == "data: [DONE]\n\n"


@pytest.mark.sglang_parser
def test_a_streamed_chat_answer_is_byte_for_byte_what_0523_writes(served: Proc) -> None:
    python = real_0523_python()
    raw = http(served.url("/v1/chat/completions"), {
        "model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": True,
        "stream_options": {"include_usage": True}, "return_spec_tokens_details": True})[1]
    events = stream_events(raw)[:-1]
    kinds = ["role", *["content"] * (len(events) - 4), "finish", "sglext", "usage"]
    items = [{"kind": k, "event": json.loads(e[len("data: "):])} for k, e in zip(kinds, events, strict=True)]
    proc = subprocess.run([str(python), "-c", REAL_STREAM], input=json.dumps(items), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert events == json.loads(proc.stdout)


def test_chat_completions_and_server_info(served: Proc) -> None:
    status, raw = http(served.url("/v1/chat/completions"),
                       {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    chat = json.loads(raw)
    assert status == 200 and chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 8
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 8
    info = json.loads(http(served.url("/get_server_info"))[1])
    assert info["version"] == VERSION
    assert (info["tp_size"], info["dp_size"], info["speculative_algorithm"]) == (2, 4, "DFLASH")
    assert info["speculative_num_draft_tokens"] == 16


def test_registers_on_the_gpus_for_the_lab_nvidia_smi(served: Proc) -> None:
    reg = json.loads((served.procs_dir / f"{served.popen.pid}.json").read_text())
    assert reg["pid"] == served.popen.pid and reg["process_name"] == "python3"
    assert [g["index"] for g in reg["gpus"]] == list(range(8))
    spec = importlib.util.spec_from_file_location("lab_nvidia_smi", REPO / "lab" / "kit" / "nvidia_smi.py")
    assert spec is not None and spec.loader is not None
    smi = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = smi  # dataclasses look their module up while the file executes
    spec.loader.exec_module(smi)
    listed = [p for p in smi.live_processes(str(served.procs_dir)) if p.pid == served.popen.pid]
    assert len(listed) == 8 and all(70000 < p.used_memory_mib < 97887 for p in listed)


def test_sigterm_unregisters_and_exits_0(venv_python: Path, planner_argv: list[str], tmp_path: Path,
                                         gpu_profile: Path) -> None:
    proc = start(venv_python, planner_argv, tmp_path, gpu_profile, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    wait_ready(proc)
    assert (proc.procs_dir / f"{proc.popen.pid}.json").is_file()
    assert stop(proc) == 0
    assert not any(proc.procs_dir.iterdir())


# ---------------------------------------------------------------------------------------------
# Failure injection
# ---------------------------------------------------------------------------------------------

def test_crash_at_start_exits_1_after_weight_load(venv_python: Path, planner_argv: list[str], tmp_path: Path,
                                                  gpu_profile: Path) -> None:
    proc = start(venv_python, planner_argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_CRASH_AT_START": "1"})
    assert proc.popen.wait() == 1
    text = proc.text()
    assert text.index("Load weight end.") < text.index("Scheduler hit an exception: Traceback")
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in text
    assert "Received sigquit from a child process. It usually means the child failed." in text
    assert "fired up" not in text and not any(proc.procs_dir.iterdir())


def test_tp1_on_a_48gb_card_dies_of_cuda_oom_while_loading(venv_python: Path, planner_argv: list[str],
                                                            tmp_path: Path, gpu_profile: Path) -> None:
    """The A6000 mistake: 27B weights do not fit one 48 GB GPU; the load fails, nothing is served."""
    argv = set_flag(set_flag(planner_argv, "--tp-size", "1"), "--dp-size", "1")
    proc = start(venv_python, argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_GPU_MEMORY_MIB": "49140"})
    assert proc.popen.wait() == 1
    text = proc.text()
    assert "Load weight begin. avail mem=" in text and "Load weight end." not in text
    assert re.search(r"^torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate \d+\.\d\d GiB\. "
                     r"GPU 0 has a total capacity of 47\.99 GiB", text, re.M)


def test_an_api_key_guards_every_route_but_health_as_the_engine_middleware_does(
        venv_python: Path, planner_argv: list[str], tmp_path: Path, gpu_profile: Path) -> None:
    # SGLang 0.5.23 srt/utils/auth.py: with --api-key, /health*, /ready* and /metrics* stay open (probes), every
    # other route (unknown ones too: the middleware runs before routing) needs `Bearer <key>`, else 401.
    key = "lab-standin-key-not-a-secret-41"
    proc = start(venv_python, [*planner_argv, "--api-key", key], tmp_path, gpu_profile)
    try:
        wait_ready(proc)
        chat = {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert call(proc.url("/health"))[0] == 200 and call(proc.url("/ready"))[0] == 200
        assert call(proc.url("/v1/models")) == (401, {"error": "Unauthorized"})
        assert call(proc.url("/v1/chat/completions"), "", chat) == (401, {"error": "Unauthorized"})
        assert call(proc.url("/v1/chat/completions"), "not-the-key", chat)[0] == 401
        assert call(proc.url("/no-such-route"))[0] == 401
        assert call(proc.url("/v1/models"), key)[0] == 200
        status, answer = call(proc.url("/v1/chat/completions"), key, chat)
        assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer
        assert call(proc.url("/no-such-route"), key)[0] == 404
    finally:
        assert stop(proc) == 0


def test_hang_never_becomes_ready(venv_python: Path, planner_argv: list[str], tmp_path: Path,
                                  gpu_profile: Path) -> None:
    proc = start(venv_python, planner_argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_HANG": "1"})
    try:
        wait_listening(proc)
        for _ in range(5):
            assert http(proc.url("/health"))[0] == 503
            time.sleep(0.1)
        assert "fired up" not in proc.text()
    finally:
        assert stop(proc) == 0


def test_fail_generate_answers_500(venv_python: Path, planner_argv: list[str], tmp_path: Path,
                                   gpu_profile: Path) -> None:
    proc = start(venv_python, planner_argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_FAIL_GENERATE": "1"})
    try:
        wait_ready(proc)
        assert http(proc.url("/generate"), {"text": "x", "sampling_params": {"max_new_tokens": 4}})[0] == 500
        assert http(proc.url("/v1/models"))[0] == 200
    finally:
        stop(proc)


# What SGLang 0.5.23 exports with --enable-metrics (srt/metrics/collector.py; labels as scheduler_metrics_mixin.py and
# tokenizer_manager.py set them): the stand-in's names, types and label names must be these.
SCHEDULER_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank"}
TOKENIZER_LABELS = {"model_name", "engine_type"}
ENGINE_METRICS = {"sglang:num_running_reqs": "gauge", "sglang:num_queue_reqs": "gauge",
                  "sglang:gen_throughput": "gauge", "sglang:spec_accept_length": "gauge",
                  "sglang:spec_accept_rate": "gauge", "sglang:max_total_num_tokens": "gauge",
                  "sglang:prompt_tokens": "counter", "sglang:generation_tokens": "counter",
                  "sglang:num_requests": "counter", "sglang:num_aborted_requests": "counter"}


def scrape(proc: Proc) -> dict[str, Any]:
    """/metrics parsed by prometheus_client's own parser: family name -> family."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(proc.url("/metrics")) as response:
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Any], name: str) -> float:
    family = families[name.removesuffix("_total")]
    (sample,) = [s for s in family.samples if s.name == name]
    return float(sample.value)


def test_metrics_are_sglang_s_names_and_follow_the_requests(venv_python: Path, planner_argv: list[str],
                                                            tmp_path: Path, gpu_profile: Path) -> None:
    assert "--enable-metrics" in planner_argv
    proc = start(venv_python, planner_argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_STEP_MS": "100"})
    try:
        wait_ready(proc)
        idle = scrape(proc)
        assert {name: family.type for name, family in idle.items()} == ENGINE_METRICS
        for name, family in idle.items():
            (sample,) = family.samples
            assert set(sample.labels) == (SCHEDULER_LABELS if family.type == "gauge" else TOKENIZER_LABELS), name
            assert (sample.labels["model_name"], sample.labels["engine_type"]) == ("Qwen3.6-27B", "unified")
        assert value(idle, "sglang:num_requests_total") == 0 and value(idle, "sglang:num_running_reqs") == 0
        assert value(idle, "sglang:max_total_num_tokens") > 0  # the stand-in's KV pool, as its start-up log says

        metas: list[dict[str, Any]] = []
        prompts = ["Explain speculative decoding.", "Write a sort in Python.", "What is 17 * 23?"]

        def one(prompt: str) -> None:
            raw = http(proc.url("/generate"), {"text": prompt, "sampling_params": {"max_new_tokens": 48}})[1]
            metas.append(json.loads(raw)["meta_info"])

        threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while value(scrape(proc), "sglang:num_running_reqs") < len(prompts):  # each holds its slot for steps x 0.1 s
            assert time.monotonic() < deadline, "the requests in flight never showed as running"
            time.sleep(0.02)
        assert value(scrape(proc), "sglang:num_queue_reqs") == 0  # the plan's max_running_requests is above 3
        for t in threads:
            t.join()

        after = scrape(proc)
        assert value(after, "sglang:num_running_reqs") == 0
        assert value(after, "sglang:num_requests_total") == len(prompts)
        assert value(after, "sglang:generation_tokens_total") == sum(m["completion_tokens"] for m in metas) == 144
        assert value(after, "sglang:prompt_tokens_total") == sum(m["prompt_tokens"] for m in metas)
        assert value(after, "sglang:spec_accept_length") == pytest.approx(
            sum(m["spec_accept_length"] for m in metas) / len(metas))
        assert value(after, "sglang:gen_throughput") > 0
    finally:
        stop(proc)


def test_metrics_answer_404_without_enable_metrics(venv_python: Path, planner_argv: list[str], tmp_path: Path,
                                                   gpu_profile: Path) -> None:
    proc = start(venv_python, [a for a in planner_argv if a != "--enable-metrics"], tmp_path, gpu_profile)
    try:
        wait_ready(proc)
        assert http(proc.url("/metrics")) == (404, b'{"detail": "Not Found"}')
    finally:
        stop(proc)


def test_start_delay_keeps_the_port_closed_while_loading(venv_python: Path, planner_argv: list[str],
                                                          tmp_path: Path, gpu_profile: Path) -> None:
    proc = start(venv_python, planner_argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_START_DELAY": "1.5"})
    try:
        while "Load weight begin." not in proc.text():
            assert proc.popen.poll() is None, proc.text()
            time.sleep(0.05)
        with pytest.raises(urllib.error.URLError):
            http(proc.url("/health"))
        wait_ready(proc)
        elapsed = float(re.search(r"Load weight end\. elapsed=([\d.]+) s", proc.text()).group(1))
        assert elapsed >= 1.5
    finally:
        assert stop(proc) == 0


# ---------------------------------------------------------------------------------------------
# Agreement with SGLang's real parser (needs the cached parser environment)
# ---------------------------------------------------------------------------------------------

AGREEMENT_EXTRAS: list[list[str]] = [
    [],
    ["--speculative-dflash-draft-window-size", "16"],
    ["--cuda-graph-max-bs", "8"],
    ["--cuda-graph-max-bs-decode", "8"],
    ["--mamba-scheduler-strategy", "auto"],
    ["--mamba-radix-cache-strategy", "auto"],
    ["--tp-size", "two"],
    ["--speculative-algorithm", "DDTREE"],
    ["--speculative-ddtree-budget", "8"],
    ["--disable-cuda-graph"],
    ["--monokernel-backend", "amd"],
    ["--enable-tf32-matmul"],
    ["--no-enable-tf32-matmul"],
    ["--chunked-prefill-size", "8k"],
    ["--max-total-tokens", "1Mi"],
    ["--lora-paths", "a=/x", "b=/y"],
    ["--kv-cache-dtype", "fp8_e4m3"],
    ["--kv-cache-dtype", "fp9"],
    ["--speculative-accept-threshold-single", "0.9"],
    ["--mem-frac", "0.8"],
]

STANDIN_ARGCHECK = r"""
import argparse, contextlib, copy, io, json, sys
from sglang.standin import flags
parser = flags.build_parser(flags.load_table("0.5.23"))
quiet = copy.deepcopy(parser)
for a in quiet._actions:
    a.default = argparse.SUPPRESS
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            full = parser.parse_args(argv)
            given = vars(quiet.parse_args(argv))
        out.append({"ok": True, "namespace": {d: getattr(full, d) for d in sorted(given)}})
    except SystemExit:
        text = err.getvalue()
        out.append({"ok": False, "error": text[text.rfind(": error: ") + 9:].strip()})
json.dump(out, sys.stdout)
"""


@pytest.mark.sglang_parser
def test_standin_and_real_parser_agree(venv_python: Path, planner_argv: list[str]) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import sglang_real
    finally:
        sys.path.pop(0)
    try:
        sglang_real.launcher("0.5.23")
    except sglang_real.ParserEnvMissing as e:
        pytest.skip(str(e))
    argvs = [planner_argv + extra for extra in AGREEMENT_EXTRAS]
    real = sglang_real.check_argvs("0.5.23", argvs)
    proc = subprocess.run([str(venv_python), "-c", STANDIN_ARGCHECK], input=json.dumps(argvs),
                          capture_output=True, text=True, check=True)
    ours = json.loads(proc.stdout)
    for argv_extra, r, o in zip(AGREEMENT_EXTRAS, real, ours, strict=True):
        assert o["ok"] == r["ok"], f"{argv_extra}: real ok={r['ok']} ({r['error']}), stand-in ok={o['ok']}"
        if r["ok"]:
            assert json.loads(json.dumps(o["namespace"])) == r["namespace"], argv_extra
        else:
            assert o["error"] == r["error"], argv_extra


# ---------------------------------------------------------------------------------------------
# Behind the real SGLang Model Gateway (smg 1.13.0 from its lab lock): the smg_gateway role's launcher and
# control-plane client, run as the unit runs them, in front of two stand-ins
# ---------------------------------------------------------------------------------------------

GATEWAY_FILES = REPO / "roles" / "smg_gateway" / "files"
DATA_KEY, CONTROL_KEY = "standin-data-key-not-a-secret-3b9a", "standin-control-key-not-a-secret-81c4"


def call(url: str, key: str = "", body: dict[str, Any] | None = None, method: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                     headers={"content-type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def ctl(url: str, credentials: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(GATEWAY_FILES / "smg-ctl"), "--url", url, "--credentials",
                           str(credentials), *args], capture_output=True, text=True, check=False)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def consecutive_free_ports(count: int) -> int:
    while True:
        base = free_port()
        if base + count <= 65535 and all(_free(base + i) for i in range(1, count)):
            return base


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Routed:
    """Two stand-ins behind the real gateway started by smg-launch with its keys as credentials."""

    url: str
    workers: list[str]
    credentials: Path
    gateway: subprocess.Popen[bytes]
    log: Path
    engines: list[Proc]
    metrics_url: str  # the gateway's Prometheus port (--prometheus-port)
    settle: int  # seconds smg keeps a drained worker before removing it (the plan's drain_settle_secs)


def start_gateway(smg_python: Path, tmp: Path, workers: int) -> tuple[dict[str, Any], Path, Path,
                                                                     subprocess.Popen[bytes]]:
    """The real gateway started by smg-launch for `workers` workers on consecutive free ports, its keys as
    credentials: (its checked section, the credentials folder, its log, its process)."""
    from dflash_infra.planning import gateway

    section = gateway.checked_section({"worker_base_port": consecutive_free_ports(workers),
                                       "prometheus_port": free_port()}, {"host": "127.0.0.1", "port": free_port()},
                                      workers)
    credentials = tmp / "credentials"
    credentials.mkdir(mode=0o700)
    (credentials / "api-key").write_text(DATA_KEY + "\n")
    assert ctl("http://unused", credentials, "init-key")[1]["changed"] is True
    (credentials / "control-plane-key").write_text(CONTROL_KEY + "\n")  # known here, to test the control plane
    log = tmp / "gateway.log"
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    with log.open("wb") as fh:
        popen = subprocess.Popen([str(smg_python), str(GATEWAY_FILES / "smg-launch"), *section["args"]], stdout=fh,
                                 stderr=subprocess.STDOUT, env={**env, **section["environment"],
                                                                "CREDENTIALS_DIRECTORY": str(credentials)})
    return section, credentials, log, popen


@pytest.fixture(scope="module")
def routed(venv_python: Path, smg_python: Path, planner_argv: list[str], gpu_profile: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    tmp = tmp_path_factory.mktemp("routed")
    section, credentials, log, popen = start_gateway(smg_python, tmp, 2)
    engines = [start(venv_python, planner_argv, tmp, gpu_profile, port=section["settings"]["worker_base_port"] + i)
               for i in range(2)]
    url = f"http://127.0.0.1:{section['port']}"
    for engine in engines:
        wait_ready(engine)
    try:
        while ctl(url, credentials, "ready", "--workers", *section["workers"])[0] != 0:
            assert popen.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        yield Routed(url, section["workers"], credentials, popen, log, engines,
                     f"http://127.0.0.1:{section['settings']['prometheus_port']}/metrics",
                     section["settings"]["drain_settle_secs"])
    finally:
        popen.terminate()
        popen.wait(timeout=30)
        for engine in engines:
            stop(engine)


@pytest.mark.smg_parser
def test_the_gateway_serves_both_engines_with_the_key_and_refuses_without(routed: Routed) -> None:
    rc, ready = ctl(routed.url, routed.credentials, "ready", "--workers", *routed.workers)
    assert rc == 0 and ready["detail"] == "/health 200; 2 worker(s) ready", ready
    chat = {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    status, answer = call(routed.url + "/v1/chat/completions", DATA_KEY, chat)
    assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer
    status, answer = call(routed.url + "/generate", DATA_KEY, {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and answer["meta_info"]["completion_tokens"] == 4, answer
    assert call(routed.url + "/v1/chat/completions", "", chat)[0] == 401
    assert call(routed.url + "/workers", DATA_KEY)[0] == 401  # the endpoint's key is not the control plane's
    assert call(routed.url + "/workers", CONTROL_KEY)[0] == 200


@pytest.mark.smg_parser
def test_the_gateway_exports_the_metrics_the_dashboard_reads(routed: Routed) -> None:
    """smg 1.13.0's own Prometheus port, after requests through it: every gateway metric of dashboards/dflash.json
    is there, labelled by the worker's URL where the dashboard groups by worker; each engine's /metrics counted its
    share."""
    from prometheus_client.parser import text_string_to_metric_families

    sys.path.insert(0, str(REPO / "tools"))
    import grafana_dashboard  # tools/ is no package

    chat = {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "metrics"}], "max_tokens": 8}
    for _ in range(4):
        assert call(routed.url + "/v1/chat/completions", DATA_KEY, chat)[0] == 200
    with urllib.request.urlopen(routed.metrics_url) as response:
        samples = [s for f in text_string_to_metric_families(response.read().decode()) for s in f.samples]
    names = {s.name for s in samples}
    assert set(grafana_dashboard.GATEWAY_METRICS) <= names, sorted(n for n in names if n.startswith("smg_"))
    workers = {s.labels.get("worker") for s in samples if s.name == "smg_worker_requests_active"}
    assert workers and workers <= set(routed.workers), workers  # the workers' URLs (cache_aware may pick one)
    served = [value(scrape(engine), "sglang:num_requests_total") for engine in routed.engines]
    assert sum(served) >= 4


@pytest.mark.smg_parser
def test_the_gateway_passes_the_speculative_figures_through(routed: Routed) -> None:
    """What a load gate reads behind the gateway: smg forwards return_meta_info and return_spec_tokens_details
    and gives back choices[i].meta_info and sglext as the engine sent them."""
    chat = {"model": "Qwen3.6-27B", "messages": [{"role": "user", "content": "Explain speculative decoding."}],
            "max_tokens": 64, "temperature": 0, "return_meta_info": True, "return_spec_tokens_details": True}
    status, through = call(routed.url + "/v1/chat/completions", DATA_KEY, chat)
    assert status == 200, through
    status, direct = call(routed.workers[0] + "/v1/chat/completions", "", chat)
    assert status == 200, direct
    assert list(through["sglext"]["spec_tokens_details"]) == SPEC_DETAIL_KEYS
    for key in ("spec_accept_length", "spec_verify_ct", "spec_correct_drafts_histogram"):
        assert through["choices"][0]["meta_info"][key] == direct["choices"][0]["meta_info"][key], key
        assert through["sglext"]["spec_tokens_details"][key] == direct["sglext"]["spec_tokens_details"][key], key


@pytest.mark.smg_parser
def test_a_worker_is_drained_out_and_added_back_through_the_control_plane(routed: Routed) -> None:
    """The drain returns once smg removed the worker (after the plan's 1 s settle, not smg's 5 s) and the engine has
    finished what it was answering: a generation longer than the settle is not cut by the restart that follows."""
    first = routed.workers[0]
    answered: list[tuple[int, Any]] = []
    began = time.monotonic()
    long = threading.Thread(target=lambda: answered.append((*call(first + "/generate", "", {
        "text": "hi", "sampling_params": {"max_new_tokens": 12000}}), time.monotonic() - began)))
    long.start()
    while not json.loads(http(first + "/v1/loads?include=core")[1])["loads"][0]["num_running_reqs"]:
        assert long.is_alive()
    rc, drained = ctl(routed.url, routed.credentials, "drain", "--worker", first)
    finished = not long.is_alive()
    long.join()
    assert rc == 0 and drained == {"state": "done", "changed": True, "detail": f"{first} drained and removed; the "
                                   "engine has no request running or waiting"}, drained
    status, body, took = answered[0]
    assert finished and status == 200 and body["meta_info"]["completion_tokens"] == 12000, answered
    assert took > 2 * routed.settle, f"the generation took {took:.1f} s: not longer than the settle it must outlast"
    assert f"Draining 1 worker(s) for {routed.settle}s before removal" in routed.log.read_text()
    rc, listed = ctl(routed.url, routed.credentials, "workers")
    assert [w["url"] for w in listed["workers"]] == [routed.workers[1]]
    rc, waiting = ctl(routed.url, routed.credentials, "ready", "--workers", *routed.workers)
    assert rc == 1 and waiting["detail"] == f"not registered: {first}", waiting
    assert ctl(routed.url, routed.credentials, "drain", "--worker", first)[1]["changed"] is False  # already out
    rc, added = ctl(routed.url, routed.credentials, "add", "--worker", first)
    assert rc == 0 and added["changed"] is True and added["detail"] == f"{first} is ready behind {routed.url}"
    assert ctl(routed.url, routed.credentials, "add", "--worker", first)[1]["changed"] is False
    assert ctl(routed.url, routed.credentials, "ready", "--workers", *routed.workers)[0] == 0


@pytest.mark.smg_parser
def test_the_rollouts_module_drains_adds_and_removes_a_worker_of_the_real_gateway(routed: Routed) -> None:
    """dflash_gateway_worker (run for real with `ansible -m`, as the rollout runs it on the gateway's host): the same
    code as smg-ctl (module_utils/dflash_gateway/ctl.py, which the role installs as smg-ctl). Check mode only looks;
    each state is reached once (changed), then changes nothing; a failure names the worker and says why."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import run_module

    assert (GATEWAY_FILES / "smg-ctl").resolve() == REPO / "module_utils" / "dflash_gateway" / "ctl.py"
    first = routed.workers[0]
    gateway = {"url": routed.url, "credentials": str(routed.credentials)}

    def worker(state: str, check: bool = False, **extra: Any) -> dict[str, Any]:
        return run_module("dflash_gateway_worker", {"gateway": gateway, "worker": first, "state": state, **extra},
                          check=check)

    looked = worker("drained", check=True)
    assert (looked["changed"], looked["state"]) == (True, "done"), looked
    assert looked["detail"] == f"{first} is a worker of {routed.url}; it would be drained", looked
    # smg lists its workers in no set order (after the drain and add above, either may come first).
    assert sorted(w["url"] for w in ctl(routed.url, routed.credentials, "workers")[1]["workers"]) == \
        sorted(routed.workers)
    drained = worker("drained")
    assert drained["changed"] is True and not drained.get("failed"), drained
    assert drained["detail"] == f"{first} drained and removed; the engine has no request running or waiting", drained
    assert [w["url"] for w in ctl(routed.url, routed.credentials, "workers")[1]["workers"]] == [routed.workers[1]]
    assert worker("drained")["changed"] is False and worker("absent")["changed"] is False
    assert worker("present", check=True)["changed"] is True
    added = worker("present")
    assert added["changed"] is True and added["detail"] == f"{first} is ready behind {routed.url}", added
    assert worker("present")["changed"] is False
    assert ctl(routed.url, routed.credentials, "ready", "--workers", *routed.workers)[0] == 0
    # A gateway that does not answer: the task fails naming the worker and what it found, never a traceback.
    down = run_module("dflash_gateway_worker", {"gateway": {**gateway, "url": f"http://127.0.0.1:{free_port()}"},
                                                "worker": first, "state": "present", "wait": 1, "timeout": 1})
    assert down["failed"] is True and down["state"] == "failed", down
    assert down["msg"].startswith(f"{first} (present): ") and "Connection refused" in down["msg"], down
    assert "Traceback" not in json.dumps(down)


@pytest.mark.smg_parser
def test_the_host_read_sees_what_the_gateway_routes_to_and_a_worker_beyond_the_plan_is_removed(routed: Routed) -> None:
    """host_state's read of the gateway (its GET /workers with the control-plane key read on the host), which the
    rollout reconciles with the plan every run, before and after a worker leaves; smg-ctl's remove for a worker the
    plan no longer has (no wait on an engine that is not the deploy's); a wrong key is an answer, not a crash."""
    sys.path.insert(0, str(REPO / "module_utils"))
    from dflash_state import health

    key_file = str(routed.credentials / "control-plane-key")
    read = health.gateway_workers(routed.url, key_file)
    assert (read["asked"], read["status"], read["error"]) == (True, 200, ""), read
    assert sorted(w["url"] for w in read["workers"]) == sorted(routed.workers)
    assert all(w["status"] == "ready" and w["healthy"] is True and w["id"] for w in read["workers"]), read
    second = routed.workers[1]
    rc, removed = ctl(routed.url, routed.credentials, "remove", "--worker", second)
    assert rc == 0 and removed == {"state": "done", "changed": True,
                                   "detail": f"{second} removed from {routed.url}"}, removed
    assert [w["url"] for w in health.gateway_workers(routed.url, key_file)["workers"]] == [routed.workers[0]]
    assert ctl(routed.url, routed.credentials, "remove", "--worker", second)[1]["changed"] is False
    assert ctl(routed.url, routed.credentials, "add", "--worker", second)[0] == 0
    refused = health.gateway_workers(routed.url, "/nonexistent/key")
    assert (refused["status"], refused["workers"]) == (401, []), refused
    down = health.gateway_workers("http://127.0.0.1:9", key_file, timeout=2)
    assert down["status"] is None and down["error"] and down["workers"] == [], down


@pytest.mark.smg_parser
def test_adding_a_worker_the_gateway_is_still_creating_waits_for_it_and_changes_nothing(
        venv_python: Path, smg_python: Path, planner_argv: list[str], gpu_profile: Path, tmp_path: Path) -> None:
    # A rebooted host: the gateway starts before its replica, and keeps creating the worker of its command line
    # until it answers (POST /workers of that URL: 409 WORKER_CREATE_IN_PROGRESS). The deploy's add waits for it.
    # The replica holds the endpoint's key: taken out and added back, it is reached only when the add carries its
    # key (from its environment file), as smg warns ("Adding worker ... without API key while router has API key").
    section, credentials, log, popen = start_gateway(smg_python, tmp_path, 1)
    url, worker = f"http://127.0.0.1:{section['port']}", section["workers"][0]
    engine = None
    try:
        while ctl(url, credentials, "workers")[0] != 0:  # until the gateway answers its control plane
            assert popen.poll() is None, log.read_text()[-3000:]
        status, body = call(url + "/workers", CONTROL_KEY, {"url": worker})
        assert status == 409 and body["code"] == "WORKER_CREATE_IN_PROGRESS", (status, body)
        adding = subprocess.Popen([sys.executable, str(GATEWAY_FILES / "smg-ctl"), "--url", url, "--credentials",
                                   str(credentials), "add", "--worker", worker, "--wait", "120"],
                                  stdout=subprocess.PIPE, text=True)
        engine = start(venv_python, [*planner_argv, "--api-key", DATA_KEY], tmp_path, gpu_profile,
                       port=section["settings"]["worker_base_port"])
        out = json.loads(adding.communicate(timeout=180)[0])
        assert adding.returncode == 0 and out == {"state": "done", "changed": False,
                                                  "detail": f"{worker} is ready behind {url}"}, out
        env_file = tmp_path / "engine.env"
        env_file.write_text(f"# the engine's secrets\nSGLANG_API_KEY={DATA_KEY}\n")
        rc, keyless = ctl(url, credentials, "drain", "--worker", worker)  # out, but its queue cannot be read
        assert rc == 1 and keyless["changed"] is True and "wants its API key (--env-file" in keyless["detail"]
        rc, keyless = ctl(url, credentials, "add", "--worker", worker, "--wait", "5")
        assert rc == 1 and keyless["detail"] == f"add: still waiting at the deadline: {worker} is not listed yet"
        assert ctl(url, credentials, "drain", "--worker", worker, "--env-file", str(env_file))[0] == 0  # if listed
        rc, keyed = ctl(url, credentials, "add", "--worker", worker, "--env-file", str(env_file))
        assert rc == 0 and keyed == {"state": "done", "changed": True, "detail": f"{worker} is ready behind {url}"}
        # A worker on another host: drained and added back with the endpoint's key from the gateway's credentials.
        key_file = tmp_path / "api-key"
        key_file.write_text(f"{DATA_KEY}\n")
        assert ctl(url, credentials, "--key-file", str(key_file), "drain", "--worker", worker)[0] == 0
        rc, by_key_file = ctl(url, credentials, "--key-file", str(key_file), "add", "--worker", worker)
        assert rc == 0 and by_key_file["changed"] is True, by_key_file
        stale = tmp_path / "changed.env"  # the file changed since the engine started: its key is not the engine's
        stale.write_text("SGLANG_API_KEY=another-key\n")
        rc, refused = ctl(url, credentials, "drain", "--worker", worker, "--env-file", str(stale))
        assert rc == 1 and "refused the key of its environment file: the running engine holds another" in \
            refused["detail"], refused
    finally:
        popen.terminate()
        popen.wait(timeout=30)
        if engine:
            stop(engine)


@pytest.mark.smg_parser
def test_the_keys_are_neither_on_the_command_line_nor_in_the_log(routed: Routed) -> None:
    cmdline = Path(f"/proc/{routed.gateway.pid}/cmdline").read_bytes().decode(errors="replace")
    assert "smg::router" in cmdline  # smg renames its process; the argv before that held no key either
    for text in (cmdline, routed.log.read_text(errors="replace")):
        assert DATA_KEY not in text and CONTROL_KEY not in text


@pytest.mark.smg_parser
def test_the_launcher_refuses_a_key_on_the_command_line_and_a_missing_control_plane_key(
        smg_python: Path, tmp_path: Path) -> None:
    launch = [str(smg_python), str(GATEWAY_FILES / "smg-launch"), "--host", "127.0.0.1", "--port", "1"]
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(tmp_path)}
    given = subprocess.run([*launch, "--api-key", "x"], capture_output=True, text=True, env=env, check=False)
    assert given.returncode == 1 and "--api-key on the command line is refused (visible in ps)" in given.stderr
    missing = subprocess.run(launch, capture_output=True, text=True, env=env, check=False)
    assert missing.returncode == 1 and "no control-plane-key credential" in missing.stderr, missing.stderr
    settle = subprocess.run(launch, capture_output=True, text=True, env={**env, "SMG_DRAIN_SETTLE_SECS": "1.5"},
                            check=False)
    assert settle.returncode == 1 and "SMG_DRAIN_SETTLE_SECS='1.5': expected a whole number" in settle.stderr


# ---------------------------------------------------------------------------------------------
# The DDTree variant (sglang 0.5.23+ddtree.lab): the table of 0.5.23 with SGLang PR #29907, and a speed model of
# its own, so that DDTree is chosen by the canary's measurement on a build that has it, never assumed.
# ---------------------------------------------------------------------------------------------

DDTREE_VERSION = "0.5.23+ddtree.lab"


@pytest.fixture(scope="module")
def ddtree_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the DDTree variant, built into its own folder (not the lab's wheelhouse, which the lab
    copies into its containers)."""
    wheels = tmp_path_factory.mktemp("ddtree-wheels")
    env = dict(os.environ, PYTHON=sys.executable, LAB_WHEELHOUSE=str(wheels))
    proc = subprocess.run([str(BUILD), DDTREE_VERSION], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, f"build_wheel.sh failed:\n{proc.stdout}{proc.stderr}"
    assert Path(proc.stdout.strip().splitlines()[-1]) == wheels / f"sglang-{DDTREE_VERSION}-py3-none-any.whl"
    venv = tmp_path_factory.mktemp("ddtree-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--find-links", str(wheels),
                          f"sglang=={DDTREE_VERSION}"], capture_output=True, text=True, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv / "bin" / "python"


def planned_argv(model_dirs: dict[str, Path], **speculative: Any) -> list[str]:
    """The planner's argv for examples/pro6000.yml on the DDTree build, with `speculative` over its settings."""
    request = yaml.safe_load((REPO / "examples" / "pro6000.yml").read_text())
    request["sglang_version"] = "0.5.23+ddtree"
    request["speculative"] = {**request["speculative"], **speculative}
    result = plan_dict(request, base=REPO / "examples")
    assert not result["errors"], result["errors"]
    argv = list(result["args"])
    for flag, value in (("--model-path", str(model_dirs["target"])),
                        ("--speculative-draft-model-path", str(model_dirs["draft"])), ("--host", "127.0.0.1")):
        argv[argv.index(flag) + 1] = value
    return argv


def test_the_ddtree_variant_parses_with_the_prs_table_and_the_release_stand_in_refuses_its_flag(
        ddtree_python: Path, venv_python: Path, model_dirs: dict[str, Path]) -> None:
    argv = planned_argv(model_dirs, algorithm="ddtree", tree_budget=16)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE" and "--disable-overlap-schedule" in argv
    help_text = run_standin(ddtree_python, ["--help"]).stdout
    assert "--speculative-ddtree-budget" in help_text
    refused = run_standin(venv_python, argv)  # the 0.5.23 stand-in, as upstream 0.5.23 would
    assert refused.returncode == 2 and "unrecognized arguments: --speculative-ddtree-budget 16" in refused.stderr


def test_a_ddtree_candidate_is_measured_against_the_chain_and_kept_out_when_slower(
        ddtree_python: Path, model_dirs: dict[str, Path], gpu_profile: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from helpers import run_module
    finally:
        sys.path.pop(0)
    from dflash_infra import canary, loadgate

    # At block 8 (the deployment caps drafts at 16: a tree of 16 nodes is twice the chain's 7 drafts + 1).
    block = {"block_size": 8, "draft_window": 8}
    sides = {"chain": planned_argv(model_dirs, **block),
             "plain-chain tree": planned_argv(model_dirs, **block, algorithm="ddtree", tree_budget=7),
             "tree of 16": planned_argv(model_dirs, **block, algorithm="ddtree", tree_budget=16)}
    engines = {name: start(ddtree_python, argv, tmp_path, gpu_profile, {"SGLANG_STANDIN_STEP_MS": "4"})
               for name, argv in sides.items()}
    prompts = [{"name": "code", "messages": [{"role": "user", "content": "Write a Python function."}]},
               {"name": "math", "messages": [{"role": "user", "content": "What is 180 km in 2.5 hours in km/h?"}]}]
    try:
        for engine in engines.values():
            wait_ready(engine)
        assert "DDTREE (SGLang PR #29907) modelled: tree budget 16, verify width 17" in engines["tree of 16"].text()
        rounds: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in engines}
        for _ in range(2):  # alternating rounds, as the canary measures
            for name, engine in engines.items():
                result = run_module("dflash_load", {"url": engine.url(""), "model": "Qwen3.6-27B", "prompts": prompts,
                                                    "requests": 16, "max_tokens": 64, "concurrency": [8]})
                assert not result.get("failed"), result
                rounds[name].append(loadgate.run_figures(result["runs"]))
    finally:
        for engine in engines.values():
            stop(engine)
    figures = {name: canary.rounds_figures(r) for name, r in rounds.items()}
    chain, plain, tree = (figures[n][0] for n in ("chain", "plain-chain tree", "tree of 16"))
    # Budget 7 at block 8 is PR #29907's default: the plain chain, accepting exactly what the chain accepts.
    assert plain["accept_length_mean"] == chain["accept_length_mean"] and plain["failed"] == chain["failed"] == 0
    # The wider tree accepts more per step, and each step verifies 17 tokens per request: measured, it is slower.
    assert tree["accept_length_mean"] > chain["accept_length_mean"]
    verdict = canary.judge(figures["chain"], figures["tree of 16"], margin=0.05, min_accept_length=1.5,
                           speculative=True)
    print(f"\nddtree 16 vs chain: {tree['output_tokens_per_s']} vs {chain['output_tokens_per_s']} tok/s, acceptance "
          f"{tree['accept_length_mean']} vs {chain['accept_length_mean']}")
    assert not verdict["promote"] and "tok/s is not the +5.0% the candidate must win by" in verdict["reasons"][0]
