"""The Proxmox VE API stand-in (lab/pve/api.py) on its own: HTTPS with the lab CA, token auth, the response
shapes the community.proxmox modules read, snapshots and rollbacks of container folders. The server runs on
127.0.10.1 with a temporary state folder and a backend of plain folders (no lab); proxmoxer and the real
community.proxmox modules are its clients.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from helpers import ROOT, ansible_environment, tool

sys.path.insert(0, str(ROOT / "lab" / "pve"))
import api as standin

ADDRESS = "127.0.10.1"
CT200 = """#Lab stand-in of CT200 (group pro6000)%3A two GPUs
arch: amd64
cores: 8
hostname: ct200
memory: 16384
ostype: debian
rootfs: local-lvm:vm-200-disk-0,size=64G
swap: 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 238:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file
"""
UPID = re.compile(r"^UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:(?P<type>\w+):(?P<id>\d+):dflash@pve!deploy:$")


@dataclass
class FolderBackend:
    """Containers as folders under the test's tmp dir; power state in memory (what the lab does with nspawn)."""

    root: Path
    up: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    fail_start: str = ""

    def known(self, name: str) -> bool:
        return (self.root / name).is_dir()

    def running(self, name: str) -> bool:
        return name in self.up

    def uptime(self, name: str) -> int:
        return 42 if name in self.up else 0

    def start(self, name: str, log: Callable[[str], None]) -> None:
        self.calls.append(f"start {name}")
        if self.fail_start:
            raise RuntimeError(self.fail_start)
        log(f"{name}: booted")
        self.up.add(name)

    def stop(self, name: str, log: Callable[[str], None]) -> None:
        self.calls.append(f"stop {name}")
        self.up.discard(name)

    def rootfs(self, name: str) -> Path:
        return self.root / name


@dataclass
class Standin:
    server: standin.Server
    backend: FolderBackend
    state: Path

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def ca(self) -> Path:
        return self.state / "pve" / "tls" / "ca.crt"

    @property
    def token(self) -> dict[str, Any]:
        return json.loads((self.state / "pve" / "api-token.json").read_text())

    @property
    def conf(self) -> Path:
        return self.state / "pve" / "etc-pve" / "lxc" / "200.conf"

    def client(self, secret: str | None = None) -> ProxmoxAPI:
        user, token_id = self.token["full-tokenid"].split("!")
        return ProxmoxAPI(ADDRESS, port=self.port, user=user, token_name=token_id,
                          token_value=secret or self.token["value"], verify_ssl=True)

    def ct(self, secret: str | None = None) -> Any:
        return self.client(secret).nodes("pve1").lxc(200)

    def wait(self, upid: str) -> dict[str, Any]:
        """Join the task's thread, then read its status through the API."""
        match = UPID.match(upid)
        assert match, upid
        for thread in threading.enumerate():
            if thread.name == upid:
                thread.join()
        return self.client().nodes("pve1").tasks(upid).status.get()


@pytest.fixture
def pve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Standin]:
    state = tmp_path / "state"
    lxc = state / "pve" / "etc-pve" / "lxc"
    lxc.mkdir(parents=True)
    (lxc / "200.conf").write_text(CT200)
    backend = FolderBackend(tmp_path / "machines")
    (backend.root / "ct200" / "root").mkdir(parents=True)
    server = standin.make_server(state, ADDRESS, 0, "pve1", backend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    running = Standin(server, backend, state)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(running.ca))
    yield running
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------- HTTPS and the token


def test_https_is_checked_against_the_lab_ca(pve: Standin, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pve.client().version.get()["release"] == standin.VERSION["release"]
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        pve.client().version.get()
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(pve.state / "pve/tls/server.crt")],
                          capture_output=True, text=True, check=True).stdout
    assert f"IP Address:{ADDRESS}, DNS:pve1" in text and "CA:FALSE" in text
    assert "CA:TRUE" in subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(pve.ca)],
                                       capture_output=True, text=True, check=True).stdout


def test_requests_without_the_token_are_refused(pve: Standin) -> None:
    url = f"https://{ADDRESS}:{pve.port}/api2/json/version"
    answer = requests.get(url, verify=str(pve.ca), timeout=30)
    assert (answer.status_code, answer.reason, answer.json()) == (401, "No ticket", {"data": None})
    with pytest.raises(ResourceException, match=r"^401 Unauthorized: authentication failure"):
        pve.client(secret="not-the-secret").version.get()
    other = requests.get(url, verify=str(pve.ca), timeout=30,
                         headers={"Authorization": f"PVEAPIToken=root@pam!deploy={pve.token['value']}"})
    assert other.status_code == 401
    assert (pve.state / "pve" / "api-token.json").stat().st_mode & 0o777 == 0o600


# --------------------------------------------------------------------------- configs


