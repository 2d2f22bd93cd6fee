"""The lab's pct stand-in (lab/pve/pct + lab/pve/pctd.py), the node's LXC configs, and the via_pct settings.

The client and daemon run here for real: the daemon's Proxmox id 200 maps to this test process, so
`pct exec 200` enters this process's own namespaces with nsenter (root only) and the bytes, argument
vectors and exit statuses travel exactly as they do between pve1 and a lab container.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.plugins.shell.sh import ShellModule
from ansible_collections.community.proxmox.plugins.connection import proxmox_pct_remote

from helpers import ROOT, ansible_environment, run, tool

sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / "lab" / "pve"))
import labctl
import pctd

PCT = ROOT / "lab" / "pve" / "pct"
CT200 = next(c for c in labctl.CONTAINERS if c.name == "ct200")
CT129 = next(c for c in labctl.CONTAINERS if c.name == "ct129")
PRIVATE_ADDRESS = re.compile(r"\b(10\.\d+|172\.(1[6-9]|2\d|3[01])|192\.168)\.\d+\.\d+\b")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pct exec enters namespaces with nsenter (root only)")


# --------------------------------------------------------------------------- the node's /etc/pve


def test_uvm_major_comes_from_the_real_proc_devices_capture() -> None:
    text = labctl.PROC_DEVICES_FIXTURE.read_text()
    assert labctl.char_major(text, "nvidia-uvm") == 238
    assert labctl.char_major(text, "nvidiactl") == labctl.NVIDIA_MAJOR
    assert labctl.char_major(text, "nvidia-frontend") is None
    # Block devices share numbers with character devices; only the character section counts.
    assert labctl.char_major("Character devices:\n  1 mem\n\nBlock devices:\n253 zram\n", "zram") is None


def test_lxc_config_has_the_passthrough_lines_for_each_gpu() -> None:
    text = labctl.lxc_config(CT200, 8, 238)
    options, lxc, description = pctd.parse_config(text)
    assert options["hostname"] == "ct200" and options["ostype"] == "debian"
    assert list(options) == sorted(options), "Proxmox writes the options sorted by key"
    assert lxc[:2] == [("lxc.cgroup2.devices.allow", "c 195:* rwm"), ("lxc.cgroup2.devices.allow", "c 238:* rwm")]
    assert [value.split()[0] for key, value in lxc[2:]] == \
        [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert all(key == "lxc.mount.entry" and value.endswith(" none bind,optional,create=file")
               for key, value in lxc[2:])
    assert "CT200" in description
    assert not PRIVATE_ADDRESS.search(text)
    two = pctd.parse_config(labctl.lxc_config(CT129, 2, 511))[1]
    assert ("lxc.cgroup2.devices.allow", "c 511:* rwm") in two and len(two) == 2 + 2 + 3


def test_pct_config_prints_like_pct() -> None:
    text = ("#first line: with colon\n#second\narch: amd64\nhostname: ct200\ndigest: abc\n"
            "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
            "lxc.cgroup2.devices.allow: c 195:* rwm\ncores: 4\n\n[snap1]\nhostname: old\n")
    assert pctd.format_config(text) == (
        "arch: amd64\ncores: 4\ndescription: first line%3A with colon%0Asecond%0A\nhostname: ct200\n"
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\n")
    assert pctd.decode_text(labctl.encode_text("a: b\nc%")) == "a: b\nc%"


def test_pct_list_prints_like_pct() -> None:
    assert pctd.format_list([]) == ""
    out = pctd.format_list([(200, "running", "", "ct200"), (129, "stopped", "backup", "ct129")])
    assert out.splitlines() == [
        "VMID       Status     Lock         Name                ",
        "129        stopped    backup       ct129               ",
        "200        running                 ct200               ",
    ]


@pytest.mark.parametrize(("args", "expected"), [
    (["--", "ls", "-l"], (True, ["ls", "-l"])),
    (["ls", "--", "-l"], (True, ["ls", "--", "-l"])),
    (["--keep-env", "0", "--", "env"], (False, ["env"])),
    (["--keep-env=1", "env"], (True, ["env"])),
    (["--"], (True, [])),
])
def test_exec_arguments_split_like_pct(args: list[str], expected: tuple[bool, list[str]]) -> None:
    assert pctd.split_exec_args(args) == expected


@pytest.mark.parametrize(("args", "message"), [
    (["--bogus", "--", "true"], "bogus: property is not defined"),
    (["--keep-env", "maybe", "--", "true"], "keep-env: type check ('boolean') failed - got 'maybe'"),
])
def test_bad_exec_options_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(pctd.PctError, match=re.escape(message)):
        pctd.split_exec_args(args)


def test_vmids_are_checked_like_pve() -> None:
    assert pctd.parse_vmid("200") == 200
    with pytest.raises(pctd.PctError, match=r"type check \('integer'\) failed - got 'ct200'"):
        pctd.parse_vmid("ct200")
    with pytest.raises(pctd.PctError, match="does not look like a valid VM ID"):
        pctd.parse_vmid("99")


def test_keep_env_passes_the_session_environment_with_pcts_path() -> None:
    env = pctd.exec_environment({"HOME": "/root", "PATH": "/x", "SSL_CERT_FILE": "/c"}, keep_env=True)
    assert env == {"HOME": "/root", "PATH": "/sbin:/bin:/usr/sbin:/usr/bin"}
    assert pctd.exec_environment({"HOME": "/root"}, keep_env=False)["PATH"] == labctl.CONTAINER_PATH


# --------------------------------------------------------------------------- client and daemon


@pytest.fixture()
def node() -> Iterator[SimpleNamespace]:
    """A running pct daemon: 200 -> this process (running), 129 -> stopped, over a fresh /etc/pve."""
    folder = Path(tempfile.mkdtemp(prefix="pctd-"))  # short: unix socket paths are limited to 108 bytes
    lxc = folder / "etc-pve" / "nodes" / "pve1" / "lxc"
    lxc.mkdir(parents=True)
    (lxc / "200.conf").write_text(labctl.lxc_config(CT200, 8, 238))
    (lxc / "129.conf").write_text(labctl.lxc_config(CT129, 2, 238))
    me = os.getpid()
    resolve = {200: me}.get
    server = pctd.Server(folder / "pctd.sock", pctd.Node(etc_pve=folder / "etc-pve", name="pve1", resolve=resolve))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(socket=folder / "pctd.sock", folder=folder, lxc=lxc)
    finally:
        server.shutdown()
        server.server_close()
        subprocess.run(["rm", "-rf", str(folder)], check=True)


def pct(node: SimpleNamespace, *args: str, data: bytes | None = None, **kwargs) -> subprocess.CompletedProcess:
    """The pct client, as the node runs it, against the test's daemon."""
    env = dict(os.environ, PCT_STANDIN_SOCKET=str(node.socket), **kwargs.pop("env", {}))
    return subprocess.run([sys.executable, str(PCT), *args], env=env, input=data, capture_output=True, **kwargs)


