"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest

from helpers import ansible_environment, use_module_utils

# The module_utils code is tested where it runs on the hosts: as ansible.module_utils.<package>.
use_module_utils()


@pytest.fixture(scope="session")
def ansible_env() -> dict[str, str]:
    return ansible_environment()
