"""TLS on the endpoint, decided on the controller (dflash_infra/tls.py) and written by the gateway role
(dflash_infra.serving: the files, what differs from the host); certificates made here with `cryptography`."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dflash_infra import serving, tls

NOW = dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC)


def certificate(days: int) -> tuple[str, str]:
    """A self-signed certificate valid `days` from NOW, and its key (PEM texts)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "endpoint.test")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(NOW + dt.timedelta(days=days))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


CERT, KEY = certificate(365)
SETTINGS = {"enabled": True, "certificate": CERT, "key": KEY, "ca": CERT}


def test_good_settings_pass_and_off_needs_nothing() -> None:
    assert tls.settings_problems(SETTINGS, through_gateway=True) == []
    assert tls.settings_problems({"enabled": False, "certificate": "", "key": "", "ca": ""}, True) == []


@pytest.mark.parametrize(("settings", "through", "problem"), [
    ({**SETTINGS, "key": ""}, True, "dflash_endpoint_tls.key: expected the PEM text of its private key"),
    ({**SETTINGS, "certificate": "not a cert"}, True, "dflash_endpoint_tls.certificate: expected the PEM text"),
    ({**SETTINGS, "ca": "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n"}, True,
     "dflash_endpoint_tls.ca: expected a PEM certificate, found text that is not one"),
    (SETTINGS, False, "dflash_endpoint_tls: TLS is served by the SGLang Model Gateway"),
    ({**SETTINGS, "enabled": "yes"}, True, "dflash_endpoint_tls.enabled: expected true or false"),
    ({**SETTINGS, "cert": CERT}, True, "dflash_endpoint_tls.cert: unknown key"),
    (["x"], True, "dflash_endpoint_tls: expected a mapping"),
])
def test_settings_that_cannot_be_served_are_refused_naming_the_field(settings: Any, through: bool,
                                                                     problem: str) -> None:
    problems = tls.settings_problems(settings, through)
    assert any(p.startswith(problem) for p in problems), problems
    assert all(KEY not in p for p in problems)


def test_a_certificate_expiring_within_30_days_is_warned_about() -> None:
    soon, _ = certificate(10)
    gone, _ = certificate(-1)
    assert tls.expiry_warnings("ct200", CERT, NOW) == []
    [warning] = tls.expiry_warnings("ct200", soon, NOW)
    assert warning.startswith("ct200: the endpoint's certificate expires on ") and "(in 10 days)" in warning
    assert "expired on" in tls.expiry_warnings("ct200", gone, NOW)[0]


def test_cleartext_beyond_loopback_is_warned_about_not_refused() -> None:
    [keyed] = tls.cleartext_warnings("ct200", "0.0.0.0", keyed=True, tls_on=False, remote_workers=[])
    assert "beyond loopback with an API key in cleartext" in keyed
    assert tls.cleartext_warnings("ct200", "127.0.0.1", True, False, []) == []
    assert tls.cleartext_warnings("ct200", "0.0.0.0", True, True, []) == []
    [hop] = tls.cleartext_warnings("ct201", "0.0.0.0", False, False, ["http://ct201.internal:30001"])
    assert "reaches replicas on other hosts in cleartext (http://ct201.internal:30001)" in hop


def test_preflight_judges_the_endpoint_on_its_host_and_the_hop_on_the_fronted_host() -> None:
    here = tls.preflight("ct200", SETTINGS, True, True, "0.0.0.0", True, [], None, NOW.isoformat())
    assert here == {"problems": [], "warnings": []}
    soon, _ = certificate(5)
    installed = tls.preflight("ct200", SETTINGS, True, True, "0.0.0.0", True, [], soon, NOW.isoformat())
    assert installed["problems"] == [] and "(in 5 days)" in installed["warnings"][0]
    off = tls.preflight("ct200", {"enabled": False}, True, True, "0.0.0.0", True, [], None, NOW.isoformat())
    assert off["problems"] == [] and "in cleartext" in off["warnings"][0]
    fronted = tls.preflight("ct201", SETTINGS, False, True, "0.0.0.0", True,
                            [{"host": "0.0.0.0", "url": "http://ct201.internal:30001"}], None, NOW.isoformat())
    assert fronted["problems"] == [] and "http://ct201.internal:30001" in fronted["warnings"][0]


def test_the_gateway_writes_and_compares_the_tls_files() -> None:
    paths = serving.gateway_paths("smg-gateway.service", "/etc/dflash-infra", "/usr/local/lib/dflash-infra")
    files = serving.secret_files([], "", "", paths, "", SETTINGS)
    assert files == [{"path": paths["api_key"], "content": ""},  # no endpoint key: its file empty
                     {"path": paths["tls_key"], "content": KEY.rstrip("\n") + "\n"}]  # the key only: cert, CA public
    assert serving.tls_text(SETTINGS, "cert") == CERT.rstrip("\n") + "\n"
    import hashlib

    def file(text: str) -> dict[str, Any]:
        return {"exists": True, "kind": "file", "sha256": hashlib.sha256(text.encode()).hexdigest(), "mode": "0600",
                "owner": "root", "group": "root"}

    state = {"files": {paths["tls_cert"]: file(serving.tls_text(SETTINGS, "cert")),
                       paths["tls_ca"]: file(serving.tls_text(SETTINGS, "ca")),
                       paths["credentials"]: {"exists": True, "kind": "dir", "children": {"tls-key": {
                           "exists": True, "kind": "file", "matches": True, "mode": "0600", "owner": "root",
                           "group": "root"}}}}}
    todo = serving.gateway_todo(state, paths, "smg-gateway.service", "u" * 64, "", "", {}, SETTINGS)
    assert todo["tls"] == ""
    other, _ = certificate(30)
    assert serving.gateway_todo(state, paths, "smg-gateway.service", "u" * 64, "", "", {},
                                {**SETTINGS, "certificate": other})["tls"] == "write"
    left = serving.gateway_todo(state, paths, "smg-gateway.service", "u" * 64, "", "", {}, {"enabled": False})
    assert left["tls"] == "remove" and left["any"] is True
    assert serving.base_url({"host": "0.0.0.0", "port": 30000, "tls": True}) == "https://127.0.0.1:30000"


