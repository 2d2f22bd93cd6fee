"""The venvs' hash-locked requirement files (locks/, dflash_infra/locks.py, tools/make_locks.py): every lock parses and
pins exactly the version group_vars names, for the platform the inventory says; and how a venv, as host_state reads
it, compares to its lock (what to install, remove, refuse)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_infra import locks
from helpers import ROOT

LOCKS = sorted((ROOT / "locks").glob("*.txt"))


def make_locks() -> Any:
    spec = importlib.util.spec_from_file_location("make_locks", ROOT / "tools" / "make_locks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_locks"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool() -> Any:
    return make_locks()


@pytest.fixture(scope="module")
def requests(tool: Any) -> dict[str, list[dict[str, Any]]]:
    """What each inventory's containers need locked, as Ansible renders group_vars (the deploy's own values)."""
    return {inventory: tool.requests(inventory) for inventory in tool.INVENTORIES}


def test_every_lock_in_the_repository_parses_and_pins_its_header(tool: Any) -> None:
    assert len(LOCKS) == 4, LOCKS
    for path in LOCKS:
        lock = locks.parse(path.read_text(), path.name)
        assert path.name == locks.file_name(lock.requirement, lock.python, lock.platform)
        assert lock.packages[lock.name] == lock.version and all(lock.hashes.values())


def test_each_inventory_locks_exactly_the_pins_group_vars_names(tool: Any, requests: dict[str, list]) -> None:
    production = {Path(r["lock"]).name: r for r in requests["production"]}
    lab = {Path(r["lock"]).name: r for r in requests["lab"]}
    assert set(production) == {"sglang-0.5.23-py3.12-x86_64-manylinux_2_34.txt",
                               "smg-1.13.0-py3.12-x86_64-manylinux_2_34.txt"}
    assert set(lab) == {"sglang-0.5.23+lab-py3.11-x86_64-manylinux_2_34.txt",
                        "smg-1.13.0-py3.11-x86_64-manylinux_2_34.txt"}
    for request in [*production.values(), *lab.values()]:  # the lab's stand-in wheel: make lab-wheels checks it
        assert tool.problems(request, wheels=False) == [], request
    assert {Path(r["lock"]) for r in [*production.values(), *lab.values()]} == set(LOCKS)
    # The production engine's lock holds what SGLang 0.5.23 pins and what it leaves open, each exactly.
    engine = locks.parse(Path(production["sglang-0.5.23-py3.12-x86_64-manylinux_2_34.txt"]["lock"]).read_text())
    assert len(engine.packages) > 150 and {"torch", "sglang-kernel", "flashinfer-python", "transformers",
                                           "triton"} <= set(engine.packages)


def test_a_pin_that_disagrees_with_its_version_or_its_lock_fails_the_check(tool: Any, requests: dict) -> None:
    engine = next(r for r in requests["production"] if r["requirement"].startswith("sglang=="))
    problems = tool.problems({**engine, "version": "0.5.24"}, wheels=False)
    assert problems and "is not the version the settings name (0.5.24)" in problems[0]
    other = {**engine, "requirement": "sglang==0.5.24", "version": "0.5.24"}
    assert "run make locks" in tool.problems(other, wheels=False)[0]  # the lock locks 0.5.23
    lab = next(r for r in requests["lab"] if r.get("lock_from"))
    assert Path(lab["lock_from"]).name == "wheelhouse"


def test_a_stand_in_wheel_rebuilt_from_changed_sources_no_longer_matches_its_lock(tool: Any, tmp_path: Path) -> None:
    lock_path = ROOT / "locks" / "sglang-0.5.23+lab-py3.11-x86_64-manylinux_2_34.txt"
    lock = locks.parse(lock_path.read_text())
    [none] = tool.wheel_problems(lock, tmp_path, lock_path)
    assert none.endswith("has no wheel of it: build it first (make lab-wheels)")
    (tmp_path / "sglang-0.5.23+lab-py3-none-any.whl").write_bytes(b"another build")
    [problem] = tool.wheel_problems(lock, tmp_path, lock_path)
    assert "rebuilt from changed sources): run make locks" in problem


def test_the_wheelhouse_asks_pip_for_every_platform_tag_the_glibc_floor_allows(tool: Any) -> None:
    tags = tool.compatible_platforms("x86_64-manylinux_2_34")
    assert tags[0] == "manylinux_2_34_x86_64" and tags[-1] == "manylinux1_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64"} <= set(tags)
    assert "manylinux_2_35_x86_64" not in tags


HEAD = "# dflash-infra lock: requirement=demo==1.0 python=3.12 platform=x86_64-manylinux_2_34\n"
H1, H2 = "a" * 64, "b" * 64
LOCK = HEAD + f"demo==1.0 \\\n    --hash=sha256:{H1}\n    # via -r -\nDep_Lib==2.0 \\\n    --hash=sha256:{H2}\n"


@pytest.mark.parametrize(("text", "message"), [
    (LOCK.replace(HEAD, ""), "expected a first line '# dflash-infra lock:"),
    (LOCK.replace(" python=3.12", ""), "its header lacks python"),
    (LOCK.replace(f" \\\n    --hash=sha256:{H2}", ""), "expected --hash=sha256:<64 hex> after Dep_Lib==2.0"),
    (LOCK.replace("Dep_Lib==2.0", "dep-lib>=2.0"), "expected name==version, found 'dep-lib>=2.0'"),
    (LOCK.replace("Dep_Lib==2.0 \\", "Dep_Lib==2.0 ; python_version < '3.13' \\"), "environment markers"),
    (LOCK + f"dep.lib==2.1 --hash=sha256:{H1}\n", "dep-lib is locked twice"),
    (LOCK.replace("demo==1.0 \\", "demo==1.1 \\"), "its header pins demo==1.0, its packages have demo==1.1"),
    (LOCK.replace("requirement=demo==1.0", "requirement=demo>=1.0"), "expected a pin of the form name==version"),
])
def test_a_lock_that_is_not_what_make_locks_writes_is_refused_naming_why(text: str, message: str) -> None:
    with pytest.raises(locks.LockError) as err:
        locks.parse(text, "demo.txt")
    assert message in str(err.value)


def state(distributions: dict[str, str] | None, copy_sha: str | None = None, python: str = "3.12.3",
          glibc: str = "2.39", machine: str = "x86_64") -> dict[str, Any]:
    venv: dict[str, Any] = {"python": distributions is not None, "distributions": distributions or {},
                            "lock": {"exists": copy_sha is not None, "sha256": copy_sha}}
    venv.update({"python_version": python} if distributions is not None
                else {"interpreter": "python3", "interpreter_version": python})
    return {"venvs": {"/opt/v": venv}, "system": {"platform": {"machine": machine, "glibc": glibc}}}


def test_a_venv_that_holds_its_lock_and_was_installed_from_it_is_in_sync() -> None:
    status = locks.venv_status(state({"demo": "1.0", "dep-lib": "2.0", "pip": "24.0"}, locks.sha256(LOCK)),
                               "/opt/v", LOCK, "demo", "ct200", "demo.txt")
    assert status["in_sync"] and status["lines"] == [] and status["problems"] == [] and not status["refused"]
    assert status["notable"] == {} and status["packages"] == 2


def test_what_differs_is_listed_old_to_new_and_decides_install_and_removal() -> None:
    status = locks.venv_status(state({"demo": "1.0", "dep-lib": "1.9", "requests": "2.32.0"}, locks.sha256(LOCK)),
                               "/opt/v", LOCK, "demo", "ct200")
    assert status["lines"] == ["dep-lib 1.9 -> 2.0", "- requests 2.32.0 (not in the lock)"]
    assert status["needs_install"] and status["needs_uninstall"] and not status["in_sync"] and not status["refused"]
    fresh = locks.venv_status(state(None), "/opt/v", LOCK, "demo", "ct200")
    assert fresh["needs_venv"] and fresh["needs_install"] and fresh["needs_lock_copy"]
    assert fresh["lines"] == ["+ demo 1.0 (missing)", "+ dep-lib 2.0 (missing)"]
    only_copy = locks.venv_status(state({"demo": "1.0", "dep-lib": "2.0"}), "/opt/v", LOCK, "demo", "ct200")
    assert only_copy["needs_lock_copy"] and not only_copy["needs_install"] and not only_copy["in_sync"]


def test_an_engine_changed_by_hand_is_refused_but_an_upgrade_of_the_pin_is_not() -> None:
    hand = locks.venv_status(state({"demo": "1.1.dev0", "dep-lib": "2.0"}, locks.sha256(LOCK)), "/opt/v", LOCK,
                             "demo", "ct200", "demo.txt")
    assert hand["refused"].startswith("ct200: /opt/v was installed from demo.txt (demo==1.0), and its demo is now "
                                      "1.1.dev0: the engine itself was changed by hand.")
    assert "-e sglang_engine_replace_changed=true" in hand["refused"]
    # The venv was installed from ANOTHER lock (the previous pin): moving to this one is the deploy's job.
    upgrade = locks.venv_status(state({"demo": "0.9", "dep-lib": "2.0"}, "c" * 64), "/opt/v", LOCK, "demo", "ct200")
    assert not upgrade["refused"] and upgrade["lines"] == ["demo 0.9 -> 1.0"] and upgrade["needs_install"]
    # A dependency changed by hand is repaired, never refused.
    dep = locks.venv_status(state({"demo": "1.0", "dep-lib": "3.0"}, locks.sha256(LOCK)), "/opt/v", LOCK, "demo")
    assert not dep["refused"] and dep["needs_install"]


@pytest.mark.parametrize(("host", "expected"), [
    ({"glibc": "2.31"}, "its wheels need glibc >= 2.34; this host has glibc 2.31. Move the container"),
    ({"glibc": None}, "this host's glibc version could not be read (None)"),
    ({"machine": "aarch64"}, "this host is aarch64"),
    ({"python": "3.11.2"}, "python3 is Python 3.11.2. Point the venv's interpreter at a Python 3.12"),
])
def test_a_host_that_cannot_run_the_locks_wheels_is_refused_saying_what_it_needs(host: dict, expected: str) -> None:
    status = locks.venv_status(state(None, **host), "/opt/v", LOCK, "demo", "ct200")
    [problem] = status["problems"]
    assert problem.startswith("ct200: demo==1.0 is locked for Python 3.12 on x86_64-manylinux_2_34")
    assert expected in problem


def test_an_existing_venv_of_another_python_is_named_as_the_venvs() -> None:
    status = locks.venv_status(state({"demo": "1.0"}, python="3.11.2"), "/opt/v", LOCK)
    assert "/opt/v/bin/python is Python 3.11.2" in status["problems"][0]


def test_after_an_install_any_difference_is_a_problem() -> None:
    assert locks.installed_problems({"demo": "1.0", "Dep_Lib": "2.0", "pip": "24"}, LOCK, "/opt/v") == []
    [problem] = locks.installed_problems({"demo": "1.0"}, LOCK, "/opt/v", "ct200")
    assert problem == "ct200: /opt/v differs from its lock after installing it: + dep-lib 2.0 (missing)."