def node_shell(node: SimpleNamespace, vmid: int, command: str,
               data: bytes | None = None) -> subprocess.CompletedProcess:
    """What the connection plugin does: its `pct exec` string, parsed by the node's login shell (bash)."""
    fake = SimpleNamespace(get_option={"vmid": vmid, "remote_user": "root"}.__getitem__)
    line = proxmox_pct_remote.Connection._build_pct_command(fake, command)
    assert line.startswith(f"/usr/sbin/pct exec {vmid} -- ")
    line = line.replace("/usr/sbin/pct", f"{shlex.quote(sys.executable)} {shlex.quote(str(PCT))}", 1)
    env = dict(os.environ, PCT_STANDIN_SOCKET=str(node.socket))
    return subprocess.run(["bash", "-c", line], env=env, input=data, capture_output=True)


@needs_root
def test_plugin_command_strings_arrive_intact(node: SimpleNamespace) -> None:
    quote = ShellModule().quote
    args = ["it's", 'a "quoted" word', "$HOME `id` $(id) ${PATH}", "line one\nline two\n", "  spaces  ", "", "*"]
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    command = " ".join(quote(a) for a in [sys.executable, "-c", script, *args])
    proc = node_shell(node, 200, command)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == args
    # put_file's own form: `sh -c 'cat > path'` with the path quoted inside.
    target = node.folder / "dir with space" / "it's $x"
    target.parent.mkdir()
    put = node_shell(node, 200, " ".join(["/bin/sh", "-c", quote(f"cat > {quote(str(target))}")]), data=b"a\nb")
    assert put.returncode == 0, put.stderr
    assert target.read_bytes() == b"a\nb"


