"""TLS on the endpoint: the settings checked, the certificate's expiry, and what is still served in cleartext.

`dflash_endpoint_tls` ({enabled, certificate, key, ca}: PEM texts, the key from ansible-vault) makes the gateway's
listener serve HTTPS. These functions run on the controller (the certificate is parsed with `cryptography`, which
ansible-core depends on); they never see or print the key beyond checking that it is a PEM private key.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Mapping
from typing import Any

# A deploy warns this many days before the endpoint's certificate expires.
EXPIRY_WARNING_DAYS = 30
KEYS = ("enabled", "certificate", "key", "ca")


def not_after(pem: str) -> dt.datetime:
    """The certificate's expiry (UTC); ValueError naming the problem for text that is not a PEM certificate."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"expected a PEM certificate, found text that is not one ({exc})") from None
    return cert.not_valid_after_utc


def settings_problems(tls: Any, through_gateway: bool) -> list[str]:
    """Why dflash_endpoint_tls cannot be served (empty when it can, or when it is off)."""
    where = "dflash_endpoint_tls"
    if not isinstance(tls, Mapping):
        return [f"{where}: expected a mapping with {', '.join(KEYS)}, found {type(tls).__name__}"]
    unknown = sorted(set(map(str, tls)) - set(KEYS))
    if unknown:
        return [f"{where}.{unknown[0]}: unknown key; known: {', '.join(KEYS)}"]
    if not isinstance(tls.get("enabled", False), bool):
        return [f"{where}.enabled: expected true or false, found {tls.get('enabled')!r}"]
    if not tls.get("enabled"):
        return []
    problems = []
    if not through_gateway:
        problems.append(f"{where}: TLS is served by the SGLang Model Gateway; this host serves without it "
                        "(dflash_serve_through_gateway: false). Serve through the gateway or turn TLS off")
    for name, marker, what in (("certificate", "-----BEGIN CERTIFICATE-----", "the endpoint's certificate"),
                               ("key", "PRIVATE KEY-----", "its private key"),
                               ("ca", "-----BEGIN CERTIFICATE-----", "the team's CA certificate")):
        text = tls.get(name)
        if name == "ca" and not text:
            continue  # the CA is needed only to verify other hosts' replicas (checked there)
        if not isinstance(text, str) or marker not in text:
            problems.append(f"{where}.{name}: expected the PEM text of {what} ({marker.strip('-')}), found "
                            f"{'nothing' if not text else 'other text'}"
                            + ("; put it in ansible-vault as vault_dflash_endpoint_tls_key" if name == "key" else ""))
    for name in ("certificate", "ca"):
        if tls.get(name) and not any(p.startswith(f"{where}.{name}:") for p in problems):
            try:
                not_after(str(tls[name]))
            except ValueError as exc:
                problems.append(f"{where}.{name}: {exc}")
    return problems


def expiry_warnings(host: str, pem: str | None, now: dt.datetime, days: int = EXPIRY_WARNING_DAYS) -> list[str]:
    """A warning when the certificate served (as host_state read it, else the one to be written) expires within
    `days` (or has expired)."""
    if not pem:
        return []
    try:
        expires = not_after(pem)
    except ValueError as exc:
        return [f"{host}: the endpoint's certificate cannot be read: {exc}"]
    left = expires - now
    if left.total_seconds() <= 0:
        return [f"{host}: the endpoint's certificate expired on {expires:%Y-%m-%d}; clients refuse it. Renew it "
                "(dflash_endpoint_tls.certificate) and deploy"]
    if left.days < days:
        return [f"{host}: the endpoint's certificate expires on {expires:%Y-%m-%d} (in {left.days} days); renew it "
                "(dflash_endpoint_tls.certificate) and deploy"]
    return []


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(str(address).strip("[]")).is_loopback
    except ValueError:
        return str(address) == "localhost"


def cleartext_warnings(host: str, listen: str, keyed: bool, tls_on: bool, remote_workers: list[str]) -> list[str]:
    """What is served in cleartext beyond loopback (warned, not refused): a keyed endpoint whose callers send their
    key unencrypted, and the gateway's hops to replicas on other hosts."""
    out = []
    if keyed and not tls_on and not _loopback(listen):
        out.append(f"{host}: the endpoint listens on {listen} beyond loopback with an API key in cleartext: callers "
                   "send the key unencrypted. Serve it over TLS (dflash_endpoint_tls, docs/serving.md \"TLS\")")
    cleartext = [url for url in remote_workers if str(url).startswith("http://")]
    if cleartext:
        out.append(f"{host}: the gateway reaches replicas on other hosts in cleartext ({', '.join(cleartext)}): "
                   "requests and the endpoint's key cross the network unencrypted")
    return out


