"""Ansible filters over dflash_infra.driver (NVIDIA user space vs kernel module); thin adapters, no logic."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from dflash_infra import driver
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import driver
    from dflash_infra.ansible_filters import as_filters


def _deny(extra: Sequence[str] | None) -> tuple[str, ...]:
    """The library's deny list plus inventory additions; inventory can extend it, never shorten it."""
    return driver.DENY_PATTERNS + tuple(extra or ())


def dflash_driver_probe(text: str, source: str = "user-space probe") -> dict[str, Any]:
    """userspace_probe.sh output -> {arch, packages, libraries}."""
    return driver.parse_userspace_probe(text, source).to_dict()


def dflash_driver_smi(result: Mapping[str, Any]) -> dict[str, Any]:
    """A registered nvidia-smi command result -> {status: ok|mismatch|error|absent, library_version, message}."""
    return driver.smi_status(result.get("rc"), result.get("stdout", ""), result.get("stderr", ""),
                             str(result.get("msg", "")))


def dflash_driver_state(probe: Mapping[str, Any], kernel_module: Mapping[str, Any] | None,
                        smi: Mapping[str, Any], deny: Sequence[str] | None = None) -> dict[str, Any]:
    """Kernel module vs user space: {status, reason, versions...}; `deny` adds to the library's deny list."""
    return driver.driver_state(kernel_module, driver.UserspaceProbe.from_dict(probe), smi, _deny(deny))


def dflash_driver_plan(request: Mapping[str, Any]) -> dict[str, Any]:
    """The alignment plan for one host (see dflash_infra.driver.plan_request)."""
    return driver.plan_request(request)


def dflash_driver_plan_from_state(state: Mapping[str, Any], deny: Sequence[str] | None = None,
                                  deb_dirs: Sequence[str] | None = None, missing_hint: str = "",
                                  madison: str | None = None) -> dict[str, Any]:
    """The alignment plan for one host from its host_state (and apt-cache madison's answer, once asked)."""
    return driver.plan_from_state(state, deny or (), deb_dirs, missing_hint, madison)


def dflash_driver_check_transaction(simulation: str, plan: Mapping[str, Any],
                                    deny: Sequence[str] | None = None) -> dict[str, Any]:
    """apt-get -s output checked against the plan: {ok, errors, extra, actions}."""
    return driver.check_transaction(simulation, plan, _deny(deny))


def dflash_driver_pin(packages: Sequence[str], version: str) -> str:
    """apt preferences stanza pinning the set to the kernel module's upstream version (priority 1001)."""
    return driver.pin_preferences(list(packages), version)


def dflash_driver_audit(text: str) -> list[str]:
    """Packages `dpkg --audit` reports as half-installed or unconfigured."""
    return driver.dpkg_audit_packages(text)


def dflash_driver_denied(packages: Sequence[str], deny: Sequence[str] | None = None) -> list[str]:
    """The names among `packages` that the deny list matches."""
    return [p for p in packages if driver.is_denied(p, _deny(deny))]


class FilterModule:
    """dflash_driver_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_driver_probe": dflash_driver_probe,
            "dflash_driver_smi": dflash_driver_smi,
            "dflash_driver_state": dflash_driver_state,
            "dflash_driver_plan": dflash_driver_plan,
            "dflash_driver_plan_from_state": dflash_driver_plan_from_state,
            "dflash_driver_check_transaction": dflash_driver_check_transaction,
            "dflash_driver_pin": dflash_driver_pin,
            "dflash_driver_audit": dflash_driver_audit,
            "dflash_driver_denied": dflash_driver_denied,
        })
