"""Proxmox VE LXC guests: container configs (the /etc/pve/lxc/<vmid>.conf text and the API's JSON), the
NVIDIA passthrough they need on their node, the drift between both, and dflash snapshot bookkeeping.

The passthrough of an NVIDIA GPU into an LXC container is a handful of raw `lxc.*` lines: cgroup2 device
rules for the character majors (195 for nvidia0..N and nvidiactl; nvidia-uvm's major, which the kernel
allocates dynamically and which can change between boots of the node) and bind mounts of the device
nodes. The node's /proc/devices is the truth for the majors; a rule for a dynamic major that the node no
longer registers is a leftover of an earlier boot (public-captures.md 5.4, 5.5).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dflash_infra.parsers import ProcDevices, parse_proc_devices

Json = dict[str, Any]

CGROUP2_ALLOW = "lxc.cgroup2.devices.allow"
CGROUP1_ALLOW = "lxc.cgroup.devices.allow"
MOUNT_ENTRY = "lxc.mount.entry"
# The kernel hands out character majors dynamically from 254 down to 234, then from 511 down to 384
# (fs/char_dev.c: CHRDEV_MAJOR_DYN_END, CHRDEV_MAJOR_DYN_EXT_START/END).
DYNAMIC_MAJORS = frozenset(range(234, 255)) | frozenset(range(384, 512))
NVIDIACTL_MINOR = 255
# Names of the GPU device major in /proc/devices: 'nvidia' since 550.40, 'nvidia-frontend' before.
NVIDIA_NAMES = ("nvidia", "nvidiactl", "nvidia-frontend")
# A snapshot name as Proxmox VE accepts it (pve-configid, at most 40 characters).
_SNAPNAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{1,39}$")
_STAGE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_SECTION = re.compile(r"^\[([^\]]+)\]\s*$")
_RAW_LINE = re.compile(r"^(lxc\.[a-z0-9_.-]+)(?::|\s*=)\s*(.*?)\s*$")
_OPTION_LINE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$")
_DEV_OPTION = re.compile(r"^dev\d+$")


class ProxmoxError(ValueError):
    """Input or state that the role cannot work with; the message says expected / found / what to do."""


# ---------------------------------------------------------------------------------------------
# Container config
# ---------------------------------------------------------------------------------------------


@dataclass
class LxcConfig:
    """The current (main) section of a container config: its options, its raw lxc.* entries in order."""

    options: dict[str, str]
    raw: list[tuple[str, str]]
    digest: str | None = None
    source: str = "container config"

    def to_dict(self) -> Json:
        return {"options": dict(self.options), "lxc": [list(pair) for pair in self.raw], "digest": self.digest,
                "source": self.source}


def conf_digest(text: str) -> str:
    """The digest Proxmox VE reports for a config: SHA-1 of the file's bytes."""
    return hashlib.sha1(text.encode()).hexdigest()


