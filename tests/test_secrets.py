"""Secrets never reach any output: key files and environment files are compared on the host, never hashed; keys have
a form and a minimum length, checked in one place; old unit snapshots (which hold rotated keys) are pruned.

The module runs for real on localhost (`ansible localhost -m`, -vvv: the most Ansible prints)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_infra import host_state, serving
from helpers import HOST_PYTHON, ansible_environment, run, run_module, tool

KEY = "lab-secret-key-not-a-secret-0123456789"  # 38 characters
SHORT = "k3y"


def test_a_secret_file_is_never_hashed_only_compared_on_the_host(tmp_path: Path) -> None:
    """A folder marked secret (the engine's environment files, the gateway's credentials): each file answers only
    whether it holds what the deploy would write; no sha256, no content, at any verbosity."""
    folder = tmp_path / "credentials"
    folder.mkdir(mode=0o700)
    (folder / "api-key").write_text(serving.key_file_text(SHORT))
    (folder / "control-plane-key").write_text(serving.key_file_text(KEY))
    (folder / "other").write_text("something\n")
    args = {"sections": ["files"], "files": [{"path": str(folder), "children": True, "secret": True}],
            "secrets": [{"path": str(folder / "api-key"), "content": serving.key_file_text(SHORT)},
                        {"path": str(folder / "control-plane-key"), "content": serving.key_file_text("rotated" * 6)}]}
    result = run_module("dflash_host_state", args)
    children = result["ansible_facts"]["host_state_current"]["files"][str(folder)]["children"]
    assert children["api-key"]["matches"] is True and children["control-plane-key"]["matches"] is False
    assert children["other"]["matches"] is None  # nothing expected of it: never compared, never hashed
    assert all("sha256" not in c and "content" not in c for c in children.values())
    # The printed result at -vvv (module arguments included) holds nothing a key could be recovered from.
    env = dict(ansible_environment())
    proc = run([tool("ansible"), "localhost", "-i", "localhost,", "-c", "local", "-vvv",
                "-e", f"ansible_python_interpreter={HOST_PYTHON}", "-m", "dflash_host_state", "-a", json.dumps(args)],
               env=env)
    assert proc.returncode == 0, proc.stdout[-2000:]
    import hashlib
    for secret in (SHORT, KEY, "rotated" * 6):
        for leak in (secret, hashlib.sha256(serving.key_file_text(secret).encode()).hexdigest()):
            assert leak not in proc.stdout + proc.stderr
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in proc.stdout


def test_secret_matches_reads_only_the_hosts_answer() -> None:
    state = {"files": {"/etc/d": {"exists": True, "kind": "dir", "children": {
        "k": {"exists": True, "kind": "file", "matches": True, "mode": "0600", "owner": "root", "group": "root"},
        "n": {"exists": True, "kind": "file", "matches": None, "mode": "0600", "owner": "root", "group": "root"}}}}}
    assert host_state.secret_matches(state, "/etc/d/k", "0600", "root", "root")
    assert not host_state.secret_matches(state, "/etc/d/k", "0640")
    assert not host_state.secret_matches(state, "/etc/d/n") and not host_state.secret_matches(state, "/etc/d/x")


@pytest.mark.parametrize(("key", "problem"), [
    (SHORT, "dflash_service_api_key: expected at least 32 characters, found 3"),
    ("a b" * 20, "dflash_service_api_key: expected letters, digits and ._~+/=- only"),
    ("x\n" + "y" * 40, "dflash_service_api_key: expected letters, digits and ._~+/=- only"),
])
def test_a_key_has_a_form_and_a_minimum_length_and_is_never_shown(key: str, problem: str) -> None:
    [found] = serving.key_problems(key, "dflash_service_api_key")
    assert found.startswith(problem) and key not in found
    assert serving.key_problems("", "dflash_service_api_key") == []  # no key: the endpoint has none
    assert serving.key_problems(KEY, "dflash_service_api_key") == []
    assert serving.keys_problems({"a": SHORT, "b": KEY}) == [serving.key_problems(SHORT, "a")[0]]


def test_the_secret_files_are_every_env_file_and_the_gateways_keys_with_what_the_roles_write() -> None:
    paths = serving.gateway_paths("smg-gateway.service", "/etc/dflash-infra", "/usr/local/lib/dflash-infra")
    files = serving.secret_files(["/etc/dflash-infra/a.env", "/etc/dflash-infra/b.env"], KEY, "", paths, "")
    assert [f["path"] for f in files] == ["/etc/dflash-infra/a.env", "/etc/dflash-infra/b.env", paths["api_key"]]
    assert files[0]["content"] == serving.engine_env_text(KEY) and f"SGLANG_API_KEY={KEY}\n" in files[0]["content"]
    assert files[2]["content"] == f"{KEY}\n"
    # Without a key the endpoint's key file is expected empty (the gateway's unit loads it either way).
    assert serving.secret_files([], "", "", paths, KEY) == [{"path": paths["api_key"], "content": ""},
                                                           {"path": paths["control_plane_key"], "content": f"{KEY}\n"}]
    assert "SGLANG_API_KEY" not in serving.engine_env_text("")


def test_good_deploys_prune_older_snapshots_of_units_and_environment_files(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    for name in ("20261201T000000Z-deployed", "20261201T010000Z-replaced", "20261202T000000Z-deployed",
                 "20261203T000000Z-replaced", "20261204T000000Z-deployed", "keep-me", "notes.txt"):
        (units / name).mkdir() if "." not in name else (units / name).write_text("x")
    (units / "last-good").symlink_to("20261204T000000Z-deployed")
    unit = tmp_path / "u.service"
    unit.write_text("[Service]\n")
    args = {"files": [str(unit)], "dest": str(units / "20261205T000000Z-deployed"), "link": str(units / "last-good"),
            "keep": 2}
    checked = run_module("dflash_unit_snapshot", args, check=True)
    assert checked["pruned"] == ["20261201T000000Z-deployed", "20261201T010000Z-replaced",
                                 "20261202T000000Z-deployed", "20261203T000000Z-replaced"]
    assert (units / "20261201T000000Z-deployed").is_dir()  # --check removes nothing
    done = run_module("dflash_unit_snapshot", args)
    assert done["changed"] and done["pruned"] == checked["pruned"]
    # The new good one and the one before stay (an on-demand rollback restores it); nothing else is touched.
    assert sorted(os.listdir(units)) == ["20261204T000000Z-deployed", "20261205T000000Z-deployed", "keep-me",
                                         "last-good", "notes.txt"]
    again = run_module("dflash_unit_snapshot", args)
    assert again["pruned"] == [] and not again["linked"]


def test_pruning_keeps_the_snapshots_the_record_names_after_an_on_demand_rollback(tmp_path: Path) -> None:
    """After a rollback the record's current deployment is the OLDER snapshot and its previous the newer one: a new
    good deploy keeps both the record names (the one it restores next), whatever their age, and prunes the rest."""
    units = tmp_path / "units"
    units.mkdir()
    for name in ("20261201T000000Z-deployed", "20261202T000000Z-deployed", "20261203T000000Z-deployed"):
        (units / name).mkdir()
    (units / "last-good").symlink_to("20261201T000000Z-deployed")  # rolled back to the first
    unit = tmp_path / "u.service"
    unit.write_text("[Service]\n")
    dest = units / "20261204T000000Z-deployed"
    record = {"unit_backup": str(dest), "previous": {"unit_backup": str(units / "20261201T000000Z-deployed")}}
    args = {"files": [str(unit)], "dest": str(dest), "link": str(units / "last-good"), "keep": 2,
            "record": {"path": str(tmp_path / "deployment.json"), "content": json.dumps(record) + "\n"}}
    done = run_module("dflash_unit_snapshot", args)
    assert done["pruned"] == ["20261202T000000Z-deployed", "20261203T000000Z-deployed"]
    assert sorted(p.name for p in units.iterdir() if p.name.endswith("-deployed")) == [
        "20261201T000000Z-deployed", "20261204T000000Z-deployed"]
