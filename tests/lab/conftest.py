"""Fixtures for the lab builder tests: one lab for the whole session, brought up through lab/labctl.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from proxmoxer import ProxmoxAPI

REPO = Path(__file__).resolve().parents[2]
LABCTL_PATH = REPO / "lab" / "labctl.py"


sys.path.insert(0, str(LABCTL_PATH.parent))
import labctl  # noqa: E402  (lab/labctl.py: container table and /proc helpers)


@dataclass
class LabHandle:
    """The session's lab: its state folder and ways to drive and inspect it."""

    paths: Any  # labctl.Paths
    mod: ModuleType = labctl  # lab/labctl.py itself: container table and /proc helpers

    @property
    def machines(self) -> list[Any]:
        """The machines `lab up` keeps: every one but an on-demand one that was never built (ct201)."""
        return [c for c in self.mod.CONTAINERS if not c.on_demand or self.paths.created_stamp(c.name).exists()]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.machines]

    @property
    def addresses(self) -> dict[str, str]:
        return {c.name: c.address for c in self.mod.CONTAINERS}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the lab entry point and return its completed process (never raises)."""
        return subprocess.run([sys.executable, str(LABCTL_PATH), *args], cwd=REPO, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL)

    def cli_ok(self, *args: str) -> str:
        proc = self.cli(*args)
        assert proc.returncode == 0, f"lab {' '.join(args)} exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def status(self) -> dict[str, dict[str, Any]]:
        """`lab status --json`, keyed by container name."""
        proc = self.cli("status", "--json")
        assert proc.returncode in (0, 3), proc.stderr
        return {row["name"]: row for row in json.loads(proc.stdout)["containers"]}

    def pve_token(self) -> dict[str, str]:
        """The API token the lab's Proxmox VE API stand-in made at its first start (what the lab inventory reads)."""
        return json.loads((self.paths.state / "pve" / "api-token.json").read_text())

    def pve_node(self) -> Any:
        """A proxmoxer client of node pve1 on the API stand-in, with its token and checked against the lab CA."""
        token = self.pve_token()
        user, token_id = token["full-tokenid"].split("!")
        return ProxmoxAPI(self.addresses["pve1"], port=8006, user=user, token_name=token_id, token_value=token["value"],
                          verify_ssl=str(self.paths.state / "pve" / "tls" / "ca.crt")).nodes("pve1")

    def changeable_state(self, name: str = "ct200") -> str:
        """What a deploy could change on a container: processes on the GPUs, units, engine, models, records, dpkg."""
        proc = self.ssh(name, "sh", "-c", "pgrep -af train.py | cut -d' ' -f2-; ls /etc/systemd/system; "
                        "ls /opt /root/models /var/lib/dflash-infra 2>&1; dpkg-query -W -f='${Package} ${Version} "
                        "${db:Status-Abbrev}\\n' | sort; apt-mark showhold")
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def put(self, name: str, local: Path, remote: str) -> None:
        """Copy a file from this machine into a container (over SSH, as a user would with scp)."""
        container = next(c for c in labctl.CONTAINERS if c.name == name)
        with local.open("rb") as fh:
            proc = subprocess.run(labctl.ssh_argv(self.paths, container, "sh", "-c", shlex.quote(f"cat > {remote}")),
                                  stdin=fh, capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")

    def ssh(self, name: str, *command: str) -> subprocess.CompletedProcess[str]:
        """Run a command in a container over SSH with the lab key and the lab's known_hosts."""
        container = next(c for c in labctl.CONTAINERS if c.name == name)
        return subprocess.run(labctl.ssh_argv(self.paths, container, *command), text=True,
                              capture_output=True, stdin=subprocess.DEVNULL)


# A test file that starts from the host another file leaves runs right after it: the status view reads ct200 as
# test_deploy.py leaves it (served through the gateway), so its first deploy only rolls the replicas back to the
# inventory's settings; after the molecule scenarios (ct200 on one engine process) it would migrate the host again.
RIGHT_AFTER = {"test_status_lab.py": "test_deploy.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that take the lab down run after every other test of the session; RIGHT_AFTER's files follow theirs."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.path.name, index)

    def place(pair: tuple[int, pytest.Item]) -> tuple[bool, float, int]:
        index, item = pair
        follows = RIGHT_AFTER.get(item.path.name)
        module = first_seen[item.path.name] if follows not in first_seen else first_seen[follows] + 0.5
        return item.get_closest_marker("lab_teardown") is not None, module, index

    items[:] = [item for _, item in sorted(enumerate(items), key=place)]


def lab_skip_reason() -> str | None:
    if sys.platform != "linux":
        return "the lab boots systemd-nspawn containers and needs Linux"
    if os.geteuid() != 0:
        return "the lab needs root (debootstrap, systemd-nspawn); run as root or `make lab-up` first"
    if Path("/etc/pve").exists():
        return "refusing to boot lab containers on a Proxmox node (/etc/pve exists)"
    return None


@pytest.fixture(scope="session")
def lab() -> Iterator[LabHandle]:
    """Bring the lab up once for the session; if it was up before, leave it up afterwards."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    handle = LabHandle(paths=labctl.Paths(labctl.Settings.from_env().state))
    was_up = all(row["pid"] for row in handle.status().values()) if handle.paths.state.exists() else False
    handle.cli_ok("up")
    yield handle
    if was_up:
        handle.cli_ok("up")