def main_section_lines(text: str) -> list[str]:
    """The lines of the current config, up to the first [snapshot] or [pve:pending] section."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if _SECTION.match(line)), len(lines))
    return lines[:end]


def parse_lxc_conf(text: str, source: str = "container config") -> LxcConfig:
    """/etc/pve/lxc/<vmid>.conf -> its main section (snapshot and pending sections are not the running config)."""
    options: dict[str, str] = {}
    raw: list[tuple[str, str]] = []
    description: list[str] = []
    for number, line in enumerate(main_section_lines(text), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            description.append(line[1:])
            continue
        match = _RAW_LINE.match(line)
        if match:
            raw.append((match[1], match[2]))
            continue
        match = _OPTION_LINE.match(line)
        if not match:
            raise ProxmoxError(f"{source} line {number}: expected '<key>: <value>' or 'lxc.<key>: <value>', "
                               f"found {line.strip()[:80]!r}. Is this a Proxmox VE container config?")
        options[match[1]] = match[2]
    if description and "description" not in options:
        options["description"] = "\n".join(description)
    return LxcConfig(options=options, raw=raw, digest=conf_digest(text), source=source)


def config_from_api(data: Mapping[str, Any], source: str = "API config") -> LxcConfig:
    """GET /nodes/{node}/lxc/{vmid}/config (with or without the {"data": ...} envelope) -> LxcConfig.

    Raw keys come back as `"lxc": [[key, value], ...]`; every other option is a plain key.
    """
    if isinstance(data, Mapping) and set(data) == {"data"}:
        data = data["data"]
    if not isinstance(data, Mapping):
        raise ProxmoxError(f"{source}: expected the config object of GET .../lxc/<vmid>/config, found "
                           f"{type(data).__name__}")
    raw_entries = data.get("lxc") or []
    if not isinstance(raw_entries, list) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in raw_entries):
        raise ProxmoxError(f"{source}: expected 'lxc' as a list of [key, value] pairs, found {raw_entries!r:.120}")
    options = {str(k): str(v) for k, v in data.items() if k not in ("lxc", "digest")}
    digest = data.get("digest")
    return LxcConfig(options=options, raw=[(str(k), str(v)) for k, v in raw_entries],
                     digest=str(digest) if digest else None, source=source)


# ---------------------------------------------------------------------------------------------
# Device rules and mount entries
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupRule:
    """A devices.allow value: 'c 195:* rwm', 'c 120:0 rwm' or 'a'; None stands for '*'."""

    kind: str
    major: int | None
    minor: int | None
    access: str

    def covers(self, major: int, minor: int) -> bool:
        """True when this rule lets the container open the character device major:minor."""
        if self.kind == "a":
            return True
        return (self.kind == "c" and self.major in (None, major) and self.minor in (None, minor)
                and {"r", "w"} <= set(self.access))


def parse_cgroup_rule(value: str) -> CgroupRule | None:
    """Parse a devices.allow value; None when it is not one (left alone by the audit)."""
    words = value.split()
    if words == ["a"]:
        return CgroupRule("a", None, None, "rwm")
    if len(words) not in (2, 3) or words[0] not in ("a", "b", "c") or ":" not in words[1]:
        return None
    major_text, _, minor_text = words[1].partition(":")
    try:
        major = None if major_text == "*" else int(major_text)
        minor = None if minor_text == "*" else int(minor_text)
    except ValueError:
        return None
    return CgroupRule(words[0], major, minor, words[2] if len(words) == 3 else "rwm")


@dataclass(frozen=True)
class MountEntry:
    """An lxc.mount.entry value: source, target (relative to the container's root), type, options."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]

    @property
    def device(self) -> str | None:
        """The /dev name the entry provides inside the container ('nvidia0'), or None."""
        target = self.target.lstrip("/")
        return target[len("dev/"):] if target.startswith("dev/") else None


def parse_mount_entry(value: str) -> MountEntry | None:
    words = value.split()
    if len(words) < 4:
        return None
    return MountEntry(words[0], words[1], words[2], tuple(words[3].split(",")))


def _dev_option_path(value: str) -> str | None:
    """The device path of a devN option ('/dev/nvidia0' or 'path=/dev/nvidia0,mode=0666')."""
    for part in value.split(","):
        key, sep, rest = part.partition("=")
        if not sep:
            return key
        if key == "path":
            return rest
    return None


# ---------------------------------------------------------------------------------------------
# What the node says
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeMajors:
    """The NVIDIA character majors registered on the node (its /proc/devices)."""

    nvidia: int
    uvm: int
    caps: int | None

    def to_dict(self) -> Json:
        return {"nvidia": self.nvidia, "uvm": self.uvm, "caps": self.caps}


def node_majors(devices: ProcDevices, node: str = "the node") -> NodeMajors:
    """The majors of nvidia/nvidiactl, nvidia-uvm and (optional) nvidia-caps, exact names only."""
    nvidia = next((devices.character[n] for n in NVIDIA_NAMES if n in devices.character), None)
    if nvidia is None:
        raise ProxmoxError(f"expected the NVIDIA driver's 'nvidia'/'nvidiactl' in {node}'s {devices.source}, found "
                           "none. Load the driver on the node (nvidia-smi on the node) before auditing passthrough.")
    uvm = devices.major("nvidia-uvm")
    if uvm is None:
        raise ProxmoxError(f"expected 'nvidia-uvm' in {node}'s {devices.source} (its major is what the container "
                           "needs), found none. Load it on the node (`nvidia-modprobe -u -c0`, or `modprobe "
                           "nvidia-uvm` plus a udev rule that creates /dev/nvidia-uvm) and audit again.")
    return NodeMajors(nvidia=nvidia, uvm=uvm, caps=devices.major("nvidia-caps"))


@dataclass(frozen=True)
class Device:
    """One device node the container needs: its /dev name, char major:minor, and file or dir mount."""

    name: str
    major: int
    minor: int | None
    create: str = "file"

    @property
    def mount_line(self) -> str:
        return f"{MOUNT_ENTRY}: /dev/{self.name} dev/{self.name} none bind,optional,create={self.create}"


def required_devices(majors: NodeMajors, gpu_indexes: Sequence[int], include_caps: bool) -> list[Device]:
    """nvidia0..N, nvidiactl, nvidia-uvm, nvidia-uvm-tools (and the nvidia-caps folder when asked)."""
    devices = [Device(f"nvidia{i}", majors.nvidia, i) for i in gpu_indexes]
    devices += [Device("nvidiactl", majors.nvidia, NVIDIACTL_MINOR),
                Device("nvidia-uvm", majors.uvm, 0), Device("nvidia-uvm-tools", majors.uvm, 1)]
    if include_caps and majors.caps is not None:
        devices.append(Device("nvidia-caps", majors.caps, None, create="dir"))
    return devices


def allow_line(major: int) -> str:
    return f"{CGROUP2_ALLOW}: c {major}:* rwm"


def expected_lines(majors: NodeMajors, gpu_indexes: Sequence[int], include_caps: bool) -> list[str]:
    """The canonical passthrough block for this node and GPU set, in the order it is written."""
    devices = required_devices(majors, gpu_indexes, include_caps)
    rules = list(dict.fromkeys(allow_line(d.major) for d in devices))
    return rules + [d.mount_line for d in devices]


# ---------------------------------------------------------------------------------------------
# Audit
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A config line the audit wants added or removed, and why. `index` is its place among the raw entries."""

    line: str
    reason: str
    index: int | None = None

    def to_dict(self) -> Json:
        return {"line": self.line, "reason": self.reason}


@dataclass
class PassthroughAudit:
    """The container's passthrough lines against its node: what is missing, what is stale, what to know."""

    guest: str
    node: str
    majors: NodeMajors
    gpu_indexes: list[int]
    expected: list[str]
    missing: list[Finding] = field(default_factory=list)
    stale: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "drift" if self.missing or self.stale else "ok"

    def report(self) -> list[str]:
        """Readable lines for the play output."""
        head = (f"{self.guest}: NVIDIA passthrough matches {self.node} (nvidia {self.majors.nvidia}, nvidia-uvm "
                f"{self.majors.uvm}, GPUs {_ranges(self.gpu_indexes)})")
        if self.status == "drift":
            head = (f"{self.guest}: NVIDIA passthrough drifted from {self.node} (nvidia-uvm is {self.majors.uvm} "
                    f"there): {len(self.missing)} line(s) missing, {len(self.stale)} stale")
        lines = [head]
        lines += [f"  + {f.line}    # {f.reason}" for f in self.missing]
        lines += [f"  - {f.line}    # {f.reason}" for f in self.stale]
        lines += [f"  warning: {w}" for w in self.warnings]
        return lines

    def to_dict(self) -> Json:
        return {
            "guest": self.guest, "node": self.node, "status": self.status, "majors": self.majors.to_dict(),
            "gpu_indexes": list(self.gpu_indexes), "expected": list(self.expected),
            "missing": [f.to_dict() for f in self.missing], "stale": [f.to_dict() for f in self.stale],
            "warnings": list(self.warnings), "report": self.report(),
        }


def _ranges(indexes: Sequence[int]) -> str:
    if not indexes:
        return "none"
    ordered = sorted(indexes)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def audit_passthrough(config: LxcConfig, devices: ProcDevices, gpu_indexes: Sequence[int],
                      include_caps: bool = False, guest: str = "container", node: str = "node") -> PassthroughAudit:
    """Compare the config's raw passthrough lines with what the node's majors and the GPU set require."""
    if len(set(gpu_indexes)) != len(gpu_indexes) or any(i < 0 for i in gpu_indexes):
        raise ProxmoxError(f"{guest}: expected distinct GPU indexes >= 0, found {list(gpu_indexes)}")
    majors = node_majors(devices, node)
    needed = required_devices(majors, gpu_indexes, include_caps)
    audit = PassthroughAudit(guest=guest, node=node, majors=majors, gpu_indexes=list(gpu_indexes),
                             expected=expected_lines(majors, gpu_indexes, include_caps))
    passed = {path[len("/dev/"):] for key, value in config.options.items() if _DEV_OPTION.match(key)
              for path in [_dev_option_path(value) or ""] if path.startswith("/dev/")}
    rules = _audit_rules(config, devices, majors, audit, node)
    _audit_mounts(config, needed, passed, gpu_indexes, audit)
    audit.missing[:0] = _missing_rules([d for d in needed if d.name not in passed and not _covered(d, rules)])
    return audit


def _missing_rules(uncovered: Sequence[Device]) -> list[Finding]:
    """One canonical 'c <major>:* rwm' line per major whose devices no rule allows."""
    by_line: dict[str, list[str]] = {}
    for d in uncovered:
        minor = "*" if d.minor is None else d.minor
        by_line.setdefault(allow_line(d.major), []).append(f"{d.name} ({d.major}:{minor})")
    return [Finding(line, "not allowed by any cgroup2 device rule: " + ", ".join(names))
            for line, names in by_line.items()]


def _covered(device: Device, rules: Sequence[CgroupRule]) -> bool:
    """A device node is usable when a rule covers it (a folder of nodes needs the whole major)."""
    if device.minor is None:
        return any(r.kind == "a" or (r.covers(device.major, 0) and r.minor is None) for r in rules)
    return any(r.covers(device.major, device.minor) for r in rules)


def _audit_rules(config: LxcConfig, devices: ProcDevices, majors: NodeMajors, audit: PassthroughAudit,
                 node: str) -> list[CgroupRule]:
    """Classify the devices.allow lines; returns the rules that stay."""
    kept: list[CgroupRule] = []
    seen: set[str] = set()
    names_by_major: dict[int, list[str]] = {}
    for name, major in devices.character.items():
        names_by_major.setdefault(major, []).append(name)
    for name, majors_list in devices.ambiguous.items():
        for major in majors_list:
            names_by_major.setdefault(major, []).append(name)
    for index, (key, value) in enumerate(config.raw):
        line = f"{key}: {value}"
        if key == CGROUP1_ALLOW:
            rule = parse_cgroup_rule(value)
            if rule and rule.major in (majors.nvidia, majors.uvm):
                audit.warnings.append(f"'{line}' is a cgroup v1 rule, which Proxmox VE 7+ (cgroup2) ignores; "
                                      f"the {CGROUP2_ALLOW} rule is what counts")
            continue
        if key != CGROUP2_ALLOW:
            continue
        rule = parse_cgroup_rule(value)
        if rule is None:
            audit.warnings.append(f"'{line}' is not a device rule this audit understands; left as is")
            continue
        normalized = f"{rule.kind} {rule.major if rule.major is not None else '*'}:" \
                     f"{rule.minor if rule.minor is not None else '*'} {rule.access}"
        if normalized in seen:
            audit.stale.append(Finding(line, "duplicate of an earlier rule", index))
            continue
        seen.add(normalized)
        owners = names_by_major.get(rule.major, []) if rule.major is not None else []
        if rule.kind == "c" and rule.major is not None and not owners:
            if rule.major in DYNAMIC_MAJORS:
                audit.stale.append(Finding(
                    line, f"major {rule.major} is not registered on {node} ({devices.source}): a dynamic major "
                          f"from an earlier boot; nvidia-uvm is {majors.uvm} now", index))
                continue
            audit.warnings.append(f"'{line}': {node} registers no character device with major {rule.major}; "
                                  "left as is")
        elif (rule.kind == "c" and rule.major in DYNAMIC_MAJORS
              and not any(o.startswith("nvidia") for o in owners)):
            audit.warnings.append(
                f"'{line}': {node} registers major {rule.major} as {', '.join(owners)}, not an NVIDIA device; if "
                f"this line was written for nvidia-uvm before a reboot, remove it by hand (nvidia-uvm is "
                f"{majors.uvm} now)")
        kept.append(rule)
    return kept


def _audit_mounts(config: LxcConfig, needed: Sequence[Device], passed: set[str], gpu_indexes: Sequence[int],
                  audit: PassthroughAudit) -> None:
    """Mount entries: one per needed device node; GPUs outside the container's set are stale."""
    by_device: dict[str, MountEntry] = {}
    for index, (key, value) in enumerate(config.raw):
        if key != MOUNT_ENTRY:
            continue
        entry = parse_mount_entry(value)
        mounted = entry.device if entry else None
        if entry is None or mounted is None or not mounted.startswith("nvidia"):
            continue
        line = f"{key}: {value}"
        if mounted in by_device:
            audit.stale.append(Finding(line, f"a second mount of dev/{mounted}", index))
            continue
        gpu = re.fullmatch(r"nvidia(\d+)", mounted)
        if gpu and int(gpu[1]) not in gpu_indexes:
            audit.stale.append(Finding(
                line, f"GPU {gpu[1]} is not one of this container's GPUs ({_ranges(gpu_indexes)})", index))
            continue
        by_device[mounted] = entry
    for device in needed:
        entry = by_device.get(device.name)
        if device.name in passed:
            continue
        if entry is None:
            audit.missing.append(Finding(device.mount_line, f"nothing mounts /dev/{device.name} into the container"))
        elif entry.source != f"/dev/{device.name}":
            audit.warnings.append(f"dev/{device.name} is mounted from {entry.source}, not /dev/{device.name}; "
                                  "left as is (relocated device nodes)")
        elif "bind" not in entry.options and "rbind" not in entry.options:
            audit.warnings.append(f"the mount of dev/{device.name} has no 'bind' option ({','.join(entry.options)})")


def audit_request(request: Mapping[str, Any]) -> PassthroughAudit:
    """The audit from one mapping: config (API JSON), proc_devices (text), gpu_indexes, include_caps, guest, node."""
    guest = str(request.get("guest") or "container")
    node = str(request.get("node") or "node")
    config = config_from_api(request["config"], f"{guest}: API config")
    devices = parse_proc_devices(str(request["proc_devices"]), f"{request.get('proc_devices_path') or '/proc/devices'}")
    return audit_passthrough(config, devices, _indexes(request), bool(request.get("include_caps")), guest, node)


def _indexes(request: Mapping[str, Any]) -> list[int]:
    indexes = request.get("gpu_indexes") or []
    if not indexes:
        indexes = list(range(int(request.get("gpu_count") or 0)))
    if not indexes:
        raise ProxmoxError(f"{request.get('guest') or 'container'}: expected a GPU count or GPU indexes for the "
                           "passthrough audit, found none. Set proxmox_guest_gpu_count (the group's gpu_count).")
    return [int(i) for i in indexes]


# ---------------------------------------------------------------------------------------------
# Fixing the file
# ---------------------------------------------------------------------------------------------


@dataclass
class ConfFix:
    """The conf file after the fix, the audit it came from and a unified diff."""

    text: str
    audit: PassthroughAudit
    diff: list[str]

    @property
    def changed(self) -> bool:
        return bool(self.diff)

    def to_dict(self) -> Json:
        return {"text": self.text, "changed": self.changed, "diff": self.diff, "audit": self.audit.to_dict()}


def fix_conf_text(text: str, devices: ProcDevices, gpu_indexes: Sequence[int], include_caps: bool = False,
                  guest: str = "container", node: str = "node", path: str = "container.conf") -> ConfFix:
    """Remove the stale passthrough lines of the main section; add each missing line after the last kept line
    with the same key (else after the last lxc.* line). Everything else stays byte for byte."""
    config = parse_lxc_conf(text, path)
    audit = audit_passthrough(config, devices, gpu_indexes, include_caps, guest, node)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    main = len(main_section_lines(text))
    raw_at = [i for i in range(main) if _RAW_LINE.match(lines[i].rstrip("\r\n"))]
    drop = {raw_at[f.index] for f in audit.stale if f.index is not None}
    kept = [(i, config.raw[n][0]) for n, i in enumerate(raw_at) if i not in drop]
    fallback = kept[-1][0] if kept else max((i for i in range(main) if lines[i].strip()), default=-1)
    inserts: dict[int, list[str]] = {}
    for finding in audit.missing:
        key = finding.line.split(":", 1)[0]
        anchor = max((i for i, k in kept if k == key), default=fallback)
        inserts.setdefault(anchor, []).append(finding.line + "\n")
    new_lines = inserts.get(-1, [])
    for i, line in enumerate(lines):
        if i not in drop:
            new_lines.append(line)
        new_lines.extend(inserts.get(i, []))
    diff = [d.rstrip("\n") for d in difflib.unified_diff(lines, new_lines, fromfile=path, tofile=path)]
    return ConfFix(text="".join(new_lines) if diff else text, audit=audit, diff=diff)


def fix_request(request: Mapping[str, Any]) -> ConfFix:
    """fix_conf_text from one mapping: conf_text, conf_path, proc_devices, gpu_indexes, include_caps, guest, node,
    and the API's digest of the same config (refused when the file is not that config any more)."""
    text = str(request["conf_text"])
    path = str(request.get("conf_path") or "container.conf")
    guest = str(request.get("guest") or "container")
    expected_digest = request.get("api_digest")
    if expected_digest and conf_digest(text) != expected_digest:
        raise ProxmoxError(f"{guest}: expected {path} to be the config the API returned (digest {expected_digest}), "
                           f"found digest {conf_digest(text)}: it changed in between. Run the audit again.")
    devices = parse_proc_devices(str(request["proc_devices"]), str(request.get("proc_devices_path") or "/proc/devices"))
    return fix_conf_text(text, devices, _indexes(request), bool(request.get("include_caps")), guest,
                         str(request.get("node") or "node"), path)


# ---------------------------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------------------------


def snapshot_name(prefix: str, stage: str, when: datetime | str) -> str:
    """'dflash-align-20261129-133612': prefix, stage and UTC time, within Proxmox VE's snapshot name rules."""
    if not _STAGE.match(stage or ""):
        raise ProxmoxError(f"expected a stage name of lower-case letters, digits and '-' (e.g. align, "
                           f"engine-upgrade), found {stage!r}. Set proxmox_guest_stage.")
    if isinstance(when, str):
        when = datetime.fromisoformat(when.replace("Z", "+00:00"))
    name = f"{prefix}-{stage}-{when.strftime('%Y%m%d-%H%M%S')}"
    if not _SNAPNAME.match(name):
        raise ProxmoxError(f"snapshot name {name!r} is not valid for Proxmox VE (a letter first, then letters, digits, "
                           "'-' or '_', at most 40 characters); shorten the prefix or the stage name")
    return name


def _snapshots(listing: object) -> list[Mapping[str, Any]]:
    """The snapshots of GET .../snapshot, without the 'current' entry (the running state)."""
    if not isinstance(listing, Sequence) or isinstance(listing, (str, bytes)):
        raise ProxmoxError(f"expected the list of GET .../lxc/<vmid>/snapshot, found {type(listing).__name__}")
    return [s for s in listing if isinstance(s, Mapping) and s.get("name") != "current"]


def ours(listing: Sequence[Mapping[str, Any]], prefix: str) -> list[Mapping[str, Any]]:
    """This project's snapshots (name '<prefix>-...'), oldest first by snaptime then name."""
    found = [s for s in _snapshots(listing) if str(s.get("name", "")).startswith(f"{prefix}-")]
    return sorted(found, key=lambda s: (int(s.get("snaptime") or 0), str(s["name"])))


def snapshots_to_prune(listing: Sequence[Mapping[str, Any]], prefix: str, keep: int) -> list[str]:
    """Names of our snapshots beyond the newest `keep` (others' snapshots are never touched)."""
    if keep < 1:
        raise ProxmoxError("expected proxmox_guest_snapshot_keep >= 1 (the newest is the rollback point), "
                           f"found {keep}")
    mine = ours(listing, prefix)
    return [str(s["name"]) for s in mine[:max(0, len(mine) - keep)]]


def rollback_target(listing: Sequence[Mapping[str, Any]], prefix: str, requested: str = "",
                    recorded: str = "", guest: str = "container") -> Json:
    """The snapshot to roll back to: the requested one, else the recorded one if it still exists, else our newest."""
    names = [str(s.get("name")) for s in _snapshots(listing)]
    if requested:
        if requested not in names:
            raise ProxmoxError(f"{guest}: expected a snapshot named {requested!r}, found {', '.join(names) or 'none'}. "
                               "Check proxmox_guest_rollback_to.")
        return {"name": requested, "reason": "requested"}
    if recorded and recorded in names:
        return {"name": recorded, "reason": "recorded by the last snapshot play"}
    mine = ours(listing, prefix)
    if not mine:
        raise ProxmoxError(f"{guest}: expected a '{prefix}-*' snapshot to roll back to, found "
                           f"{', '.join(names) or 'no snapshots'}. Take one with playbooks/proxmox_snapshot.yml first.")
    reason = "newest dflash snapshot"
    if recorded:
        reason += f" (the recorded {recorded} no longer exists)"
    return {"name": str(mine[-1]["name"]), "reason": reason}