def test_config_has_the_api_shape(pve: Standin) -> None:
    config = pve.ct().config.get(current=1)
    assert config["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"], ["lxc.cgroup2.devices.allow", "c 238:* rwm"],
                             ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"],
                             ["lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file"]]
    assert config["digest"] == hashlib.sha1(CT200.encode()).hexdigest()
    assert config["memory"] == 16384 and config["hostname"] == "ct200"
    assert config["description"] == "Lab stand-in of CT200 (group pro6000): two GPUs\n"


def test_config_put_refuses_raw_keys_like_a_real_node(pve: Standin) -> None:
    with pytest.raises(ResourceException) as refused:
        pve.ct().config.put(**{"lxc.cgroup2.devices.allow": "c 511:* rwm"})
    assert refused.value.status_code == 400 and refused.value.content == "Parameter verification failed."
    assert refused.value.errors == {"lxc.cgroup2.devices.allow": "property is not defined in schema and the schema "
                                                                 "does not allow additional properties"}
    assert pve.conf.read_text() == CT200
    pve.ct().config.put(memory=32768, digest=hashlib.sha1(CT200.encode()).hexdigest())
    assert "memory: 32768\n" in pve.conf.read_text()
    with pytest.raises(ResourceException, match="detected modified configuration"):
        pve.ct().config.put(cores=4, digest=hashlib.sha1(CT200.encode()).hexdigest())


# --------------------------------------------------------------------------- power


def test_start_and_shutdown_are_tasks(pve: Standin) -> None:
    assert pve.ct().status.current.get()["status"] == "stopped"
    upid = pve.ct().status.start.post()
    status = pve.wait(upid)
    assert UPID.match(upid)["type"] == "vzstart"
    assert {k: status[k] for k in ("status", "exitstatus", "type", "id", "user", "tokenid", "node")} == \
        {"status": "stopped", "exitstatus": "OK", "type": "vzstart", "id": "200", "user": "dflash@pve",
         "tokenid": "deploy", "node": "pve1"}
    assert pve.ct().status.current.get()["status"] == "running"
    with pytest.raises(ResourceException, match="500 Internal Server Error: CT 200 already running"):
        pve.ct().status.start.post()
    resources = pve.client().cluster.resources.get(type="vm")
    assert [(r["id"], r["vmid"], r["name"], r["node"], r["status"]) for r in resources] == \
        [("lxc/200", 200, "ct200", "pve1", "running")]
    pve.wait(pve.ct().status.shutdown.post(forceStop=1))
    assert pve.ct().status.current.get()["status"] == "stopped"


def test_failed_task_has_its_error_as_exit_status(pve: Standin) -> None:
    pve.backend.fail_start = "container did not boot"
    status = pve.wait(pve.ct().status.start.post())
    assert (status["status"], status["exitstatus"]) == ("stopped", "container did not boot")
    log = pve.client().nodes("pve1").tasks(status["upid"]).log.get()
    assert log[-1] == {"n": len(log), "t": "TASK ERROR: container did not boot"}


# --------------------------------------------------------------------------- snapshots


def test_snapshot_rollback_and_delete(pve: Standin) -> None:
    marker = pve.backend.rootfs("ct200") / "root" / "marker"
    marker.write_text("before the stage\n")
    pve.backend.up.add("ct200")
    task = pve.ct().snapshot.post(snapname="dflash-align-1", description="before: align")
    assert pve.wait(task)["exitstatus"] == "OK"
    listing = pve.ct().snapshot.get()
    assert [s["name"] for s in listing] == ["dflash-align-1", "current"]
    assert listing[0]["description"] == "before: align" and listing[0]["snaptime"] > 0
    assert listing[-1] == {"name": "current", "digest": hashlib.sha1(pve.conf.read_bytes()).hexdigest(),
                           "running": 1, "parent": "dflash-align-1"}
    assert "\n[dflash-align-1]\n#before%3A align\n" in pve.conf.read_text()

    marker.write_text("after the stage\n")
    (marker.parent / "new-file").write_text("x")
    pve.ct().config.put(memory=1024)
    status = pve.wait(pve.ct()("snapshot")("dflash-align-1").rollback.post())
    assert (status["type"], status["exitstatus"]) == ("vzrollback", "OK")
    assert marker.read_text() == "before the stage\n" and not (marker.parent / "new-file").exists()
    assert pve.backend.calls == ["stop ct200"]  # a running container is stopped and stays stopped ...
    assert pve.ct().config.get()["memory"] == 16384
    pve.wait(pve.ct()("snapshot")("dflash-align-1").rollback.post(start=1))
    assert pve.backend.calls == ["stop ct200", "start ct200"]  # ... unless start=1

    with pytest.raises(ResourceException, match="snapshot name 'dflash-align-1' already used"):
        pve.ct().snapshot.post(snapname="dflash-align-1")
    with pytest.raises(ResourceException, match="400 Bad Request: Parameter verification failed"):
        pve.ct().snapshot.post(snapname="1-starts-with-a-digit")
    pve.wait(pve.ct().snapshot("dflash-align-1").delete())
    assert [s["name"] for s in pve.ct().snapshot.get()] == ["current"]
    assert "parent" not in pve.ct().config.get() and "[dflash-align-1]" not in pve.conf.read_text()
    assert not (pve.state / "pve" / "snapshots" / "200" / "dflash-align-1").exists()


