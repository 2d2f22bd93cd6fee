"""The proxmox_guest role's logic (dflash_infra/proxmox.py, filter_plugins/proxmox.py): container configs from
the file and from the API, the NVIDIA passthrough audit and its fix, snapshot names, retention and rollback
choice. Inputs are real: Proxmox container configs and device listings from public-captures.md section 5, the
H200 test machine's /proc/devices, and API answers in the shapes pve-container returns (sources noted below).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from datetime import UTC, datetime

import pytest
import yaml

from capture_fixtures import NVIDIA, block, output
from dflash_infra import proxmox
from dflash_infra.parsers import parse_proc_devices
from helpers import ROOT, run, tool

sys.path.insert(0, str(ROOT / "filter_plugins"))
import proxmox as proxmox_filters

H200_DEVICES_TEXT = (NVIDIA / "h200-device-run" / "proc-devices.txt").read_text()
H200 = parse_proc_devices(H200_DEVICES_TEXT, "pve1:/proc/devices")
ALLOW = "lxc.cgroup2.devices.allow"
MOUNT = "lxc.mount.entry"

# GET /nodes/{node}/lxc/{vmid}/config as a PVE 8.4 cluster answered it (recorded in a public test suite of a
# Proxmox config watcher, identifiers neutralised there): plain options with LXC memory as a NUMBER, the raw
# keys as `"lxc": [[key, value], ...]` (pve-container API2/LXC/Config.pm: "Array of lxc low-level
# configurations ([[key1, value1], [key2, value2] ...])"), and the file's SHA-1 as digest.
RECORDED_CONFIG = {"data": {
    "hostname": "web01", "arch": "amd64", "cores": 2, "memory": 4096, "swap": 512,
    "rootfs": "local-zfs:subvol-201-disk-0,size=8G",
    "net0": "name=eth0,bridge=vmbr0,gw=192.0.2.1,hwaddr=02:00:00:00:02:01,ip=192.0.2.10/24,type=veth",
    "features": "nesting=1", "onboot": 1, "ostype": "debian", "tags": " ",
    "lxc": [["lxc.cgroup2.devices.allow", "a"], ["lxc.mount.entry", "/dev/net dev/net none bind,create=dir"]],
    "digest": "aaa111",
}}

# GET /nodes/{node}/lxc/{vmid}/snapshot: pve-container API2/LXC/Snapshot.pm pushes one item per snapshot
# {name, snaptime, description, parent?} and then the running state {name: current, digest, running, parent?}.
SNAPSHOTS = [
    {"name": "dflash-align-20261120-101500", "snaptime": 1795170900, "description": "dflash-infra: before stage align"},
    {"name": "before-upgrade", "snaptime": 1795000000, "description": "", "parent": "dflash-align-20261120-101500"},
    {"name": "dflash-serve-20261121-080000", "snaptime": 1795248000, "description": "",
     "parent": "dflash-align-20261120-101500"},
    {"name": "dflash-align-20261125-093000", "snaptime": 1795599000, "description": "",
     "parent": "dflash-serve-20261121-080000"},
    {"name": "current", "digest": "f" * 40, "running": 1, "parent": "dflash-align-20261125-093000"},
]


def proc_devices_from_listing(listing: str) -> str:
    """The /proc/devices lines behind the NVIDIA nodes of an `ls -l /dev/nv*` listing.

    The kernel registers nvidia<N> and nvidiactl under 'nvidia'/'nvidiactl', the uvm nodes under
    'nvidia-uvm', the capability nodes under 'nvidia-caps' (public-captures.md 5.9); the listing shows the
    majors. Other devices (e.g. /dev/nvram) are left out: this is the NVIDIA part of the host only.
    """
    names: dict[str, int] = {}
    for line in listing.splitlines():
        match = re.match(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*\d+\s.*?(\S+)$", line)
        if not match or "nvidia" not in match[2]:
            continue
        node = match[2].rsplit("/", 1)[-1]
        name = "nvidia" if re.fullmatch(r"nvidia\d+", node) else "nvidia-caps" if node.startswith("nvidia-cap") \
            else "nvidia-uvm" if node.startswith("nvidia-uvm") else node
        names.setdefault(name, int(match[1]))
    return "Character devices:\n" + "".join(f"{major:3d} {name}\n" for name, major in names.items())


def lines(conf: str) -> list[str]:
    return [line for line in conf.splitlines() if line.startswith(("lxc.", "dev"))]


def lab_conf(uvm: int = 238, gpus: int = 8) -> str:
    """A container config as the lab node writes it (Proxmox's layout: comment, sorted options, raw lines)."""
    head = ("#Lab stand-in of CT200 (group pro6000); dflash-infra lab/README.md\narch: amd64\ncores: 8\n"
            "hostname: ct200\nmemory: 16384\nostype: debian\nrootfs: local-lvm:vm-200-disk-0,size=64G\nswap: 0\n")
    raw = [f"{ALLOW}: c 195:* rwm", f"{ALLOW}: c {uvm}:* rwm"]
    raw += [f"{MOUNT}: /dev/{d} dev/{d} none bind,optional,create=file"
            for d in [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]]
    return head + "".join(f"{line}\n" for line in raw)


# --------------------------------------------------------------------------- configs


def test_conf_file_main_section_of_a_real_config() -> None:
    text = output("5.3")  # `cat /etc/pve/lxc/2051.conf` of a Frigate container
    config = proxmox.parse_lxc_conf(text, "2051.conf")
    assert config.options["hostname"] == "frigatelxc"
    assert config.options["unprivileged"] == "1"
    assert config.raw[0] == ("lxc.idmap", "u 0 100000 1000")
    assert [k for k, _ in config.raw].count(MOUNT) == 4
    assert config.digest == hashlib.sha1(text.encode()).hexdigest()


def test_conf_file_skips_snapshot_sections_and_reads_description_comments() -> None:
    text = lab_conf() + "\n[dflash-align-20261129-134743]\n#dflash-infra%3A before stage align\narch: amd64\n" \
                        f"{ALLOW}: c 511:* rwm\nsnaptime: 1795960065\n"
    config = proxmox.parse_lxc_conf(text)
    assert config.options["description"].startswith("Lab stand-in of CT200")
    assert "snaptime" not in config.options
    assert (ALLOW, "c 511:* rwm") not in config.raw and (ALLOW, "c 238:* rwm") in config.raw


def test_conf_file_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(proxmox.ProxmoxError, match=r"line 1: expected '<key>: <value>'.*container config"):
        proxmox.parse_lxc_conf("crw-rw-rw- 1 root root 195, 0 /dev/nvidia0\n", "listing")


def test_api_config_shape_recorded_from_a_real_cluster() -> None:
    config = proxmox.config_from_api(RECORDED_CONFIG)
    assert config.raw == [(ALLOW, "a"), (MOUNT, "/dev/net dev/net none bind,create=dir")]
    assert config.options["memory"] == "4096" and config.digest == "aaa111"
    assert proxmox.config_from_api(RECORDED_CONFIG["data"]).raw == config.raw  # with or without the envelope


def test_api_config_and_file_agree_on_the_raw_lines() -> None:
    text = output("5.3")
    from_file = proxmox.parse_lxc_conf(text)
    api_shape = {**{k: v for k, v in from_file.options.items()}, "lxc": [list(p) for p in from_file.raw],
                 "digest": from_file.digest}
    assert proxmox.config_from_api(api_shape).raw == from_file.raw


@pytest.mark.parametrize("lxc", ["lxc.cgroup2.devices.allow: a", [["only-a-key"]], {"lxc.mount.entry": "x"}])
def test_api_config_with_raw_keys_in_another_shape_is_refused(lxc: object) -> None:
    with pytest.raises(proxmox.ProxmoxError, match=r"expected 'lxc' as a list of \[key, value\] pairs"):
        proxmox.config_from_api({"hostname": "ct200", "lxc": lxc})


# --------------------------------------------------------------------------- the node's majors


def test_h200_node_majors() -> None:
    majors = proxmox.node_majors(H200, "pve1")
    assert majors.to_dict() == {"nvidia": 195, "uvm": 238, "caps": 241}


def test_pre_550_nvidia_frontend_name() -> None:
    # public-captures.md 5.9 B: `grep nvidia /proc/devices` (the author's trailing comment is not /proc output).
    text = "".join(line.split("#")[0].rstrip() + "\n" for line in output("5.9", 1, "nvidia /proc/devices").splitlines())
    majors = proxmox.node_majors(parse_proc_devices(text), "node")
    assert (majors.nvidia, majors.uvm, majors.caps) == (195, 508, None)


def test_caps_major_is_the_exact_name_not_imex_channels() -> None:
    # public-captures.md 5.9 D, with the author's '...' elisions left out.
    text = "".join(line + "\n" for line in block("5.9", 3).splitlines()[1:] if line != "...")
    text += "195 nvidia\n195 nvidiactl\n510 nvidia-uvm\n"
    assert proxmox.node_majors(parse_proc_devices(text)).caps == 511


def test_node_without_nvidia_uvm_says_how_to_load_it() -> None:
    text = H200_DEVICES_TEXT.replace("238 nvidia-uvm\n", "")
    with pytest.raises(proxmox.ProxmoxError, match=r"expected 'nvidia-uvm' in pve1's .*nvidia-modprobe -u -c0"):
        proxmox.node_majors(parse_proc_devices(text), "pve1")


def test_node_without_the_driver_is_refused() -> None:
    with pytest.raises(proxmox.ProxmoxError, match=r"expected the NVIDIA driver's 'nvidia'/'nvidiactl'"):
        proxmox.node_majors(parse_proc_devices("Character devices:\n  1 mem\n"), "pve1")


def test_expected_block_for_eight_gpus_on_the_h200_node() -> None:
    majors = proxmox.node_majors(H200)
    expected = proxmox.expected_lines(majors, range(8), include_caps=False)
    assert expected[:2] == [f"{ALLOW}: c 195:* rwm", f"{ALLOW}: c 238:* rwm"]
    assert expected[2] == f"{MOUNT}: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"
    assert [line.split()[1] for line in expected[2:]] == \
        [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    with_caps = proxmox.expected_lines(majors, range(8), include_caps=True)
    assert f"{ALLOW}: c 241:* rwm" in with_caps
    assert with_caps[-1] == f"{MOUNT}: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"


# --------------------------------------------------------------------------- audit


def test_uvm_major_moved_after_a_reboot_5_4() -> None:
    # The host after its reboot: `ls -la /dev/nvidia-uvm` says 235 (block 0), nvidiactl is 195 (block 3);
    # the config still allowed 234 (block 1).
    node = parse_proc_devices(proc_devices_from_listing(block("5.4", 0) + block("5.4", 3)), "5.4 host")
    before = proxmox.parse_lxc_conf(block("5.4", 1))
    audit = proxmox.audit_passthrough(before, node, [0], guest="CT100", node="Proxmox")
    assert audit.status == "drift"
    assert audit.missing[0].line == f"{ALLOW}: c 235:* rwm"
    assert "nvidia-uvm (235:0), nvidia-uvm-tools (235:1)" in audit.missing[0].reason
    stale = {f.line: f.reason for f in audit.stale}
    assert "not registered on Proxmox" in stale[f"{ALLOW}: c 234:* rwm"]
    assert "nvidia-uvm is 235 now" in stale[f"{ALLOW}: c 234:* rwm"]
    after = proxmox.parse_lxc_conf(block("5.4", 2))  # the author's sed to 235
    assert [f for f in proxmox.audit_passthrough(after, node, [0]).missing if f.line.startswith(ALLOW)] == []


def test_uvm_major_alternating_between_boots_5_5() -> None:
    # One boot: uvm 509, caps 234 (host listing, block 0); another: uvm 511 (inside the container, block 1).
    # The guide's 101.conf allows both (block 2); against each boot the other one is stale.
    conf = proxmox.parse_lxc_conf(block("5.5", 2))
    for listing, current, stale in ((block("5.5", 0), 509, 511), (block("5.5", 1), 511, 509)):
        node = parse_proc_devices(proc_devices_from_listing(listing), "mercury:/proc/devices")
        audit = proxmox.audit_passthrough(conf, node, [0], guest="docker1", node="mercury")
        assert [f.line for f in audit.stale] == [f"{ALLOW}: c {stale}:* rwm"]
        assert audit.missing == []
        assert f"nvidia-uvm is {current} now" in audit.stale[0].reason


def test_real_configs_against_the_h200_node() -> None:
    # 5.6: 250.conf additions with uvm 507 and only nvidia0 + nvidiactl mounted.
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(block("5.6", 1)), H200, [0], node="pve1")
    assert [f.line for f in audit.stale] == [f"{ALLOW}: c 507:* rwm"]
    assert [f.line.split()[1] for f in audit.missing] == ["c", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    # 5.7: two candidate uvm majors (506, 509), the caps folder already mounted, Coral and dri passed too.
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(block("5.7", 0)), H200, [0], include_caps=True)
    assert {f.line for f in audit.stale} == {f"{ALLOW}: c 506:* rwm", f"{ALLOW}: c 509:* rwm"}
    assert [f.line for f in audit.missing] == [f"{ALLOW}: c 238:* rwm", f"{ALLOW}: c 241:* rwm"]


def test_relocated_nodes_and_other_devices_are_left_alone_5_3() -> None:
    config = proxmox.parse_lxc_conf(output("5.3"))
    audit = proxmox.audit_passthrough(config, H200, [0, 1], guest="frigatelxc", node="pve1")
    assert audit.stale == []  # Coral's c 120:N (a static major the node does not register) is not ours
    assert any("major 120" in w and "left as is" in w for w in audit.warnings)
    assert any("mounted from /lxc/102010/devices/nvidia0" in w for w in audit.warnings)
    # Per-GPU rules c 195:0 / 195:1 do not cover nvidiactl (195:255).
    assert audit.missing[0].line == f"{ALLOW}: c 195:* rwm" and "nvidiactl (195:255)" in audit.missing[0].reason
    assert {f.line.split()[1] for f in audit.missing if f.line.startswith(MOUNT)} == \
        {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}


def test_matching_config_is_ok() -> None:
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(lab_conf()), H200, range(8), guest="ct200", node="pve1")
    assert audit.status == "ok" and audit.warnings == []
    assert audit.report() == ["ct200: NVIDIA passthrough matches pve1 (nvidia 195, nvidia-uvm 238, GPUs 0-7)"]


