#!/usr/bin/env python3
"""Build the lab's synthetic NVIDIA .debs (stand-ins with Ubuntu's names and dependency shape).

For each upstream version V of branch B (B = V's first part) this builds the user-space
set that is safe in an LXC container (libnvidia-compute-B, nvidia-utils-B, ...,
nvidia-kernel-common-B, nvidia-firmware-B-V) and the trap packages that must never be
installed in a container (nvidia-dkms-B, nvidia-driver-B, their -open variants and
linux-modules-nvidia-B[-open]-<kernel>). Payloads are small marker files; nvidia-utils-B
ships the nvidia-smi stand-in as /usr/bin/nvidia-smi.

Output: <out>/<V>/userspace/*.deb, <out>/<V>/traps/*.deb and <out>/manifest.json. The
build is skipped when <out>/.stamp matches a hash of this script, the nvidia-smi stand-in
and the arguments, so calling it again is cheap.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

KIT = Path(__file__).resolve().parent
REPO = KIT.parent.parent
DEFAULT_OUT = REPO / ".cache" / "lab" / "debs"
DEFAULT_VERSIONS = ("580.126.09", "580.159.03", "595.71.05")
DEFAULT_REVISION = "0ubuntu0.24.04.1"
DEFAULT_KERNEL = "6.8.0-60-generic"
LIBDIR = "usr/lib/x86_64-linux-gnu"
MAINTAINER = "dflash-infra lab <lab@localhost>"
STAND_IN_NOTE = "dflash-lab stand-in: synthetic package for the lab, contains no NVIDIA software."
EPOCH = 1767225600  # fixed mtime (2026-01-01) so rebuilt packages are byte-identical


@dataclass
class Package:
    """One binary package: control fields plus files and symlinks to ship."""

    name: str
    version: str
    description: str
    arch: str = "amd64"
    section: str = "libs"
    depends: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    multi_arch: str | None = None
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    links: dict[str, str] = field(default_factory=dict)  # path -> target
    postinst: str | None = None
    source_branch: str | None = None

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"

    def control(self) -> str:
        lines = [
            f"Package: {self.name}",
            f"Source: nvidia-graphics-drivers-{self.source_branch}" if self.source_branch else None,
            f"Version: {self.version}",
            f"Architecture: {self.arch}",
            f"Maintainer: {MAINTAINER}",
            f"Section: {self.section}",
            "Priority: optional",
            f"Multi-Arch: {self.multi_arch}" if self.multi_arch else None,
            f"Depends: {', '.join(self.depends)}" if self.depends else None,
            f"Provides: {', '.join(self.provides)}" if self.provides else None,
            f"Conflicts: {', '.join(self.conflicts)}" if self.conflicts else None,
            f"Replaces: {', '.join(self.replaces)}" if self.replaces else None,
            f"Description: {self.description}",
            f" {STAND_IN_NOTE}",
        ]
        return "\n".join(line for line in lines if line) + "\n"


def marker(kind: str, name: str, version: str) -> bytes:
    """A small, non-empty payload that says what it stands in for."""
    return f"{STAND_IN_NOTE}\n{kind}: {name} {version}\n".encode()


def lib(pkg: Package, soname: str, version: str, link_suffix: str = "1") -> None:
    """Ship <soname>.<version> with its <soname>.<link_suffix> symlink, like the real packages."""
    real = f"{LIBDIR}/{soname}.{version}"
    pkg.files[real] = (marker("library", soname, version), 0o644)
    pkg.links[f"{LIBDIR}/{soname}.{link_suffix}"] = f"{soname}.{version}"


def userspace_set(branch: str, upstream: str, revision: str, smi_source: str) -> list[Package]:
    """The user-space packages of one version, with Ubuntu's Depends/Provides shape."""
    v = f"{upstream}-{revision}"
    exact = lambda name: f"{name} (= {v})"  # noqa: E731  (${binary:Version} link)
    kcommon_virtual = f"nvidia-kernel-common-{branch}-{upstream}"
    firmware = f"nvidia-firmware-{branch}-{upstream}"
    b = branch
    pk = lambda **kw: Package(version=v, source_branch=b, **kw)  # noqa: E731

    compute = pk(
        name=f"libnvidia-compute-{b}", description="NVIDIA libcompute package", multi_arch="same",
        depends=["libc6 (>= 2.34)", kcommon_virtual],
        provides=["libnvidia-compute", f"libcuda.so.1 (= {upstream})", f"libnvidia-ml.so.1 (= {upstream})"],
        conflicts=["libnvidia-compute"], replaces=["libnvidia-compute"],
    )
    lib(compute, "libnvidia-ml.so", upstream)
    lib(compute, "libcuda.so", upstream)
    lib(compute, "libnvidia-ptxjitcompiler.so", upstream)

    common = pk(
        name=f"libnvidia-common-{b}", description="Shared files used by the NVIDIA libraries",
        arch="all", depends=[kcommon_virtual],
        provides=["libnvidia-common"], conflicts=["libnvidia-common"], replaces=["libnvidia-common"],
    )
    common.files[f"usr/share/nvidia/nvidia-application-profiles-{upstream}-rc"] = (
        marker("application profiles", "nvidia-application-profiles", upstream), 0o644)

    decode = pk(
        name=f"libnvidia-decode-{b}", description="NVIDIA Video Decoding runtime libraries", multi_arch="same",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-compute-{b}"), kcommon_virtual],
        provides=["libnvidia-decode"], conflicts=["libnvidia-decode"], replaces=["libnvidia-decode"],
    )
    lib(decode, "libnvcuvid.so", upstream)

    encode = pk(
        name=f"libnvidia-encode-{b}", description="NVENC Video Encoding runtime library", multi_arch="same",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-compute-{b}"), kcommon_virtual],
        provides=["libnvidia-encode"], conflicts=["libnvidia-encode"], replaces=["libnvidia-encode"],
    )
    lib(encode, "libnvidia-encode.so", upstream)

    gl = pk(
        name=f"libnvidia-gl-{b}", description="NVIDIA OpenGL/GLX/EGL/GLES GLVND libraries and Vulkan ICD",
        multi_arch="same",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-common-{b}"), kcommon_virtual],
        provides=["libnvidia-gl", "libegl-vendor", "libglx-vendor"],
        conflicts=["libnvidia-gl"], replaces=["libnvidia-gl"],
    )
    lib(gl, "libGLX_nvidia.so", upstream, "0")
    lib(gl, "libEGL_nvidia.so", upstream, "0")
    gl.files[f"{LIBDIR}/libnvidia-glcore.so.{upstream}"] = (marker("library", "libnvidia-glcore.so", upstream), 0o644)

    extra = pk(
        name=f"libnvidia-extra-{b}", description="Extra libraries for the NVIDIA driver", multi_arch="same",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-compute-{b}"), kcommon_virtual],
    )
    extra.files[f"{LIBDIR}/libnvidia-cfg-extra.stand-in.{upstream}"] = (marker("library", "extra", upstream), 0o644)

    fbc = pk(
        name=f"libnvidia-fbc1-{b}", description="NVIDIA OpenGL-based Framebuffer Capture runtime library",
        multi_arch="same",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-gl-{b}"), kcommon_virtual],
        provides=["libnvidia-fbc1"], conflicts=["libnvidia-fbc1"], replaces=["libnvidia-fbc1"],
    )
    lib(fbc, "libnvidia-fbc.so", upstream)

    cfg = pk(
        name=f"libnvidia-cfg1-{b}", description="NVIDIA binary OpenGL/GLX configuration library",
        multi_arch="same",
        depends=["libc6 (>= 2.34)", kcommon_virtual],
        provides=["libnvidia-cfg.so.1 (= " + upstream + ")", "libnvidia-cfg1"],
        conflicts=["libnvidia-cfg1"], replaces=["libnvidia-cfg1"],
    )
    lib(cfg, "libnvidia-cfg.so", upstream)

    utils = pk(
        name=f"nvidia-utils-{b}", description="NVIDIA driver support binaries", section="utils",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-compute-{b}"), "python3"],
        provides=["nvidia-utils"], conflicts=["nvidia-utils"], replaces=["nvidia-utils"],
    )
    utils.files["usr/bin/nvidia-smi"] = (smi_source.replace("@NVIDIA_SMI_VERSION@", upstream).encode(), 0o755)

    cutils = pk(
        name=f"nvidia-compute-utils-{b}", description="NVIDIA compute utilities", section="utils",
        depends=["libc6 (>= 2.34)", exact(f"libnvidia-compute-{b}")],
        provides=["nvidia-compute-utils"], conflicts=["nvidia-compute-utils"], replaces=["nvidia-compute-utils"],
    )
    for tool in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        cutils.files[f"usr/bin/{tool}"] = (
            f"#!/bin/sh\n# {STAND_IN_NOTE}\necho '{tool}: lab stand-in, no GPUs here' >&2\nexit 1\n".encode(), 0o755)

    kcommon = pk(
        name=f"nvidia-kernel-common-{b}", description="Shared files used with the kernel module", section="kernel",
        depends=[exact(firmware)],
        provides=[kcommon_virtual, "nvidia-kernel-common"],
        conflicts=["nvidia-kernel-common"], replaces=["nvidia-kernel-common"],
    )
    kcommon.files[f"usr/share/doc/nvidia-kernel-common-{b}/README.dflash-lab"] = (
        marker("kernel common", kcommon.name, upstream), 0o644)

    fw = pk(name=firmware, description="Firmware files used by the kernel module", section="kernel")
    for blob in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        fw.files[f"usr/lib/firmware/nvidia/{upstream}/{blob}"] = (marker("firmware", blob, upstream), 0o644)

    return [compute, common, decode, encode, gl, extra, fbc, cfg, utils, cutils, kcommon, fw]


