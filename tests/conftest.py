"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest

from helpers import ansible_environment


@pytest.fixture(scope="session")
def ansible_env() -> dict[str, str]:
    return ansible_environment()