def test_dynamic_major_of_another_device_is_a_warning_not_a_removal() -> None:
    conf = lab_conf() + f"{ALLOW}: c 243:* rwm\n"  # 243 is hidraw on the H200 node
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(conf), H200, range(8))
    assert audit.status == "ok"
    assert any("registers major 243 as hidraw" in w for w in audit.warnings)


def test_gpus_outside_the_container_set_and_duplicates_are_stale() -> None:
    conf = lab_conf(gpus=2) + (f"{ALLOW}: c 195:* rwm\n"
                               f"{MOUNT}: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file\n")
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(conf), H200, [0, 1])
    assert [f.reason for f in audit.stale] == ["duplicate of an earlier rule",
                                              "GPU 2 is not one of this container's GPUs (0,1)"]


def test_dev_options_count_as_passthrough() -> None:
    conf = ("hostname: ct\ndev0: /dev/nvidia0\ndev1: path=/dev/nvidiactl,mode=0666\ndev2: /dev/nvidia-uvm\n"
            "dev3: /dev/nvidia-uvm-tools\n")
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(conf), H200, [0])
    assert audit.status == "ok"


def test_allow_all_rule_covers_every_device_and_cgroup_v1_is_only_a_warning() -> None:
    conf = lab_conf().replace(f"{ALLOW}: c 238:* rwm\n", f"{ALLOW}: a\nlxc.cgroup.devices.allow: c 238:* rwm\n")
    audit = proxmox.audit_passthrough(proxmox.parse_lxc_conf(conf), H200, range(8))
    assert audit.status == "ok"
    assert any("cgroup v1 rule" in w for w in audit.warnings)


