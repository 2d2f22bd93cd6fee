"""Deploy-time checks of the engine (capabilities, driver), the unit's quoting, the launcher that keeps the
API key out of argv/environ/log, the readiness probe's decisions and the deployment record."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from dflash_infra import engine, serving

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "roles" / "sglang_service" / "files"
SECRET = "k3y-for-tests-9d1f"


def load_script(name: str) -> ModuleType:
    """A helper script of the role (no .py suffix) as a module."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(FILES / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def standin_help(version: str = "0.5.23") -> str:
    """--help of the lab's engine stand-in, whose parser is rebuilt from the real wheel's flag table."""
    sys.path.insert(0, str(ROOT / "lab" / "engine"))
    try:
        from sglang.standin import flags  # type: ignore[import-not-found]
        table = json.loads((ROOT / "dflash_infra" / "data" / "sglang" / f"{version}.json").read_text())
        return flags.build_parser(table).format_help()
    finally:
        sys.path.remove(str(ROOT / "lab" / "engine"))


# --- capability probe ------------------------------------------------------------------------------

def test_help_of_the_standin_lists_exactly_the_visible_flags_of_the_table() -> None:
    flags = serving.flags_from_help(standin_help())
    visible = {f for f in engine.flag_table("0.5.23").visible if f.startswith("--")}
    assert set(flags) == visible
    assert "--cuda-graph-max-bs" not in flags and "--speculative-dflash-draft-window-size" not in flags


@pytest.mark.sglang_parser
def test_help_of_the_real_0_5_23_parser_matches_the_table() -> None:
    from sglang_real import launcher
    code = ("import argparse\nfrom sglang.srt.server_args import ServerArgs\n"
            "p = argparse.ArgumentParser(prog='sglang serve')\nServerArgs.add_cli_args(p)\np.print_help()\n")
    text = subprocess.run([str(launcher("0.5.23")), "-c", code], capture_output=True, text=True, check=True).stdout
    assert set(serving.flags_from_help(text)) == {f for f in engine.flag_table("0.5.23").visible if f.startswith("--")}


def test_flags_mentioned_in_descriptions_do_not_count() -> None:
    text = textwrap.dedent("""\
        usage: sglang serve [-h] [--tp-size TP_SIZE]

        options:
          -h, --help            show this help message and exit
          --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE
                                The tensor parallelism size. Replaces --old-tp-flag.
          --enable-x            Needs --cuda-graph-max-bs-decode.
        """)
    assert serving.flags_from_help(text) == ["--help", "--tp-size", "--tensor-parallel-size", "--enable-x"]


def test_help_without_options_is_an_error() -> None:
    with pytest.raises(serving.ServingError, match="expected argparse help"):
        serving.flags_from_help("Traceback (most recent call last):\nImportError: torch\n")


def test_missing_flag_names_flag_and_installed_version() -> None:
    accepted = serving.flags_from_help(standin_help())
    argv = ["--model-path", "/m", "--cuda-graph-max-bs", "32", "--speculative-ddtree-budget=8", "--tp-size", "2"]
    problems = serving.capability_problems(argv, accepted, "sglang", "0.5.23+lab")
    assert len(problems) == 2
    assert "--cuda-graph-max-bs, which the installed sglang 0.5.23+lab does not accept" in problems[0]
    assert "--speculative-ddtree-budget" in problems[1]
    assert serving.capability_problems(["--tp-size", "2"], accepted, "sglang", "0.5.23") == []


# --- driver ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("module", "cuda", "ok"), [
    ("595.71.05", "13.0", True), ("580.126.09", "13.0", True), ("575.57.08", "13.0", False),
    ("575.57.08", "12.8", True), ("520.61.05", "12.1", False), ("580.142", "13", True),
])
def test_driver_against_cuda_build(module: str, cuda: str, ok: bool) -> None:
    problems = serving.driver_problems(module, cuda)
    assert (problems == []) is ok
    if not ok:
        assert module in problems[0] and "needs an NVIDIA kernel module >=" in problems[0]


def test_driver_missing_or_unknown_cuda() -> None:
    assert "no NVIDIA kernel module" in serving.driver_problems("", "13.0")[0]
    assert "no known minimum driver" in serving.driver_problems("580.1", "14.0")[0]
    with pytest.raises(serving.ServingError, match="expected a version"):
        serving.driver_problems("abc", "13.0")


# --- unit rendering ----------------------------------------------------------------------------------

