"""The smg_gateway role's decisions (dflash_infra.serving.gateway_*): its paths, its ExecStart, what differs from a
host as host_state reads it, and the gateway section given outside a plan (dflash_infra.planning.gateway)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dflash_infra import serving
from dflash_infra.planning import gateway

PATHS = serving.gateway_paths("smg-gateway.service", "/etc/dflash-infra", "/usr/local/lib/dflash-infra")
UNIT = "a" * 64
HELPERS = {"smg-launch": "b" * 64, "smg-ctl": "c" * 64}


def entry(sha: str = "", kind: str = "file", mode: str = "0600") -> dict[str, Any]:
    return {"exists": True, "kind": kind, "sha256": sha, "mode": mode, "owner": "root", "group": "root"}


def secret(matches: bool | None = True, size: int = 49) -> dict[str, Any]:
    """A key file as host_state reads it: no hash, only its size and whether it holds what the deploy would write."""
    return {"exists": True, "kind": "file", "size": size, "matches": matches, "mode": "0600", "owner": "root",
            "group": "root"}


def converged() -> dict[str, Any]:
    """host_state of a host where the gateway runs exactly as the role would leave it."""
    return {"files": {PATHS["unit"]: entry(UNIT, mode="0644"),
                      PATHS["credentials"]: {**entry(kind="dir", mode="0700"), "children": {
                          "api-key": secret(), "control-plane-key": secret()}},
                      PATHS["libexec_dir"]: {**entry(kind="dir", mode="0755"), "children": {
                          name: entry(sha, mode="0755") for name, sha in HELPERS.items()}}},
            "units": {"smg-gateway.service": {"UnitFileState": "enabled", "ActiveState": "active"}}}


def todo(state: dict[str, Any], api_key: str = "k", control: str = "") -> dict[str, Any]:
    return serving.gateway_todo(state, PATHS, "smg-gateway.service", UNIT, api_key, control, HELPERS)


def test_the_gateways_paths_are_derived_from_its_unit_name() -> None:
    assert PATHS == {"unit": "/etc/systemd/system/smg-gateway.service", "stem": "smg-gateway",
                     "credentials": "/etc/dflash-infra/smg-gateway",
                     "api_key": "/etc/dflash-infra/smg-gateway/api-key",
                     "control_plane_key": "/etc/dflash-infra/smg-gateway/control-plane-key",
                     "tls_cert": "/etc/dflash-infra/smg-gateway/tls-cert",
                     "tls_key": "/etc/dflash-infra/smg-gateway/tls-key",
                     "tls_ca": "/etc/dflash-infra/smg-gateway/tls-ca",
                     "libexec_dir": "/usr/local/lib/dflash-infra", "helpers": ["smg-launch", "smg-ctl"],
                     "launcher": "/usr/local/lib/dflash-infra/smg-launch", "ctl": "/usr/local/lib/dflash-infra/smg-ctl"}
    with pytest.raises(serving.ServingError, match=re.escape("ending in .service")):
        serving.gateway_paths("smg gateway", "/etc", "/usr")


@pytest.mark.parametrize(("role", "paths"), [
    ("smg_gateway", PATHS),
    ("sglang_service", serving.service_paths("sglang-qwen.service", "/etc/dflash-infra", "/var/lib/dflash-infra",
                                             "/usr/local/lib/dflash-infra"))])
def test_the_helpers_the_paths_name_are_exactly_the_roles_files(role: str, paths: dict[str, Any]) -> None:
    # The roles install and compare the helpers their paths name (one home for the list: dflash_infra.serving).
    files = Path(__file__).resolve().parents[1] / "roles" / role / "files"
    assert sorted(paths["helpers"]) == sorted(p.name for p in files.iterdir())
    assert all(paths[name.replace("-", "_")] == f"{paths['libexec_dir']}/{name}" for name in paths["helpers"]
               if name.replace("-", "_") in paths)


def test_the_exec_start_runs_the_launcher_with_one_flag_per_line_and_no_key() -> None:
    lines = serving.gateway_exec_start_lines("/opt/smg/venv/bin/python", PATHS["launcher"],
                                             ["--host", "0.0.0.0", "--worker-urls", "http://127.0.0.1:30001",
                                              "http://127.0.0.1:30002", "--policy", "cache_aware"])
    assert lines == ["/opt/smg/venv/bin/python /usr/local/lib/dflash-infra/smg-launch", "--host 0.0.0.0",
                     "--worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002", "--policy cache_aware"]


def test_a_converged_gateway_needs_nothing() -> None:
    assert todo(converged())["any"] is False


@pytest.mark.parametrize(("change", "expected"), [
    (lambda s: s["files"][PATHS["unit"]].update(sha256="e" * 64), {"unit": True, "restart": True}),
    (lambda s: s["files"][PATHS["libexec_dir"]]["children"]["smg-launch"].update(sha256="e" * 64),
     {"helpers": ["smg-launch"], "restart": True}),
    (lambda s: s["files"][PATHS["libexec_dir"]]["children"]["smg-ctl"].update(mode="0777"),
     {"helpers": ["smg-ctl"]}),  # the control-plane client is not part of the running gateway
    (lambda s: s["files"][PATHS["credentials"]]["children"]["api-key"].update(matches=False),
     {"api_key": True, "restart": True}),
    (lambda s: s["files"][PATHS["credentials"]]["children"].pop("control-plane-key"),
     {"control_key": "make", "restart": True}),
    (lambda s: s["files"][PATHS["credentials"]].update(mode="0755"),
     {"dirs": [{"path": PATHS["credentials"], "mode": "0700"}]}),
    (lambda s: s["units"]["smg-gateway.service"].update(ActiveState="failed"), {"start": True}),
    (lambda s: s["units"]["smg-gateway.service"].update(UnitFileState="disabled"), {"enable": True}),
])
def test_one_drift_is_one_thing_to_do(change: Any, expected: dict[str, Any]) -> None:
    state = converged()
    change(state)
    got = todo(state)
    assert {k: v for k, v in got.items() if v and k != "any"} == expected and got["any"]


def test_keys_given_or_taken_away() -> None:
    # An endpoint whose key was removed (loopback only): the file is emptied (host_state found it not empty, as the
    # deploy would write it), the gateway restarts without a key; its unit stays the same (key_file_text).
    removed = converged()
    removed["files"][PATHS["credentials"]]["children"]["api-key"].update(matches=False)
    assert {k for k, v in todo(removed, api_key="").items() if v} == {"api_key", "restart", "any"}
    assert serving.key_file_text("") == "" and serving.key_file_text("k" * 32) == "k" * 32 + "\n"
    # A keyless gateway's empty key file is what the deploy would write: nothing to do.
    assert todo(converged(), api_key="")["any"] is False
    # A host from before the key file was always there (keyless, no file): the empty file is written, one restart.
    older = converged()
    del older["files"][PATHS["credentials"]]["children"]["api-key"]
    assert {k for k, v in todo(older, api_key="").items() if v} == {"api_key", "restart", "any"}
    # A control-plane key from the vault that differs from the host's (host_state's comparison on the host said so):
    # written, restart.
    differs = converged()
    differs["files"][PATHS["credentials"]]["children"]["control-plane-key"].update(matches=False)
    assert todo(differs, control="other")["control_key"] == "write"
    assert todo(converged(), control="c")["control_key"] == ""  # the vault's key is the host's
    # None from the vault and one on the host (nothing expected of it: matches None): the host's is kept.
    kept = converged()
    kept["files"][PATHS["credentials"]]["children"]["control-plane-key"].update(matches=None)
    assert todo(kept, control="")["control_key"] == ""
    # A first install starts (not restarts) the gateway and makes the key.
    fresh = todo({"files": {}, "units": {}}, control="")
    assert fresh["start"] and not fresh["restart"] and fresh["control_key"] == "make" and fresh["unit"]


def test_a_gateway_section_given_outside_a_plan_is_checked_like_the_plans() -> None:
    section = gateway.checked_section({"worker_host": "127.0.200.1", "worker_base_port": 30000},
                                      {"host": "127.0.200.1", "port": 30100}, 1)
    assert section["workers"] == ["http://127.0.200.1:30000"] and section["port"] == 30100
    assert section["args"][:6] == ["--host", "127.0.200.1", "--port", "30100", "--worker-urls",
                                   "http://127.0.200.1:30000"]
    with pytest.raises(gateway.GatewayError, match=re.escape("replica 0's port 30000 is also the gateway's port")):
        gateway.checked_section({"worker_base_port": 30000}, {"host": "0.0.0.0", "port": 30000}, 1)
    with pytest.raises(gateway.GatewayError, match=re.escape("worker_host: 0.0.0.0 is not a loopback address")):
        gateway.checked_section({"worker_host": "0.0.0.0"}, {"host": "0.0.0.0", "port": 30000}, 2)


def test_the_gateways_record_names_its_lock_and_is_kept_while_nothing_changed() -> None:
    venv = {"venv": "/opt/smg/venv", "lock_sha256": "ab" * 32, "packages": 7, "notable": {"smg": "1.13.0"}}
    section = {"host": "0.0.0.0", "port": 30000, "workers": ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]}
    lock = "smg-1.13.0-py3.12-x86_64-manylinux_2_34.txt"
    first = serving.gateway_record(None, venv, lock, "1.13.0", "c" * 64, section, "2026-12-02T01:00:00+00:00")
    assert first == {"deployed_at": "2026-12-02T01:00:00+00:00", "smg": "1.13.0", "venv": "/opt/smg/venv",
                     "lock": {"file": lock, "sha256": "ab" * 32, "packages": 7, "notable": {"smg": "1.13.0"}},
                     "unit_sha256": "c" * 64, "endpoint": "0.0.0.0:30000", "tls": False,
                     "workers": section["workers"]}
    # The next run: the same record (the role writes nothing); a changed worker list is a new record.
    assert serving.gateway_record(first, venv, lock, "1.13.0", "c" * 64, section, "2026-12-02T02:00:00") == first
    one = {**section, "workers": section["workers"][:1]}
    fewer = serving.gateway_record(first, venv, lock, "1.13.0", "c" * 64, one, "2026-12-02T02:00:00")
    assert fewer["deployed_at"] == "2026-12-02T02:00:00" and fewer["workers"] == ["http://127.0.0.1:30001"]
    # HTTPS is part of the record: turning it on is a new record (restore.yml gates the unit put back by it).
    secure = serving.gateway_record(first, venv, lock, "1.13.0", "c" * 64, section, "2026-12-02T02:00:00",
                                    {"enabled": True})
    assert secure["tls"] is True and secure["deployed_at"] == "2026-12-02T02:00:00"


def test_tls_files_left_over_are_removed_after_the_gates_without_a_restart_of_their_own() -> None:
    """A converged gateway with TLS files the settings no longer ask for (a run that died after its unit changed,
    before tidy.yml): 'remove', and no restart (the running unit does not load them); a file to write restarts."""
    state = converged()
    state["files"][PATHS["tls_cert"]] = entry("d" * 64)
    left = todo(state)
    assert left["tls"] == "remove" and left["any"] is True and left["restart"] is False
    wanted = serving.gateway_todo(state, PATHS, "smg-gateway.service", UNIT, "k", "", HELPERS,
                                  {"enabled": True, "certificate": "C", "key": "K"})
    assert wanted["tls"] == "write" and wanted["restart"] is True


def test_a_gateway_put_back_is_gated_where_its_record_says_it_serves() -> None:
    """restore.yml gates the unit the gateway ran before this run at its record's endpoint and scheme: the run that
    failed may have turned TLS off (or on) or moved the port, and the unit put back serves as before it."""
    section = {"host": "0.0.0.0", "port": 30100}
    off = {"enabled": False}
    assert serving.gateway_restore_url({"endpoint": "0.0.0.0:30000", "tls": True}, section, off) == \
        "https://127.0.0.1:30000"
    assert serving.gateway_restore_url({"endpoint": "127.1.200.1:30000", "tls": False}, section,
                                       {"enabled": True}) == "http://127.1.200.1:30000"
    # A record from before `tls` was recorded: the settings' scheme; no record: the plan's endpoint.
    assert serving.gateway_restore_url({"endpoint": "0.0.0.0:30000"}, section, {"enabled": True}) == \
        "https://127.0.0.1:30000"
    assert serving.gateway_restore_url(None, section, off) == "http://127.0.0.1:30100"


def test_a_gateway_put_back_waits_only_for_the_workers_the_plan_still_has_where_they_were() -> None:
    """The unit put back lists its record's workers; one this run moved (another host's replica that turned TLS off)
    serves at its new URL until its own rollback, which follows the gateway's, and one it retired is stopped."""
    recorded = {"workers": ["http://127.1.200.1:30001", "http://127.1.200.1:30002", "https://127.1.201.1:30001"]}
    section = {"workers": ["http://127.1.200.1:30001", "http://127.1.201.1:30001"]}
    assert serving.gateway_restore_workers(recorded, section) == ["http://127.1.200.1:30001"]
    assert serving.gateway_restore_workers(None, section) == section["workers"]
    assert serving.gateway_restore_workers({"endpoint": "0.0.0.0:30000"}, section) == section["workers"]


def test_a_new_api_key_goes_to_the_running_gateway_before_the_replicas_roll() -> None:
    def first(state: dict[str, Any], key: str = "k") -> bool:
        return serving.gateway_key_first(state, PATHS, "smg-gateway.service", key)

    keyless = converged()
    del keyless["files"][PATHS["credentials"]]["children"]["api-key"]
    assert first(keyless) is True
    assert first(keyless, key="") is False  # no key wanted: the usual order
    assert first(converged()) is False  # the gateway has a key already (the same or another: the usual order)
    empty = converged()
    empty["files"][PATHS["credentials"]]["children"]["api-key"].update(size=0, matches=False)
    assert first(empty) is True  # a keyless gateway's key file is empty
    stopped = converged()
    del stopped["files"][PATHS["credentials"]]["children"]["api-key"]
    stopped["units"]["smg-gateway.service"]["ActiveState"] = "inactive"
    assert first(stopped) is False  # nothing to restart first: it starts after the replicas
    assert first({}) is False  # a fresh host