TRAP_POSTINST = """#!/bin/sh
# {note}
# Trap: this package must never be installed in an LXC container.
set -e
mkdir -p /var/lib/dflash-lab/trap-installed
echo "{name} {version}" > /var/lib/dflash-lab/trap-installed/{name}
echo "{name}: refusing to configure in a container (kernel-side package; lab trap)" >&2
exit 1
"""


def trap_set(branch: str, upstream: str, revision: str, kernel: str, kernel_version: str) -> list[Package]:
    """Packages a naive `*.deb` glob would catch: DKMS, the driver metapackage, prebuilt modules."""
    v = f"{upstream}-{revision}"
    traps: list[Package] = []
    for flavor in ("", "-open"):
        b = f"{branch}{flavor}"
        dkms = Package(
            name=f"nvidia-dkms-{b}", version=v, source_branch=branch, section="kernel",
            description="NVIDIA DKMS package" + (" (open kernel module)" if flavor else ""),
            depends=["dkms (>= 3.0.3)", f"nvidia-kernel-common-{branch} (= {v})",
                     f"nvidia-kernel-source-{b} (= {v})", f"nvidia-firmware-{branch}-{upstream} (= {v})"],
            provides=["nvidia-dkms-kernel"], conflicts=["nvidia-dkms-kernel"],
        )
        driver = Package(
            name=f"nvidia-driver-{b}", version=v, source_branch=branch, section="restricted/misc",
            description="NVIDIA driver " + ("(open kernel) " if flavor else "") + "metapackage",
            depends=[f"{p} (= {v})" for p in (
                f"nvidia-dkms-{b}", f"nvidia-kernel-common-{branch}", f"libnvidia-compute-{branch}",
                f"libnvidia-extra-{branch}", f"nvidia-compute-utils-{branch}", f"libnvidia-decode-{branch}",
                f"libnvidia-encode-{branch}", f"nvidia-utils-{branch}", f"xserver-xorg-video-nvidia-{branch}",
                f"libnvidia-cfg1-{branch}", f"libnvidia-fbc1-{branch}", f"libnvidia-gl-{branch}")],
            provides=["nvidia-driver-binary"], conflicts=["nvidia-driver-binary"],
        )
        mods = Package(
            name=f"linux-modules-nvidia-{b}-{kernel}", version=kernel_version, section="kernel",
            description=f"Linux kernel nvidia modules for version {kernel.rsplit('-', 1)[0]}",
            depends=[f"linux-image-{kernel} | linux-image-unsigned-{kernel}",
                     f"linux-signatures-nvidia-{kernel} (= {kernel_version})",
                     f"linux-objects-nvidia-{b}-{kernel} (= {kernel_version})",
                     f"nvidia-kernel-common-{branch} (>= {upstream})"],
        )
        for pkg in (dkms, driver, mods):
            pkg.postinst = TRAP_POSTINST.format(note=STAND_IN_NOTE, name=pkg.name, version=pkg.version)
            pkg.files[f"usr/share/doc/{pkg.name}/README.dflash-lab"] = (
                marker("trap package", pkg.name, pkg.version), 0o644)
            traps.append(pkg)
    return traps