def test_audit_refuses_repeated_gpu_indexes() -> None:
    with pytest.raises(proxmox.ProxmoxError, match=r"distinct GPU indexes"):
        proxmox.audit_passthrough(proxmox.parse_lxc_conf(lab_conf()), H200, [0, 0])


# --------------------------------------------------------------------------- the fix


def test_fix_of_the_injected_uvm_drift_restores_the_lab_config() -> None:
    good = lab_conf()
    drifted = good.replace("c 238:* rwm", "c 511:* rwm")
    fix = proxmox.fix_conf_text(drifted, H200, range(8), path="pve1:/etc/pve/lxc/200.conf")
    assert fix.text == good
    assert [d for d in fix.diff if d[:1] in "+-" and d[:3] not in ("+++", "---")] == \
        [f"-{ALLOW}: c 511:* rwm", f"+{ALLOW}: c 238:* rwm"]
    assert fix.diff[0] == "--- pve1:/etc/pve/lxc/200.conf"
    again = proxmox.fix_conf_text(fix.text, H200, range(8))
    assert not again.changed and again.text == fix.text and again.audit.status == "ok"


def test_fix_edits_only_the_main_section() -> None:
    snapshot = f"\n[dflash-align-20261129-134743]\n{ALLOW}: c 511:* rwm\nsnaptime: 1795960065\n"
    drifted = lab_conf().replace("c 238:* rwm", "c 511:* rwm") + snapshot
    fix = proxmox.fix_conf_text(drifted, H200, range(8))
    assert fix.text.endswith(snapshot)
    assert fix.text.count("c 511:* rwm") == 1 and fix.text.index("c 238:* rwm") < fix.text.index("[dflash-align")


