#!/usr/bin/env python3
"""Install the GPU simulation kit into a lab container rootfs before its first boot.

Usage: provision.py <rootfs-dir> <host-name>   (called through lab/kit/provision)

Idempotent: a second run on the same rootfs changes nothing that is already right.
Everything installed is a lab stand-in and says so (/etc/dflash-lab/README).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

KIT = Path(__file__).resolve().parent
REPO = KIT.parent.parent
PROFILES = REPO / "lab" / "profiles"
CACHE = REPO / ".cache" / "lab"
sys.path.insert(0, str(KIT))

import build_debs  # noqa: E402
import make_models  # noqa: E402

PROFILE_DEST = "etc/dflash-lab/gpu-profile.json"
PROC_VERSION_DEST = "var/lib/dflash-lab/proc/driver/nvidia/version"
PROC_GPUS_DEST = "var/lib/dflash-lab/proc/driver/nvidia/gpus"
ARCHIVES = "var/cache/apt/archives"
STAGING = "var/lib/dflash-lab/debs-staging"
CHROOT_ENV = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"]

README = """\
dflash-lab: this container is a LAB STAND-IN for production host {host} (group {group}).
Nothing here touches a GPU. Installed by lab/kit/provision of the dflash-infra repository:

  /etc/dflash-lab/gpu-profile.json     simulated GPUs and kernel module (from lab/profiles/{host}.yml)
  /var/lib/dflash-lab/proc/driver/nvidia/version, .../gpus/<bus>/information
                                       stand-ins for /proc/driver/nvidia (kernel module {kver},
                                       {flavor}; one information file per GPU, readable without
                                       NVML); roles read them through a path variable
  /usr/bin/nvidia-smi                  stand-in shipped by the synthetic nvidia-utils-{branch} package
  NVIDIA packages (dpkg -l '*nvidia*') synthetic .debs with Ubuntu's names and dependencies,
                                       user space {installed} installed
  /var/cache/apt/archives/*.deb        synthetic .debs of {cached}, plus trap packages
                                       (nvidia-dkms-*, nvidia-driver-*, linux-modules-nvidia-*)
                                       that must never be installed in a container
  /run/dflash-lab/gpu-procs/<pid>.json GPU memory "held" by lab workloads (read by nvidia-smi)
{extras}"""

TRAINING_EXTRA = """\
  /root/run.sh, /root/train.py         training-job stand-in (log /root/train_slammed5.log);
                                       lab-training-autostart.service starts it at boot
  /etc/dflash-lab/training.env         its settings (TRAIN_IGNORE_SIGTERM=1: ignores SIGTERM)
"""
MODELS_EXTRA = """\
  {root}/<model>                 model fixtures: real config files, stand-in safetensors weights
"""


class ProvisionError(Exception):
    """A problem the operator must fix; the message says what and how."""


@dataclass(frozen=True)
class Profile:
    """The parts of a lab profile that provisioning acts on."""

    raw: dict
    host: str
    branch: str
    installed: str
    cached: list[str]
    revision: str
    kernel_release: str


def load_profile(host: str) -> Profile | None:
    """Read lab/profiles/<host>.yml; None when the host has no GPU profile."""
    path = PROFILES / f"{host}.yml"
    if not path.is_file():
        return None
    raw = yaml.safe_load(path.read_text())
    try:
        us = raw["userspace"]
        return Profile(
            raw=raw, host=raw["host"], branch=str(us["branch"]), installed=str(us["installed"]),
            cached=[str(v) for v in us.get("cached", [])], revision=str(us["debian_revision"]),
            kernel_release=str(us.get("kernel_release", build_debs.DEFAULT_KERNEL)),
        )
    except (KeyError, TypeError) as err:
        raise ProvisionError(f"{path}: missing or malformed key {err}; compare with lab/profiles/ct200.yml") from None


def proc_version_text(km: dict) -> str:
    """/proc/driver/nvidia/version as the open or proprietary module prints it."""
    arch, ver, built = km.get("arch", "x86_64"), km["version"], km.get("built", "")
    if km["flavor"] == "open":
        first = (f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {ver}  Release Build  "
                 f"({km.get('build', '')})  {built}")
    elif km["flavor"] == "proprietary":
        first = f"NVRM version: NVIDIA UNIX {arch} Kernel Module  {ver}  {built}"
    else:
        raise ProvisionError(f"kernel_module.flavor is {km['flavor']!r}; expected 'open' or 'proprietary'")
    return f"{first}\nGCC version:  {km.get('gcc', 'gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)')} \n"


def proc_bus(pci_bus_id: str) -> str:
    """nvidia-smi's bus id (00000000:1B:00.0) as the driver names its /proc folder (0000:1b:00.0)."""
    domain, _, rest = pci_bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def proc_gpu_information(prof_raw: dict, gpu: dict, minor: int) -> str:
    """/proc/driver/nvidia/gpus/<bus>/information of one GPU, laid out as the real driver writes it (a tab after
    each label, a space before the value; captured on the H200 test machine). The GSP firmware line carries the
    kernel module's version for the open module and N/A for the proprietary one."""
    model, km = prof_raw["gpu_model"], prof_raw["kernel_module"]
    firmware = km["version"] if km["flavor"] == "open" else "N/A"
    rows = [("Model: \t\t", model["name"]), ("IRQ:   \t\t", str(40 + minor)), ("GPU UUID: \t", gpu["uuid"]),
            ("Video BIOS: \t", str(model.get("vbios_version", "00.00.00.00.00")).lower()), ("Bus Type: \t", "PCIe"),
            ("DMA Size: \t", "52 bits"), ("DMA Mask: \t", "0xfffffffffffff"),
            ("Bus Location: \t", proc_bus(gpu["pci_bus_id"])), ("Device Minor: \t", str(minor)),
            ("GPU Firmware: \t", firmware), ("GPU Excluded:\t", "No")]
    return "".join(f"{label} {value}\n" for label, value in rows)


def write_proc_gpus(root: Path, prof_raw: dict) -> int:
    """One information file per profile GPU under the /proc stand-in (stale ones removed); returns the count."""
    gpus_dir = root / PROC_GPUS_DEST
    wanted = {proc_bus(g["pci_bus_id"]): proc_gpu_information(prof_raw, g, minor)
              for minor, g in enumerate(prof_raw.get("gpus") or [])}
    if gpus_dir.is_dir():
        for stale in sorted(p for p in gpus_dir.iterdir() if p.name not in wanted):
            shutil.rmtree(stale)
    for bus, text in wanted.items():
        write_if_changed(gpus_dir / bus / "information", text)
    return len(wanted)


def write_if_changed(path: Path, data: bytes | str, mode: int = 0o644) -> bool:
    """Write a file only when its content differs; returns True when it changed."""
    blob = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.read_bytes() == blob and (path.stat().st_mode & 0o7777) == mode:
        return False
    tmp = path.with_name(path.name + ".dflash-tmp")
    tmp.write_bytes(blob)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


def chroot(root: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["chroot", str(root), *CHROOT_ENV, *cmd], check=check, text=True,
                          capture_output=True)


def installed_versions(root: Path, packages: list[str]) -> dict[str, str]:
    """dpkg's view of installed packages in the rootfs: name -> version (installed ones only)."""
    res = chroot(root, "dpkg-query", "-W", "-f=${Package}\\t${Version}\\t${db:Status-Abbrev}\\n", *packages,
                 check=False)
    found = {}
    for line in res.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2].startswith("ii"):
            found[parts[0]] = parts[1]
    return found


def install_userspace(root: Path, prof: Profile, manifest: dict) -> str:
    """Install the profile's user-space set with one `dpkg -i` in the chroot (skip when in place)."""
    entry = manifest["versions"][prof.installed]
    want = {p["package"]: p["version"] for p in entry["userspace"]}
    if installed_versions(root, sorted(want)) == want:
        return "already installed"
    staging = root / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    debs = []
    for p in entry["userspace"]:
        src = CACHE / "debs" / p["file"]
        shutil.copy2(src, staging / src.name)
        debs.append(f"/{STAGING}/{src.name}")
    try:
        res = chroot(root, "dpkg", "-i", *debs, check=False)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if res.returncode != 0:
        raise ProvisionError(f"dpkg -i of the {prof.installed} user-space set failed in {root}:\n"
                             f"{res.stdout}{res.stderr}Check the rootfs (dpkg --audit) and rerun provision.")
    return f"installed {len(debs)} packages"


def place_archives(root: Path, prof: Profile, manifest: dict) -> int:
    """Put the cached versions' .debs and the trap packages where apt leaves downloads."""
    dest = root / ARCHIVES
    dest.mkdir(parents=True, exist_ok=True)
    placed = 0
    for version in prof.cached:
        entry = manifest["versions"][version]
        for p in entry["userspace"] + entry["traps"]:
            src = CACHE / "debs" / p["file"]
            target = dest / src.name
            if not target.is_file() or target.read_bytes() != src.read_bytes():
                shutil.copy2(src, target)
            placed += 1
    return placed


def install_training(root: Path, prof: Profile) -> None:
    """Training-job stand-in, its settings, and the boot-time autostart unit."""
    tr = prof.raw.get("training") or {}
    write_if_changed(root / "root/train.py", (KIT / "train.py").read_bytes(), 0o755)
    write_if_changed(root / "root/run.sh", (KIT / "run.sh").read_bytes(), 0o755)
    env = (
        "# dflash-lab stand-in: settings of the training-job stand-in (/root/train.py)\n"
        f"TRAIN_IGNORE_SIGTERM={1 if tr.get('ignore_sigterm') else 0}\n"
        f"TRAIN_GPU_MEMORY_MIB={int(tr.get('memory_mib_per_gpu', 91000))}\n"
        f"TRAIN_LOG={tr.get('log', '/root/train_slammed5.log')}\n"
    )
    write_if_changed(root / "etc/dflash-lab/training.env", env)
    unit = root / "etc/systemd/system/lab-training-autostart.service"
    write_if_changed(unit, (KIT / "lab-training-autostart.service").read_bytes())
    wants = root / "etc/systemd/system/multi-user.target.wants/lab-training-autostart.service"
    if tr.get("autostart", True):
        wants.parent.mkdir(parents=True, exist_ok=True)
        if not wants.is_symlink():
            wants.symlink_to("/etc/systemd/system/lab-training-autostart.service")
    elif wants.is_symlink():
        wants.unlink()


def install_models(root: Path, prof: Profile) -> str:
    """Generate (cached) model fixtures and copy them to the profile's model root."""
    m = prof.raw.get("models") or {}
    target_bytes = int(m.get("target_total_bytes", 4 << 20))
    draft_bytes = int(m.get("draft_total_bytes", 1 << 20))
    key = build_debs.hashlib.sha256(
        (KIT / "make_models.py").read_bytes() + f"{target_bytes}:{draft_bytes}".encode()).hexdigest()[:16]
    cache = CACHE / "models" / key
    if not (cache / ".complete").is_file():
        shutil.rmtree(cache, ignore_errors=True)
        make_models.make_target(cache, target_bytes)
        make_models.make_draft(cache, draft_bytes)
        (cache / ".complete").write_text("ok\n")
    dest_root = root / str(m.get("root", "/root/models")).lstrip("/")
    copied = 0
    for name in m.get("names", [make_models.TARGET, make_models.DRAFT]):
        src_dir, dst_dir = cache / name, dest_root / name
        dst_dir.mkdir(parents=True, exist_ok=True)
        for src in sorted(src_dir.iterdir()):
            dst = dst_dir / src.name
            s = src.stat()
            if dst.is_file() and dst.stat().st_size == s.st_size and int(dst.stat().st_mtime) == int(s.st_mtime):
                continue
            shutil.copy2(src, dst)
            copied += 1
    return f"{copied} files copied" if copied else "already in place"


def provision(root: Path, host: str) -> list[str]:
    """Run every step; returns one line per step for the log."""
    if not (root / "var/lib/dpkg/status").is_file():
        raise ProvisionError(f"{root} does not look like a Debian rootfs (no var/lib/dpkg/status); "
                             "pass the container's root directory")
    prof = load_profile(host)
    if prof is None:
        return [f"no GPU profile lab/profiles/{host}.yml; nothing to install for {host}"]
    if prof.host != host:
        raise ProvisionError(f"lab/profiles/{host}.yml says host {prof.host!r}; expected {host!r}")
    log = []
    km = prof.raw["kernel_module"]
    versions = sorted(set(build_debs.DEFAULT_VERSIONS) | {prof.installed, *prof.cached}, key=build_debs.version_key)
    manifest = build_debs.build_all(CACHE / "debs", versions, prof.revision, prof.kernel_release)
    log.append(f"debs ready for {', '.join(versions)}")

    write_if_changed(root / PROFILE_DEST, json.dumps(prof.raw, indent=2, sort_keys=True) + "\n")
    write_if_changed(root / PROC_VERSION_DEST, proc_version_text(km))
    gpu_files = write_proc_gpus(root, prof.raw)
    write_if_changed(root / "usr/lib/tmpfiles.d/dflash-lab.conf", (KIT / "tmpfiles.conf").read_bytes())
    (root / "var/lib/dflash-lab").mkdir(parents=True, exist_ok=True)
    log.append(f"profile, /proc stand-in ({km['flavor']} {km['version']}, {gpu_files} GPU information files) "
               "and tmpfiles.d entry written")

    log.append(f"user space {prof.installed}: {install_userspace(root, prof, manifest)}")
    log.append(f"apt archives: {place_archives(root, prof, manifest)} .debs of {', '.join(prof.cached)} (with traps)")

    extras = ""
    if (prof.raw.get("training") or {}).get("install"):
        install_training(root, prof)
        extras += TRAINING_EXTRA
        log.append("training stand-in installed (/root/run.sh, lab-training-autostart.service)")
    if (prof.raw.get("models") or {}).get("install"):
        extras += MODELS_EXTRA.format(root=prof.raw["models"].get("root", "/root/models"))
        log.append(f"model fixtures: {install_models(root, prof)}")
    readme = README.format(
        host=host, group=prof.raw.get("group", "?"), kver=km["version"], flavor=km["flavor"], branch=prof.branch,
        installed=prof.installed, cached=", ".join(prof.cached), extras=extras)
    write_if_changed(root / "etc/dflash-lab/README", readme)
    return log


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: lab/kit/provision <rootfs-dir> <host-name>", file=sys.stderr)
        return 2
    root, host = Path(argv[1]).resolve(), argv[2]
    started = time.monotonic()
    try:
        for line in provision(root, host):
            print(f"provision {host}: {line}")
    except ProvisionError as err:
        print(f"provision {host}: ERROR: {err}", file=sys.stderr)
        return 1
    print(f"provision {host}: done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