def kernel_package_version(kernel: str, upstream: str, all_versions: list[str]) -> str:
    """Ubuntu-style linux-modules-nvidia version: kernel ABI plus a rebuild counter per driver version."""
    base, abi = kernel.split("-")[0], kernel.split("-")[1]
    branch = upstream.split(".")[0]
    same_branch = sorted((x for x in all_versions if x.split(".")[0] == branch), key=version_key)
    return f"{base}-{abi}.{int(abi) + 3}+{same_branch.index(upstream) + 1}"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def build_package(pkg: Package, out_dir: Path) -> Path:
    """Lay the package out in a temporary tree and run dpkg-deb --build."""
    with tempfile.TemporaryDirectory(prefix="dflash-deb-") as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(pkg.control())
        if pkg.postinst:
            (root / "DEBIAN" / "postinst").write_text(pkg.postinst)
            (root / "DEBIAN" / "postinst").chmod(0o755)
        doc = root / "usr" / "share" / "doc" / pkg.name / "README.dflash-lab"
        if f"usr/share/doc/{pkg.name}/README.dflash-lab" not in pkg.files:
            doc.parent.mkdir(parents=True, exist_ok=True)
            doc.write_bytes(marker("package", pkg.name, pkg.version))
        for rel, (content, mode) in pkg.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(mode)
        for rel, target in pkg.links.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)
        for path in sorted(root.rglob("*"), reverse=True):
            os.utime(path, (EPOCH, EPOCH), follow_symlinks=False)
        target = out_dir / pkg.filename
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH))
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(target)],
            check=True, stdout=subprocess.DEVNULL, env=env,
        )
        return target