def test_fix_groups_new_lines_with_their_kind_5_6() -> None:
    fix = proxmox.fix_conf_text(block("5.6", 1), H200, [0])
    new = fix.text.splitlines()
    assert new[:2] == [f"{ALLOW}: c 195:* rwm", f"{ALLOW}: c 238:* rwm"]
    assert [line.split()[1] for line in new[2:]] == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                                     "/dev/nvidia-uvm-tools"]


def test_fix_refuses_a_file_that_is_not_the_config_the_api_returned() -> None:
    drifted = lab_conf().replace("c 238:* rwm", "c 511:* rwm")
    request = {"conf_text": drifted, "conf_path": "pve1:/etc/pve/lxc/200.conf", "proc_devices": H200_DEVICES_TEXT,
               "gpu_count": 8, "guest": "ct200", "node": "pve1"}
    with pytest.raises(proxmox.ProxmoxError, match=r"expected pve1:/etc/pve/lxc/200.conf to be the config the API "
                                                   r"returned \(digest 0+\).*Run the audit again"):
        proxmox.fix_request({**request, "api_digest": "0" * 40})
    fixed = proxmox.fix_request({**request, "api_digest": hashlib.sha1(drifted.encode()).hexdigest()})
    assert fixed.changed and "c 238:* rwm" in fixed.text


