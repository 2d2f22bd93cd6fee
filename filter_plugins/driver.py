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


class FilterModule:
    """dflash_driver_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_driver_plan_from_state": dflash_driver_plan_from_state,
            "dflash_driver_check_transaction": dflash_driver_check_transaction,
            "dflash_driver_pin": dflash_driver_pin,
            "dflash_driver_audit": dflash_driver_audit,
        })
