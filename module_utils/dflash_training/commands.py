"""Running the host's own tools (systemctl, systemd-run, nvidia-smi) and keeping what they printed."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Output:
    """What a command printed and how it exited (rc 127 when it could not be started)."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        """The command and how it failed, in one line."""
        err = (self.stderr or self.stdout).strip().splitlines()
        return f"`{' '.join(self.argv)}` exited {self.rc}" + (f": {err[-1]}" if err else "")


def run(argv: list[str], timeout_s: float = 120.0) -> Output:
    """Run a command without a shell and without stdin."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                              check=False)
    except FileNotFoundError:
        return Output(tuple(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Output(tuple(argv), 124, "", f"no answer within {timeout_s:g} s")
    return Output(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
