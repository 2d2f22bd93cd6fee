"""Expose library functions as Ansible filters: the library's input errors become AnsibleFilterError.

Every filter plugin in filter_plugins/ is a table of names over this; the plugins hold no logic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any


def as_filters(functions: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Wrap each function so a ValueError (ParseError, ModelConfigError, ...) reads as the play's error."""
    from ansible.errors import AnsibleFilterError

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except ValueError as exc:
                raise AnsibleFilterError(str(exc)) from exc
        return inner

    return {name: wrap(func) for name, func in functions.items()}