def stamp_for(versions: list[str], revision: str, kernel: str) -> str:
    """Hash of everything that shapes the output, so a changed script triggers a rebuild."""
    h = hashlib.sha256()
    for path in (Path(__file__).resolve(), KIT / "nvidia_smi.py"):
        h.update(path.read_bytes())
    h.update(json.dumps([sorted(versions), revision, kernel]).encode())
    return h.hexdigest()


def build_all(out: Path, versions: list[str], revision: str, kernel: str, force: bool = False) -> dict:
    """Build every version's user-space and trap packages; return the manifest."""
    stamp = stamp_for(versions, revision, kernel)
    stamp_file = out / ".stamp"
    manifest_file = out / "manifest.json"
    if not force and stamp_file.is_file() and stamp_file.read_text().strip() == stamp and manifest_file.is_file():
        return json.loads(manifest_file.read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    smi_source = (KIT / "nvidia_smi.py").read_text()
    manifest: dict = {"revision": revision, "kernel": kernel, "versions": {}}
    for upstream in sorted(versions, key=version_key):
        branch = upstream.split(".")[0]
        entry: dict = {"branch": branch, "version": f"{upstream}-{revision}", "userspace": [], "traps": []}
        for kind, pkgs in (
            ("userspace", userspace_set(branch, upstream, revision, smi_source)),
            ("traps", trap_set(branch, upstream, revision, kernel,
                               kernel_package_version(kernel, upstream, versions))),
        ):
            kind_dir = out / upstream / kind
            kind_dir.mkdir(parents=True)
            for pkg in pkgs:
                build_package(pkg, kind_dir)
                entry[kind].append({"package": pkg.name, "version": pkg.version,
                                    "file": f"{upstream}/{kind}/{pkg.filename}"})
        manifest["versions"][upstream] = entry
    manifest_file.write_text(json.dumps(manifest, indent=2) + "\n")
    stamp_file.write_text(stamp + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    parser.add_argument("--versions", default=",".join(DEFAULT_VERSIONS),
                        help="comma-separated upstream versions (default: %(default)s)")
    parser.add_argument("--revision", default=DEFAULT_REVISION, help="Debian revision (default: %(default)s)")
    parser.add_argument("--kernel", default=DEFAULT_KERNEL, help="kernel release for linux-modules-nvidia traps")
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = parser.parse_args(argv)
    if shutil.which("dpkg-deb") is None:
        print("build_debs: dpkg-deb not found; expected the dpkg package on this machine. "
              "Install it with: apt-get install -y dpkg-dev", file=sys.stderr)
        return 1
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    started = time.monotonic()
    manifest = build_all(args.out, versions, args.revision, args.kernel, args.force)
    count = sum(len(e["userspace"]) + len(e["traps"]) for e in manifest["versions"].values())
    print(f"build_debs: {count} packages for {', '.join(sorted(manifest['versions']))} in {args.out} "
          f"({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
