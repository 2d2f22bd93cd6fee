"""Lookup plugin dflash_template: ansible.builtin.template's lookup, without a deep copy of every variable per file.

The built-in lookup deep-copies all of the task's variables (the host's state and the plans among them) before it
renders a file, only to add the template_* names to that copy: about 30 ms per file here, and a converged
deploy renders a unit and a secrets file per replica to compare them with the host. A shallow copy gives the
template the same variables (it cannot change them) and renders the same text; every option is the built-in's.
"""

from __future__ import annotations

import copy
from typing import Any

from ansible.plugins.lookup import template as builtin

DOCUMENTATION = builtin.DOCUMENTATION.replace("name: template", "name: dflash_template", 1)
EXAMPLES = ""
RETURN = builtin.RETURN


class LookupModule(builtin.LookupModule):  # type: ignore[misc]  # ansible ships no type information
    """The built-in template lookup; its module-level deepcopy is a shallow copy while it runs."""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        deep = builtin.deepcopy
        builtin.deepcopy = copy.copy
        try:
            return list(super().run(terms, variables, **kwargs))
        finally:
            builtin.deepcopy = deep
