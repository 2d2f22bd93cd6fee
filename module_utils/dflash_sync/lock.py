"""An exclusive lock per model, so two syncs never write the same staging folder."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

from .errors import SyncError


class Lock:
    """flock on <staging parent>/<name>.lock holding the pid of the sync that owns it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            raise SyncError(f"{self.path}: another sync of this model is running (pid {holder}); "
                            "wait for it or stop it, then run again") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)