def test_unknown_paths_and_nodes(pve: Standin) -> None:
    with pytest.raises(ResourceException, match=r"501 Not Implemented: Method 'GET /api2/json/nodes/pve1/qemu'"):
        pve.client().nodes("pve1").qemu.get()
    with pytest.raises(ResourceException, match="hostname lookup 'pve9' failed"):
        pve.client().nodes("pve9").lxc.get()
    with pytest.raises(ResourceException, match=r"Configuration file 'nodes/pve1/lxc/999.conf' does not exist"):
        pve.client().nodes("pve1").lxc(999).config.get()


# --------------------------------------------------------------------------- the real modules as clients


def test_community_proxmox_modules_work_against_the_standin(pve: Standin, tmp_path: Path) -> None:
    user, token_id = pve.token["full-tokenid"].split("!")
    result = tmp_path / "results.json"
    playbook = [{
        "name": "Drive the stand-in with the modules the proxmox_guest role uses",
        "hosts": "localhost", "gather_facts": False,
        "environment": {"REQUESTS_CA_BUNDLE": str(pve.ca)},
        "module_defaults": {"group/community.proxmox.proxmox": {
            "api_host": ADDRESS, "api_port": pve.port, "api_user": user, "api_token_id": token_id,
            "api_token_secret": pve.token["value"], "validate_certs": True}},
        "tasks": [
            {"name": "Read the config", "register": "info",
             "community.proxmox.proxmox_vm_info": {"node": "pve1", "type": "lxc", "vmid": 200, "config": "current"}},
            {"name": "Start", "register": "started",
             "community.proxmox.proxmox": {"vmid": 200, "node": "pve1", "state": "started", "timeout": 60}},
            {"name": "Snapshot", "register": "snap",
             "community.proxmox.proxmox_snap": {"vmid": 200, "state": "present", "snapname": "dflash-test-1"}},
            {"name": "Roll back", "register": "rolled",
             "community.proxmox.proxmox_snap": {"vmid": 200, "state": "rollback", "snapname": "dflash-test-1"}},
            {"name": "Delete", "register": "deleted",
             "community.proxmox.proxmox_snap": {"vmid": 200, "state": "absent", "snapname": "dflash-test-1"}},
            {"name": "Keep the results", "ansible.builtin.copy": {
                "dest": str(result), "mode": "0644",
                "content": "{{ {'info': info, 'started': started, 'snap': snap, 'rolled': rolled, "
                           "'deleted': deleted} | to_json }}"}},
        ],
    }]
    path = tmp_path / "drive.yml"
    path.write_text(yaml.safe_dump(playbook, sort_keys=False))
    proc = subprocess.run([tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(path)], cwd=ROOT,
                          env=ansible_environment(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    got = json.loads(result.read_text())
    [vm] = got["info"]["proxmox_vms"]
    assert (vm["vmid"], vm["status"], vm["config"]["lxc"][1]) == (200, "stopped", ["lxc.cgroup2.devices.allow",
                                                                                  "c 238:* rwm"])
    assert got["started"]["changed"] and got["started"]["msg"] == "VM ct200 (200) started."
    assert got["snap"]["msg"] == "Snapshot dflash-test-1 created"
    assert got["rolled"]["msg"] == "Snapshot dflash-test-1 rolled back"
    assert got["deleted"]["msg"] == "Snapshot dflash-test-1 removed"
    assert pve.backend.calls == ["start ct200", "stop ct200"]  # the rollback stopped it; the module does not start


# --------------------------------------------------------------------------- the command line


def test_command_line_daemon_is_standard_library_only_and_stops_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # -S: no site-packages, so anything beyond the standard library would fail to import.
    argv = [sys.executable, "-S", str(ROOT / "lab" / "pve" / "api.py"), "--state-dir", str(state),
            "--listen", ADDRESS, "--port", "0"]
    daemon = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = daemon.stdout.readline()
        match = re.search(rf"listening on https://{re.escape(ADDRESS)}:(\d+)/api2/json \(node pve1", line)
        assert match, line + daemon.stderr.read()
        port = match[1]
        token = json.loads((state / "pve" / "api-token.json").read_text())
        answer = requests.get(f"https://{ADDRESS}:{port}/api2/json/nodes/pve1/lxc", timeout=30,
                              verify=str(state / "pve" / "tls" / "ca.crt"),
                              headers={"Authorization": f"PVEAPIToken={token['full-tokenid']}={token['value']}"})
        assert answer.json() == {"data": []}
        second = subprocess.run([*argv[:-1], port], capture_output=True, text=True)
        assert second.returncode == 1 and f"cannot listen on {ADDRESS}:{port}" in second.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait() == 0
        daemon.stdout.close()
        daemon.stderr.close()
    assert os.stat(state / "pve" / "tls" / "ca.key").st_mode & 0o777 == 0o600