def unquote_systemd(line: str) -> list[str]:
    """Split an ExecStart line as systemd does for the forms systemd_quote emits."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line, posix=True)]


def test_exec_start_one_flag_per_line_and_round_trip() -> None:
    argv = ["--model-path", "/root/models/Qwen 3", "--tp-size", "2", "--enable-x", "--json-model-override-args",
            '{"rope": "$x%y\\\\z"}', "--lora-paths", "a", "b"]
    lines = serving.exec_start_lines("/opt/sglang/venv/bin/python", "/usr/local/lib/dflash-infra/sglang-launch",
                                     "sglang.launch_server", argv)
    assert lines[0] == "/opt/sglang/venv/bin/python /usr/local/lib/dflash-infra/sglang-launch sglang.launch_server"
    assert [ln.split()[0] for ln in lines[1:]] == [a for a in argv if a.startswith("--")]
    words = [w for ln in lines for w in unquote_systemd(ln)]
    assert words[3:] == argv


def test_environment_words_are_quoted_and_sorted() -> None:
    # systemd.exec(5): Environment= expands specifiers (%) but not variables ($): only `%` is doubled, so the
    # process gets the value asked for (a$b stays a$b; the lab reads it back from a running unit).
    assert serving.systemd_environment({"NCCL_DEBUG": "WARN", "A": 'x "y" $z 50%'}) == [
        '"A=x \\"y\\" $z 50%%"', '"NCCL_DEBUG=WARN"']
    with pytest.raises(serving.ServingError, match="variable name"):
        serving.systemd_environment({"BAD-NAME": "1"})
    with pytest.raises(serving.ServingError, match="control character"):
        serving.systemd_environment({"A": "one\ntwo"})


def test_unit_text_doubles_percent_and_refuses_lines() -> None:
    assert serving.systemd_text("sglang 0.5.23 serving Qwen 100%") == "sglang 0.5.23 serving Qwen 100%%"
    with pytest.raises(serving.ServingError, match="one line"):
        serving.systemd_text("Qwen\n[Service]")


@pytest.mark.parametrize(("env", "problem"), [
    ({"SGLANG_API_KEY": "k"}, "extra.SGLANG_API_KEY: the deploy owns this variable"),
    ({"SGLANG_ADMIN_API_KEY": "k"}, "extra.SGLANG_ADMIN_API_KEY: the deploy owns this variable"),
    ({"LD_PRELOAD": "/tmp/x.so"}, "extra.LD_PRELOAD: the deploy owns this variable"),
    ({"PYTHONPATH": "/tmp"}, "extra.PYTHONPATH: the deploy owns this variable"),
    ({"CUDA_VISIBLE_DEVICES": "0"}, "extra.CUDA_VISIBLE_DEVICES: the deploy owns this variable"),
    ({"A-B": "1"}, "extra: expected a variable name such as NCCL_DEBUG, found 'A-B'"),
    ({"A": "x\ny"}, "extra.A: expected one line of text"),
    ({"A": ["x"]}, "extra.A: expected one line of text"),
    (["A=1"], "extra: expected a mapping of variable -> value, found list"),
])
def test_every_environment_input_is_checked_against_one_reserved_list(env: object, problem: str) -> None:
    [found] = serving.environment_problems(env, "extra")
    assert found.startswith(problem)
    assert serving.environment_problems({"SGLANG_ENABLE_SPEC_V2": "1", "NCCL_DEBUG": "INFO", "N": 3}, "extra") == []


@pytest.mark.parametrize(("listen", "host"), [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "127.0.0.1"),
                                              ("127.0.200.1", "127.0.200.1"), ("::1", "[::1]")])
def test_probe_host(listen: str, host: str) -> None:
    assert serving.probe_host(listen) == host


# --- the launcher ------------------------------------------------------------------------------------

ENGINE_PROBE = textwrap.dedent("""\
    import os, sys, time
    me = open("/proc/self/cmdline", "rb").read()
    parent = open(f"/proc/{os.getppid()}/environ", "rb").read()
    print("key-in-argv", sys.argv[-2:] == ["--api-key", os.environ.get("EXPECT", "")] , flush=True)
    print("key-in-cmdline", b"KEY" in me.replace(os.environ["EXPECT"].encode(), b"KEY"), flush=True)
    print("key-in-own-env", "SGLANG_API_KEY" in os.environ, flush=True)
    print("key-in-launcher-environ", os.environ["EXPECT"].encode() in parent, flush=True)
    print(f"server_args={{'api_key': {sys.argv[-1]!r}}}", flush=True)
    sys.exit(7)
    """)


def test_launcher_hands_the_key_over_in_memory_and_redacts_it(tmp_path: Path) -> None:
    (tmp_path / "fake_engine.py").write_text(ENGINE_PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SGLANG_API_KEY": SECRET, "EXPECT": SECRET}
    proc = subprocess.run([sys.executable, str(FILES / "sglang-launch"), "fake_engine", "--port", "1"],
                          env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 7, proc.stderr
    out = proc.stdout
    assert SECRET not in out
    assert "key-in-argv True" in out
    assert "key-in-cmdline False" in out
    assert "key-in-own-env False" in out
    assert "key-in-launcher-environ False" in out
    assert "server_args={'api_key': '***'}" in out


def test_launcher_without_secrets_execs_the_engine_directly(tmp_path: Path) -> None:
    (tmp_path / "fake_engine.py").write_text("import os, sys\nprint(os.getpid(), sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_API_KEY"}
    env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, str(FILES / "sglang-launch"), "fake_engine", "--tp-size", "2"],
                            env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    pid, args = out.split(" ", 1)
    assert int(pid) == proc.pid  # same process: exec, no wrapper
    assert args.strip() == "['--tp-size', '2']"


def test_launcher_passes_sigterm_on(tmp_path: Path) -> None:
    (tmp_path / "fake_engine.py").write_text(textwrap.dedent("""\
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(0)))
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
        """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SGLANG_API_KEY": SECRET}
    proc = subprocess.Popen([sys.executable, str(FILES / "sglang-launch"), "fake_engine"], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.terminate()
    rest = proc.stdout.read()
    assert proc.wait() == 0 and "got SIGTERM" in rest


def test_launcher_usage_error() -> None:
    proc = subprocess.run([sys.executable, str(FILES / "sglang-launch"), "--model-path", "x"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "expected MODULE" in proc.stderr


# --- the readiness probe -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ready() -> ModuleType:
    return load_script("sglang-ready")


def test_process_gate(ready: ModuleType) -> None:
    up = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "812"}
    assert ready.process_gate(up, 0)[0] == "ready"
    assert ready.process_gate({**up, "ActiveState": "activating", "SubState": "start"}, 0)[0] == "waiting"
    crashed = ready.process_gate({**up, "SubState": "auto-restart", "ActiveState": "activating",
                                  "ExecMainStatus": "1"}, 0)
    assert crashed[0] == "failed" and "status 1" in crashed[1]
    assert ready.process_gate({**up, "NRestarts": "2"}, 1)[0] == "failed"
    assert ready.process_gate({**up, "ActiveState": "failed", "SubState": "failed"}, 0)[0] == "failed"


def test_models_and_generation_gates(ready: ModuleType) -> None:
    models = {"object": "list", "data": [{"id": "Qwen3.6-27B", "object": "model"}]}
    assert ready.models_gate(200, models, "Qwen3.6-27B")[0] == "ready"
    assert ready.models_gate(200, models, "other")[0] == "failed"
    assert ready.models_gate(503, None, "Qwen3.6-27B")[0] == "waiting"
    spec = {"text": " Paris", "meta_info": {"completion_tokens": 16, "spec_verify_ct": 3, "spec_accept_length": 5.3}}
    assert ready.generate_gate(200, spec, True)[0] == "ready"
    plain = {"text": " Paris", "meta_info": {"completion_tokens": 16}}
    assert ready.generate_gate(200, plain, False)[0] == "ready"
    state, detail, _ = ready.generate_gate(200, plain, True)
    assert state == "failed" and "speculative decoding is not running" in detail
    assert ready.generate_gate(500, "Internal Server Error", False)[0] == "failed"


def test_probe_reads_the_key_from_the_environment_file(ready: ModuleType, tmp_path: Path) -> None:
    env_file = tmp_path / "sglang-qwen.env"
    env_file.write_text(f"# managed\nSGLANG_API_KEY={SECRET}\n")
    assert ready.api_key(str(env_file)) == SECRET
    assert ready.api_key(str(tmp_path / "absent.env")) is None


# --- the record ---------------------------------------------------------------------------------------

def test_record_keeps_one_previous_and_the_contract_keys() -> None:
    plan = {"args": ["--tp-size", "2"], "gpu_ids": [0, 1], "kv_cache_tokens": 1000, "per_gpu": {"weights_gib": 27.0}}
    older = {"engine": {"version": "0.5.19"}, "previous": {"engine": {"version": "0.5.15"}}}
    rec = serving.record(plan=plan, engine_info={"name": "sglang", "version": "0.5.23", "venv": "/opt/sglang/venv"},
                         models={"target": {"path": "/root/models/T", "manifest_sha256": "ab" * 32},
                                 "draft": {"path": "/root/models/D"}},
                         driver={"kernel_module": "595.71.05", "user_space": "595.71.05"},
                         unit={"name": "sglang-qwen.service", "sha256": "cd" * 32, "backup": "/var/lib/x"},
                         deployed_at="2026-11-29T11:17:01+00:00",
                         journal="[2026-11-29 11:16:59 TP0] Load weight end. type=T, avail mem=1.00 GB, "
                                 "mem usage=27.00 GB.",
                         previous=older)
    for key in ("engine", "plan", "args", "models", "driver", "unit_sha256", "deployed_at", "previous"):
        assert key in rec
    assert rec["previous"] == {"engine": {"version": "0.5.19"}}
    assert rec["models"]["draft"] == {"path": "/root/models/D", "manifest_sha256": None}
    assert rec["engine_memory"]["comparison"][0]["figure"] == "weights_gib"
    assert serving.record(plan=plan, engine_info={}, models={}, driver={}, unit={}, deployed_at="t", journal="",
                          previous=None)["previous"] is None


def test_every_path_of_a_service_is_derived_from_its_name_once() -> None:
    paths = serving.service_paths("sglang-qwen.service", "/etc/dflash-infra", "/var/lib/dflash-infra",
                                  "/usr/local/lib/dflash-infra")
    assert paths["unit"] == "/etc/systemd/system/sglang-qwen.service"
    assert paths["env_file"] == "/etc/dflash-infra/sglang-qwen.env"
    assert paths["record"] == "/var/lib/dflash-infra/deployment.json"
    assert paths["last_good"] == "/var/lib/dflash-infra/units/last-good"
    assert paths["sglang_ready"] == "/usr/local/lib/dflash-infra/sglang-ready"
    with pytest.raises(serving.ServingError, match=r"ending in \.service, found 'sglang qwen'"):
        serving.service_paths("sglang qwen", "/e", "/s", "/l")


def test_the_endpoint_is_reached_on_loopback_for_a_wildcard_listen_address() -> None:
    assert serving.base_url({"host": "0.0.0.0", "port": 30000}) == "http://127.0.0.1:30000"
    assert serving.base_url({"host": "127.0.200.1", "port": "30000"}) == "http://127.0.200.1:30000"


def test_the_engine_is_installed_only_when_the_venv_lacks_the_pin() -> None:
    venv = "/opt/sglang/venv"
    caps = {"exists": True, "json": {"name": "sglang", "version": "0.5.23", "flags": ["--help"], "cuda": "13.0"}}
    state = {"venvs": {venv: {"python": True, "distributions": {"sglang": "0.5.23"}, "capabilities": caps}}}
    status = serving.engine_status(state, venv, "sglang", "0.5.23")
    assert status["needs_install"] is False and status["capabilities"]["flags"] == ["--help"]
    upgrade = serving.engine_status(state, venv, "sglang", "0.5.24")
    assert upgrade["needs_install"] is True and upgrade["reason"] == f"{venv} holds sglang 0.5.23, the pin is 0.5.24"
    # A cache of another release (or none) is asked again.
    state["venvs"][venv]["distributions"]["sglang"] = "0.5.19"
    assert serving.engine_status(state, venv, "sglang", "0.5.19")["capabilities"] is None
    absent = serving.engine_status({"venvs": {venv: {"python": False}}}, venv, "sglang", "0.5.23")
    assert absent["needs_install"] and absent["reason"] == f"{venv} has no Python"


def test_serving_needs_an_aligned_driver() -> None:
    assert serving.driver_ready_problems({"status": "aligned"}) == []
    assert serving.driver_ready_problems({"status": "not_package_managed"}) == []
    [problem] = serving.driver_ready_problems({"status": "mismatch",
                                               "reason": "kernel module 580.126.09, user space 580.159.03"})
    assert "not ready to serve (mismatch: kernel module 580.126.09, user space 580.159.03)" in problem


def test_an_on_demand_rollback_makes_the_previous_deployment_current() -> None:
    previous = {"deployed_at": "t1", "unit_backup": "/u/1-deployed", "previous": None}
    current = {"deployed_at": "t2", "unit_backup": "/u/2-deployed", "previous": previous}
    back = serving.rolled_back_record(current, "t3")
    assert back == {"deployed_at": "t1", "unit_backup": "/u/1-deployed", "rolled_back_at": "t3",
                    "previous": {"deployed_at": "t2", "unit_backup": "/u/2-deployed"}}
    with pytest.raises(serving.ServingError, match=r"previous\.unit_backup"):
        serving.rolled_back_record({"previous": None}, "t3")


def test_the_launcher_hands_the_units_tls_credentials_to_the_engine_as_paths(tmp_path: Path) -> None:
    launch = load_script("sglang-launch")
    assert launch.tls_args({}) == []
    (tmp_path / "tls-cert").write_text("cert")
    with pytest.raises(SystemExit, match="needs the credentials tls-cert and tls-key; found only tls-cert"):
        launch.tls_args({"CREDENTIALS_DIRECTORY": str(tmp_path)})
    (tmp_path / "tls-key").write_text("key")
    assert launch.tls_args({"CREDENTIALS_DIRECTORY": str(tmp_path)}) == [
        "--ssl-certfile", str(tmp_path / "tls-cert"), "--ssl-keyfile", str(tmp_path / "tls-key")]