@needs_root
def test_exit_statuses_and_streams_propagate(node: SimpleNamespace) -> None:
    proc = node_shell(node, 200, "/bin/sh -c " + shlex.quote("echo out; echo err >&2; exit 7"))
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, b"out\n", b"err\n")
    killed = pct(node, "exec", "200", "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + signal.SIGTERM
    missing = pct(node, "exec", "200", "--", "/no/such/program")
    assert missing.returncode != 0 and b"/no/such/program" in missing.stderr


@needs_root
def test_megabytes_pass_through_stdin_and_stdout(node: SimpleNamespace) -> None:
    data = os.urandom(5 * 1024 * 1024)
    digest = pct(node, "exec", "200", "--", "sha256sum", data=data)
    assert digest.returncode == 0 and digest.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    echo = pct(node, "exec", "200", "--", "cat", data=data)
    assert echo.returncode == 0 and echo.stdout == data


@needs_root
def test_environment_and_working_directory_follow_pct(node: SimpleNamespace) -> None:
    kept = pct(node, "exec", "200", "--", "sh", "-c", "echo $MARKER:$PATH", env={"MARKER": "m1"}, text=True)
    assert kept.stdout == "m1:/sbin:/bin:/usr/sbin:/usr/bin\n"
    cleared = pct(node, "exec", "200", "--keep-env", "0", "--", "sh", "-c", "echo ${MARKER:-none}",
                  env={"MARKER": "m1"}, text=True)
    assert cleared.stdout == "none\n"
    here = pct(node, "exec", "200", "--", "pwd", cwd=node.lxc, text=True)
    assert here.stdout == f"{node.lxc}\n"


@needs_root
def test_a_command_is_hung_up_when_its_client_goes_away(node: SimpleNamespace) -> None:
    pidfile = node.folder / "child.pid"
    env = dict(os.environ, PCT_STANDIN_SOCKET=str(node.socket))
    client = subprocess.Popen([sys.executable, str(PCT), "exec", "200", "--", "sh", "-c",
                               f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 600"],
                              env=env, stdout=subprocess.PIPE)
    assert client.stdout is not None
    while not pidfile.exists():  # the command writes its pid, then sleeps
        assert client.poll() is None, "the client ended before the command started"
        select.select([], [], [], 0.05)
    child = int(pidfile.read_text())
    pidfd = os.pidfd_open(child)
    client.kill()
    client.wait()
    try:
        assert select.select([pidfd], [], [], 30)[0], f"command {child} still runs after its client went away"
    finally:
        os.close(pidfd)


def test_pct_errors_match_pct(node: SimpleNamespace) -> None:
    unknown = pct(node, "exec", "999", "--", "true", text=True)
    assert (unknown.returncode, unknown.stderr) == \
        (255, "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n")
    stopped = pct(node, "exec", "129", "--", "true", text=True)
    assert (stopped.returncode, stopped.stderr) == (255, "container '129' not running!\n")
    nothing = pct(node, "exec", "200", text=True)
    assert (nothing.returncode, nothing.stderr) == (255, "missing command\n")
    other = pct(node, "migrate", "200", "pve2", text=True)
    assert other.returncode == 255 and "unknown command 'pct migrate'" in other.stderr


def test_status_list_and_config(node: SimpleNamespace) -> None:
    assert pct(node, "status", "200", text=True).stdout == "status: running\n"
    assert pct(node, "status", "129", text=True).stdout == "status: stopped\n"
    rows = [line.split() for line in pct(node, "list", text=True).stdout.splitlines()]
    assert rows == [["VMID", "Status", "Lock", "Name"], ["129", "stopped", "ct129"], ["200", "running", "ct200"]]
    config = pct(node, "config", "200", text=True)
    assert config.returncode == 0
    assert config.stdout == pctd.format_config((node.lxc / "200.conf").read_text())


def test_client_without_daemon_says_what_to_do(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(PCT), "status", "200"], capture_output=True, text=True,
                          env=dict(os.environ, PCT_STANDIN_SOCKET=str(tmp_path / "absent.sock")))
    assert proc.returncode == 255
    assert "pct daemon does not answer" in proc.stderr and "labctl.py up" in proc.stderr


# --------------------------------------------------------------------------- via_pct settings


def plugin_option_vars() -> dict[str, list[str]]:
    """Option name -> the variables that set it, from the connection plugin's own documentation."""
    doc = yaml.safe_load(proxmox_pct_remote.DOCUMENTATION)
    return {name: [v["name"] for v in spec.get("vars", [])] for name, spec in doc["options"].items()}


def test_production_via_pct_settings_use_the_plugins_variables() -> None:
    settings = yaml.safe_load((ROOT / "inventory" / "production" / "group_vars" / "via_pct.yml").read_text())
    options = plugin_option_vars()
    assert settings["ansible_connection"] == "community.proxmox.proxmox_pct_remote"
    assert "ansible_paramiko_host" in options["remote_addr"] and "ansible_user" in options["remote_user"]
    assert "proxmox_vmid" in options["vmid"] and "ansible_ssh_private_key_file" in options["private_key_file"]
    assert "ansible_host" not in settings, "ansible_host must stay the container's own name"
    assert (ROOT / "inventory" / "lab-pct" / "group_vars" / "via_pct.yml").resolve() == \
        (ROOT / "inventory" / "production" / "group_vars" / "via_pct.yml").resolve()


def test_the_node_address_wins_for_the_pct_connection_only() -> None:
    # Ansible's own option resolution (in a child: the plugin loader's collection finder is global state).
    code = (
        "from ansible.plugins.loader import init_plugin_loader, connection_loader\n"
        "from ansible.playbook.play_context import PlayContext\n"
        "init_plugin_loader()\n"
        "c = connection_loader.get('community.proxmox.proxmox_pct_remote', PlayContext(), None)\n"
        "c.set_options(var_options={'inventory_hostname': 'ct200', 'ansible_host': 'ct200.internal',\n"
        "    'ansible_paramiko_host': 'pve1.internal', 'proxmox_vmid': 200, 'ansible_user': 'root'})\n"
        "print(c.get_option('remote_addr'), c.get_option('remote_user'), c._build_pct_command('true'))\n"
    )
    proc = run([sys.executable, "-c", code], env=ansible_environment())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "pve1.internal root /usr/sbin/pct exec 200 -- true"


def test_production_inventory_puts_a_via_pct_container_behind_its_node(tmp_path: Path) -> None:
    extra = tmp_path / "via_pct.yml"
    extra.write_text("all:\n  children:\n    proxmox_containers:\n      children:\n"
                     "        via_pct:\n          hosts:\n            ct200: {}\n")
    proc = run([tool("ansible"), "-i", str(ROOT / "inventory" / "production"), "-i", str(extra), "ct200",
                "-m", "ansible.builtin.debug", "-a",
                "msg={{ [ansible_connection, ansible_paramiko_host, ansible_host, proxmox_vmid] }}"],
               env=dict(ansible_environment(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["ct200"]
    assert result["msg"] == ["community.proxmox.proxmox_pct_remote", "pve1.internal", "ct200.internal", 200]