# --------------------------------------------------------------------------- snapshots


def test_snapshot_name() -> None:
    when = datetime(2026, 11, 29, 13, 36, 12, tzinfo=UTC)
    assert proxmox.snapshot_name("dflash", "align", when) == "dflash-align-20261129-133612"
    assert proxmox.snapshot_name("dflash", "engine-upgrade", "2026-11-29T13:36:12Z") == \
        "dflash-engine-upgrade-20261129-133612"


@pytest.mark.parametrize("stage, message", [
    ("", "expected a stage name"), ("Align", "expected a stage name"), ("align driver", "expected a stage name"),
    ("a-very-long-stage-name-for-proxmox", "at most 40 characters"),
])
def test_snapshot_name_refused(stage: str, message: str) -> None:
    with pytest.raises(proxmox.ProxmoxError, match=message):
        proxmox.snapshot_name("dflash", stage, "2026-11-29T13:36:12Z")


def test_prune_keeps_the_newest_of_ours_and_never_touches_others() -> None:
    assert proxmox.snapshots_to_prune(SNAPSHOTS, "dflash", 2) == ["dflash-align-20261120-101500"]
    assert proxmox.snapshots_to_prune(SNAPSHOTS, "dflash", 1) == ["dflash-align-20261120-101500",
                                                                  "dflash-serve-20261121-080000"]
    assert proxmox.snapshots_to_prune(SNAPSHOTS, "dflash", 3) == []
    with pytest.raises(proxmox.ProxmoxError, match=r"proxmox_guest_snapshot_keep >= 1"):
        proxmox.snapshots_to_prune(SNAPSHOTS, "dflash", 0)


