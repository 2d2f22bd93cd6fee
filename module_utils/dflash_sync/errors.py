"""The one error a sync raises for a problem the operator must fix."""

from __future__ import annotations


class SyncError(ValueError):
    """A sync cannot go on; the message says what was expected, what was found and what to do."""