WORKER = {"enabled": True, "certificate": CERT, "key": KEY}


def test_the_hop_to_another_hosts_replicas_needs_their_certificate_and_the_gateways_ca() -> None:
    assert tls.worker_problems(WORKER, here=False, gateway_host="ct200", gateway_has_ca=True) == []
    [no_ca] = tls.worker_problems(WORKER, here=False, gateway_host="ct200", gateway_has_ca=False)
    assert no_ca.startswith("dflash_worker_tls: the gateway on ct200 has no CA")
    [here] = tls.worker_problems(WORKER, here=True, gateway_host="ct200", gateway_has_ca=True)
    assert "fronted by its own gateway on loopback" in here
    bad = tls.worker_problems({**WORKER, "key": "x"}, here=False, gateway_host="ct200", gateway_has_ca=True)
    assert bad == ["dflash_worker_tls.key: expected the PEM text of this host's key (PRIVATE KEY), found other text"]
    assert tls.worker_problems({"enabled": False}, here=False, gateway_host="ct200", gateway_has_ca=False) == []
    # The CA set but not yet running on the gateway: the replica would be added back to a gateway that cannot verify it.
    [first] = tls.worker_problems(WORKER, here=False, gateway_host="ct200", gateway_has_ca=True, gateway_runs_ca=False)
    assert "does not run with the team's CA yet" in first and "then turn it on" in first


def test_remote_replicas_over_tls_are_reached_at_https_and_written_as_their_units_credentials() -> None:
    from pathlib import Path

    import yaml

    from dflash_infra.planner import plan_dict
    examples = Path(__file__).resolve().parents[1] / "examples"
    request = yaml.safe_load((examples / "pro6000.yml").read_text())
    request["gateway"] = {"remote": True, "worker_host": "0.0.0.0", "worker_address": "ct201.internal",
                          "worker_tls": True}
    plan = plan_dict(request, examples)
    assert plan["errors"] == []
    assert plan["replicas"][0]["url"] == "https://ct201.internal:30001" and plan["replicas"][0]["tls"] is True
    assert plan["replicas"][0]["local_url"] == "https://127.0.0.1:30001"
    request["gateway"] = {"worker_tls": True}
    assert any(e.startswith("gateway.worker_tls: only replicas a gateway on another host fronts")
               for e in plan_dict(request, examples)["errors"])
    paths = serving.service_paths("sglang-qwen-r0.service", "/etc/dflash-infra", "/var/lib/dflash-infra",
                                  "/usr/local/lib/dflash-infra")
    assert (paths["tls_cert"], paths["tls_key"]) == ("/etc/dflash-infra/sglang-qwen-r0.tls-cert",
                                                     "/etc/dflash-infra/sglang-qwen-r0.tls-key")
    gateway = serving.gateway_paths("smg-gateway.service", "/etc/dflash-infra", "/usr/local/lib/dflash-infra")
    files = serving.secret_files([paths["env_file"]], "", "", gateway, "", None, WORKER)
    assert [f["path"] for f in files] == [paths["env_file"], gateway["api_key"], paths["tls_cert"], paths["tls_key"]]

    def held(matches: bool) -> dict[str, Any]:
        return {"exists": True, "kind": "file", "matches": matches, "mode": "0600", "owner": "root", "group": "root"}

    state = {"files": {paths["tls_cert"]: held(True), paths["tls_key"]: held(True)}}
    assert serving.engine_tls_todo(state, paths, True) == ""
    assert serving.engine_tls_todo({"files": {paths["tls_cert"]: held(False)}}, paths, True) == "write"
    assert serving.engine_tls_todo(state, paths, False) == "remove"
    assert serving.engine_tls_todo({"files": {}}, paths, False) == ""


def test_the_gateway_loads_the_ca_alone_when_only_its_workers_are_verified() -> None:
    assert serving.gateway_tls_parts({"enabled": False, "ca": CERT}) == ["ca"]
    assert serving.gateway_tls_parts(SETTINGS) == ["cert", "key", "ca"]
    assert serving.gateway_tls_parts({"enabled": False, "ca": ""}) == []


def test_https_replicas_are_scraped_in_a_job_of_their_own_verified_against_the_ca() -> None:
    from dflash_infra import monitoring
    plan = {"replicas": [{"index": 0, "port": 30001, "host": "0.0.0.0", "cuda_visible_devices": "0,1", "tls": True}]}
    config = monitoring.scrape_config([{"host": "ct201", "address": "ct201.internal", "plan": plan}], "15s",
                                      "/etc/prometheus/team-ca.pem")
    [job] = config["scrape_configs"]
    assert job["job_name"].endswith("-tls") and job["scheme"] == "https"
    assert job["tls_config"] == {"ca_file": "/etc/prometheus/team-ca.pem"}
    assert job["static_configs"][0]["targets"] == ["ct201.internal:30001"]