def test_rollback_target() -> None:
    assert proxmox.rollback_target(SNAPSHOTS, "dflash") == \
        {"name": "dflash-align-20261125-093000", "reason": "newest dflash snapshot"}
    assert proxmox.rollback_target(SNAPSHOTS, "dflash", recorded="dflash-serve-20261121-080000")["name"] == \
        "dflash-serve-20261121-080000"
    gone = proxmox.rollback_target(SNAPSHOTS, "dflash", recorded="dflash-align-20261101-000000")
    assert gone["name"] == "dflash-align-20261125-093000" and "no longer exists" in gone["reason"]
    assert proxmox.rollback_target(SNAPSHOTS, "dflash", requested="before-upgrade")["reason"] == "requested"
    with pytest.raises(proxmox.ProxmoxError, match=r"expected a snapshot named 'nope', found dflash-align"):
        proxmox.rollback_target(SNAPSHOTS, "dflash", requested="nope", guest="ct129")
    with pytest.raises(proxmox.ProxmoxError, match=r"expected a 'dflash-\*' snapshot to roll back to, found "
                                                   r"before-upgrade\. Take one with playbooks/proxmox_snapshot.yml"):
        proxmox.rollback_target([SNAPSHOTS[1], SNAPSHOTS[-1]], "dflash", guest="ct129")


# --------------------------------------------------------------------------- filters and the role's interface


def test_filters_are_thin_adapters_and_errors_read_as_the_play_s() -> None:
    from ansible.errors import AnsibleFilterError

    filters = proxmox_filters.FilterModule().filters()
    config = {"hostname": "ct200", "lxc": [list(p) for p in proxmox.parse_lxc_conf(lab_conf(511)).raw]}
    audit = filters["proxmox_guest_audit"]({"config": {"data": config}, "proc_devices": H200_DEVICES_TEXT,
                                            "gpu_count": "8", "guest": "ct200", "node": "pve1"})
    assert audit["status"] == "drift" and audit["majors"]["uvm"] == 238
    assert audit["stale"] == [{"line": f"{ALLOW}: c 511:* rwm", "reason": audit["stale"][0]["reason"]}]
    assert filters["proxmox_guest_snapshot_name"]("align", "dflash", "2026-11-29T13:36:12Z") == \
        "dflash-align-20261129-133612"
    assert filters["proxmox_guest_prune"](SNAPSHOTS, "dflash", "3") == []
    with pytest.raises(AnsibleFilterError, match=r"expected a GPU count or GPU indexes"):
        filters["proxmox_guest_audit"]({"config": config, "proc_devices": H200_DEVICES_TEXT, "guest": "ct200"})
    with pytest.raises(AnsibleFilterError, match=r"/proc/devices line 1: expected '<major> <name>'"):
        filters["proxmox_guest_audit"]({"config": config, "proc_devices": "garbage here now", "gpu_count": 1})