def worker_problems(worker_tls: Any, here: bool, gateway_host: str, gateway_has_ca: bool,
                    gateway_runs_ca: bool = True) -> list[str]:
    """Why dflash_worker_tls cannot be served: it is for replicas another host's gateway fronts, needs this host's
    certificate and key as PEM, and the CA on the gateway's host to verify them, already running there: a replica
    switched to HTTPS is added back to the gateway as it rolls, before the gateway's own turn in the run."""
    where = "dflash_worker_tls"
    if not isinstance(worker_tls, Mapping) or worker_tls.get("enabled") is not True:
        return []
    if here:
        return [f"{where}: this host's replicas are fronted by its own gateway on loopback; TLS on that hop is for a "
                "host whose dflash_gateway_host is another host"]
    problems = []
    for name, marker in (("certificate", "-----BEGIN CERTIFICATE-----"), ("key", "PRIVATE KEY-----")):
        text = worker_tls.get(name)
        if not isinstance(text, str) or marker not in text:
            problems.append(f"{where}.{name}: expected the PEM text of this host's {name} ({marker.strip('-')}), "
                            f"found {'nothing' if not text else 'other text'}")
    if not problems:
        try:
            not_after(str(worker_tls["certificate"]))
        except ValueError as exc:
            problems.append(f"{where}.certificate: {exc}")
    if not gateway_has_ca:
        problems.append(f"{where}: the gateway on {gateway_host} has no CA to verify this host's certificate; set "
                        f"dflash_endpoint_tls.ca for {gateway_host} (the team's CA)")
    elif not gateway_runs_ca:
        problems.append(f"{where}: the gateway on {gateway_host} does not run with the team's CA yet, and this host's "
                        "replicas are added back to it before it restarts in a run. Deploy both hosts once with "
                        f"dflash_endpoint_tls.ca set for {gateway_host} and dflash_worker_tls off, then turn it on")
    return problems


def preflight(host: str, tls: Any, here: bool, through_gateway: bool, listen: str, keyed: bool,
              replicas: list[dict[str, Any]], installed: str | None, now: str | dt.datetime,
              worker_tls: Any = None, gateway_host: str = "", gateway_has_ca: bool = False,
              gateway_runs_ca: bool = True) -> dict[str, list[str]]:
    """Before anything changes: `problems` (the deploy is refused: TLS settings that cannot be served) and `warnings`
    (said, not refused: a keyed endpoint or a cross-host hop in cleartext beyond loopback, a certificate that expires
    within EXPIRY_WARNING_DAYS). `here`: this host runs the endpoint (its own gateway); `replicas`: the plan's, whose
    `url`s another host's gateway reaches when they are remote; `installed`: the certificate host_state read."""
    moment = now if isinstance(now, dt.datetime) else dt.datetime.fromisoformat(str(now))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    if not here:  # the endpoint is another host's; only this host's hop to it is ours to judge
        remote = [str(r.get("url")) for r in replicas if not _loopback(str(r.get("host", "")))]
        return {"problems": [f"{host}: {p}" for p in worker_problems(worker_tls, here, gateway_host, gateway_has_ca,
                                                                      gateway_runs_ca)],
                "warnings": cleartext_warnings(host, listen, False, False, remote)}
    problems = [f"{host}: {p}" for p in settings_problems(tls, through_gateway)
                + worker_problems(worker_tls, here, gateway_host, gateway_has_ca)]
    on = isinstance(tls, Mapping) and tls.get("enabled") is True
    warnings = cleartext_warnings(host, listen, keyed, on, [])
    if on and not problems:
        warnings += expiry_warnings(host, installed or str(tls.get("certificate") or ""), moment)
        configured = str(tls.get("certificate") or "")
        if installed and configured and installed.strip() != configured.strip():
            warnings += expiry_warnings(host, configured, moment)
    return {"problems": problems, "warnings": sorted(set(warnings), key=warnings.index)}
