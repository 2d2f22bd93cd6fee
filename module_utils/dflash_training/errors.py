"""The one error the training job's stop and resume raise for a problem the operator must fix."""

from __future__ import annotations


class TrainingError(ValueError):
    """Stopping or resuming cannot go on; the message says what was expected, what was found and what to do."""