def test_argument_specs_and_defaults_agree() -> None:
    base = ROOT / "roles" / "proxmox_guest"
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    tasks = {p.stem for p in (base / "tasks").glob("*.yml")}
    assert set(specs) <= tasks  # every entry point is a tasks file
    options = {name: spec for entry in specs.values() for name, spec in entry["options"].items()}
    assert {n for n, s in options.items() if not s.get("required")} == set(defaults)
    for name, value in defaults.items():
        assert options[name]["default"] == value, name
    assert options["proxmox_guest_api"]["options"]["token_secret"]["no_log"] is True


def test_every_task_that_carries_the_token_is_no_log() -> None:
    for path in (ROOT / "roles" / "proxmox_guest" / "tasks").glob("*.yml"):
        for task in yaml.safe_load(path.read_text()) or []:
            for inner in task.get("block", [task]):
                module = next((k for k in inner if k.startswith(("community.proxmox.", "ansible.builtin.uri"))), None)
                if module:
                    assert inner.get("no_log") is True, f"{path.name}: {inner['name']}"


# --------------------------------------------------------------------------- playbooks with the production inventory


def playbook(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # JSON results keep each message on one line (the YAML format folds long ones).
    return run([tool("ansible-playbook"), "-i", "inventory/production", *args],
               env={**env, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"})


def test_production_needs_the_vault_and_never_shows_the_token(ansible_env: dict[str, str]) -> None:
    proc = playbook(ansible_env, "playbooks/proxmox_audit.yml", "-l", "pro6000", "--check")
    assert proc.returncode != 0
    assert "expected vault_dflash_proxmox_api_token_secret" in proc.stdout and "UNREACHABLE" not in proc.stdout
    # With a token and the node's address on loopback (nothing listens there), the API call fails: the play
    # names the API and the reason, and even -vvv output never contains the token.
    secret = "9f3c-not-a-real-token-4711"
    proc = playbook(ansible_env, "playbooks/proxmox_audit.yml", "-l", "pro6000", "-vvv",
                    "-e", f"vault_dflash_proxmox_api_token_secret={secret}", "-e", "ansible_host=127.0.0.1")
    assert proc.returncode != 0
    assert ("ct200 (CT 200 on pve1): expected the container's config from the Proxmox VE API at "
            "https://127.0.0.1:8006/api2/json, found ") in proc.stdout
    assert "Connection refused" in proc.stdout
    assert secret not in proc.stdout + proc.stderr


def test_rollback_mode_is_checked_before_anything_else(ansible_env: dict[str, str]) -> None:
    proc = playbook(ansible_env, "playbooks/rollback.yml", "-l", "pro6000", "-e", "dflash_rollback=everything")
    assert proc.returncode != 0
    assert "expected dflash_rollback unit (the default), replicas or container, found everything" in proc.stdout
    assert "UNREACHABLE" not in proc.stdout


def test_the_replicas_rollback_is_refused_on_a_one_process_host_before_anything_else(
        ansible_env: dict[str, str]) -> None:
    proc = playbook(ansible_env, "playbooks/rollback.yml", "-l", "eval", "-e", "dflash_rollback=replicas")
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert ("ct129 serves one engine process (dflash_serve_through_gateway: false): there are no replicas to roll "
            "back; run this playbook without -e dflash_rollback=replicas") in out, out[-2000:]
    assert "UNREACHABLE" not in proc.stdout
