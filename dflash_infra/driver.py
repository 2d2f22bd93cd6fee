"""NVIDIA user space against the host kernel module: probe parsing, the alignment plan, the apt checks.

A container's user-space libraries must equal the host's kernel module version exactly. This module
decides, from what the probe read (dpkg, the libraries, nvidia-smi) and what is on offer (.debs in a
directory, apt's indexes), which packages go from which version to which, and refuses what would make
a host worse: a missing package, a package that carries a kernel module or DKMS, a transaction that
removes something it was not asked to. Pure functions; the nvidia_userspace role only runs commands.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cmp_to_key
from typing import Any
from urllib.parse import unquote

from dflash_infra.parsers import (
    DpkgPackage,
    ParseError,
    debian_upstream,
    embedded_upstream,
    library_version_from_path,
    nvidia_branch,
    parse_dpkg_query,
    parse_nvml,
)

Json = dict[str, Any]

# Packages that carry or build a kernel module, or pull one in: never installed in an LXC container,
# where the host owns the module. Full-match regular expressions on the package name.
DENY_PATTERNS: tuple[str, ...] = (
    r"nvidia-dkms-.*",
    r"nvidia-kernel-source-.*",
    r"nvidia-driver-.*",
    r"nvidia-headless-.*",
    r"nvidia-open(-.*)?",
    r"linux-modules-nvidia-.*",
    r"linux-objects-nvidia-.*",
    r"linux-signatures-nvidia-.*",
    r"linux-image-.*",
    r"linux-headers-.*",
    r"cuda-drivers(-.*)?",
    r"dkms",
)

# The libraries whose resolved file names tell the user-space version (what NVML and CUDA load).
LIBRARY_SONAMES: tuple[str, ...] = ("libnvidia-ml.so.1", "libcuda.so.1")

# Anchors every library of a branch depends on since late 2025 (virtual nvidia-kernel-common-B-V).
KERNEL_COMMON = "nvidia-kernel-common-{branch}"
FIRMWARE = "nvidia-firmware-{branch}-{version}"

DEFAULT_MISSING_HINT = (
    "copy the .debs into /var/cache/apt/archives (e.g. `apt-get download <package>=<version>` on a machine "
    "whose apt index carries that version), or add an apt repository that carries it (NVIDIA's CUDA "
    "repository, https://developer.download.nvidia.com/compute/cuda/repos/<distro>/<arch>/) and run "
    "`apt-get update`"
)


# ---------------------------------------------------------------------------------------------
# Debian versions
# ---------------------------------------------------------------------------------------------


def _order(char: str) -> int:
    """dpkg's weight of one non-digit character: '~' sorts before everything, letters before symbols."""
    if not char or char.isdigit():
        return 0
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_fragment(a: str, b: str) -> int:
    """dpkg's verrevcmp on an upstream version or a revision."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first_diff = 0
        while i < len(a) and j < len(b) and a[i].isdigit() and b[j].isdigit():
            if not first_diff and a[i] != b[j]:
                first_diff = -1 if a[i] < b[j] else 1
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split_version(version: str) -> tuple[int, str, str]:
    epoch, colon, rest = version.strip().partition(":")
    if not colon:
        epoch, rest = "0", version.strip()
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch or 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 like `dpkg --compare-versions` (epoch, then upstream, then revision)."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_fragment(ua, ub) or _compare_fragment(ra, rb)


def is_denied(package: str, patterns: Sequence[str] = DENY_PATTERNS) -> str | None:
    """The deny pattern a package name matches (it carries or pulls a kernel module), else None."""
    name = package.split(":", 1)[0]
    return next((p for p in patterns if re.fullmatch(p, name)), None)


# ---------------------------------------------------------------------------------------------
# Probe output
# ---------------------------------------------------------------------------------------------


@dataclass
class Library:
    """One place a driver library is found: the path the loader sees, the file it resolves to, its owner."""

    soname: str
    path: str
    resolved: str
    owner: str | None
    version: str | None

    @property
    def package_managed(self) -> bool:
        return bool(self.owner)


@dataclass
class UserspaceProbe:
    """What the host_state user-space probe printed: architecture, NVIDIA packages, driver libraries."""

    arch: str | None
    packages: list[DpkgPackage]
    libraries: list[Library]

    def to_dict(self) -> Json:
        return {
            "arch": self.arch,
            "packages": [p.to_dict() for p in self.packages],
            "libraries": [asdict(lib) | {"package_managed": lib.package_managed} for lib in self.libraries],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UserspaceProbe:
        """Back from to_dict() (what host_state.userspace holds)."""
        packages = [DpkgPackage(package=p["package"], version=p.get("version") or "", upstream=p.get("upstream"),
                                status=p.get("status"), arch=p.get("arch")) for p in data.get("packages", [])]
        libraries = [Library(soname=lib["soname"], path=lib["path"], resolved=lib["resolved"],
                             owner=lib.get("owner"), version=lib.get("version")) for lib in data.get("libraries", [])]
        return cls(arch=data.get("arch"), packages=packages, libraries=libraries)


def parse_userspace_probe(text: str, source: str = "user-space probe") -> UserspaceProbe:
    """Tab-separated records of module_utils/dflash_state/userspace.py: 'arch', 'pkg' and 'lib' lines."""
    arch: str | None = None
    pkg_lines: list[str] = []
    libraries: list[Library] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        kind, _, rest = line.partition("\t")
        if kind == "arch":
            arch = rest.strip() or None
        elif kind == "pkg":
            pkg_lines.append(rest)
        elif kind == "lib":
            cells = rest.split("\t")
            if len(cells) != 4:
                raise ParseError(source, f"expected 'lib<TAB>soname<TAB>path<TAB>resolved<TAB>owner', "
                                         f"found {len(cells)} fields after 'lib'", number)
            soname, path, resolved, owner = (c.strip() for c in cells)
            try:
                version = library_version_from_path(resolved, source)
            except ParseError:
                version = None
            libraries.append(Library(soname, path, resolved, owner or None, version))
        else:
            raise ParseError(source, f"expected a line starting with arch, pkg or lib, found {kind!r}", number)
    packages = parse_dpkg_query("\n".join(pkg_lines), f"{source} (dpkg-query)")
    return UserspaceProbe(arch=arch, packages=packages, libraries=libraries)


def smi_status(rc: int | None, stdout: str = "", stderr: str = "", msg: str = "") -> Json:
    """nvidia-smi's state from its exit code and output: ok, mismatch, error, or absent (not installed)."""
    text = "\n".join(part for part in (stdout, stderr) if part)
    if rc is None or (rc in (2, 127) and ("No such file" in msg or "not found" in msg) and not stdout):
        return {"status": "absent", "library_version": None,
                "message": "nvidia-smi is not installed (no NVIDIA user-space utilities)"}
    status = parse_nvml(text, "nvidia-smi").to_dict()
    if rc != 0 and status["status"] == "ok":
        status.update(status="error", message=(text.strip().splitlines() or [f"exit code {rc}"])[0])
    return status


# ---------------------------------------------------------------------------------------------
# The driver state (host_state.driver)
# ---------------------------------------------------------------------------------------------


def _installed(packages: Iterable[DpkgPackage]) -> list[DpkgPackage]:
    """Packages dpkg has on disk: installed, held, or left half-way by an interrupted run (not 'rc'/'un')."""
    return [p for p in packages if p.status and p.status[1] not in ("n", "c") and p.version]


def userspace_packages(packages: Iterable[DpkgPackage], deny: Sequence[str] = DENY_PATTERNS) -> list[DpkgPackage]:
    """Installed NVIDIA packages that belong to a driver branch and are user space (not denied)."""
    return [p for p in _installed(packages) if nvidia_branch(p.package) and not is_denied(p.package, deny)]


def _loaded_library(libraries: Sequence[Library], soname: str = "libnvidia-ml.so.1") -> Library | None:
    """The first place the loader finds a library (ldconfig cache order, then the default directories)."""
    return next((lib for lib in libraries if lib.soname == soname), None)


def driver_state(kernel_module: Mapping[str, Any] | None, probe: UserspaceProbe, smi: Mapping[str, Any],
                 deny: Sequence[str] = DENY_PATTERNS) -> Json:
    """One summary of kernel module vs user space: aligned, mismatch, not_package_managed, no_userspace,
    no_kernel_module; with the versions and the reason in a sentence."""
    kernel = (kernel_module or {}).get("version")
    pkgs = userspace_packages(probe.packages, deny)
    branches = sorted({nvidia_branch(p.package) or "" for p in pkgs})
    upstreams = sorted({p.upstream for p in pkgs if p.upstream}, key=_version_key)
    loaded = _loaded_library(probe.libraries)
    lib_versions = sorted({lib.version for lib in probe.libraries if lib.version}, key=_version_key)
    userspace_version = loaded.version if loaded and loaded.version else (upstreams[-1] if upstreams else None)
    out: Json = {
        "kernel_module_version": kernel,
        "kernel_module_flavor": (kernel_module or {}).get("flavor"),
        "userspace_version": userspace_version,
        "userspace_branches": branches,
        "package_versions": upstreams,
        "library_versions": lib_versions,
        "package_managed": bool(pkgs) and not (loaded is not None and not loaded.package_managed),
        "smi_status": smi.get("status"),
    }
    if not kernel:
        return out | {"status": "no_kernel_module",
                      "reason": "no NVIDIA kernel module is visible (/proc/driver/nvidia/version); "
                                "check that the host loaded it and that the container gets the devices"}
    if loaded is not None and not loaded.package_managed:
        return out | {"status": "not_package_managed",
                      "reason": f"{loaded.soname} resolves to {loaded.resolved}, which no dpkg package owns "
                                f"(a bind mount or a container runtime provides the libraries); "
                                f"not package managed, so alignment is left to whoever provides them"}
    if not pkgs:
        return out | {"status": "no_userspace",
                      "reason": "no NVIDIA user-space packages are installed (dpkg) and no driver library was "
                                "found; there is nothing to align"}
    versions = set(upstreams) | set(lib_versions)
    if versions == {kernel}:
        return out | {"status": "aligned", "reason": f"user space equals the kernel module ({kernel})"}
    return out | {"status": "mismatch",
                  "reason": f"kernel module {kernel}, user space {', '.join(sorted(versions, key=_version_key))}"
                            f" (nvidia-smi: {smi.get('status')})"}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


# ---------------------------------------------------------------------------------------------
# What is on offer: .debs in a directory, versions in apt's indexes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A package version that can be installed: a .deb file, or a version apt's indexes carry."""

    package: str
    version: str
    arch: str | None
    source: str  # the .deb's path, or "apt" plus the index it comes from
    path: str | None = None

    @property
    def upstream(self) -> str:
        return debian_upstream(self.version, self.source)

    @property
    def install_arg(self) -> str:
        """How apt-get install names it: the .deb's absolute path, or package=version."""
        return self.path if self.path else f"{self.package}={self.version}"


_DEB_NAME = re.compile(r"(?P<package>[a-z0-9][a-z0-9+.-]+)_(?P<version>[^_]+)_(?P<arch>[a-z0-9-]+)\.deb")


def parse_deb_filename(path: str) -> Candidate | None:
    """name_version_arch.deb (apt's cache naming, ':' written as %3a) -> Candidate; None for other names."""
    match = _DEB_NAME.fullmatch(path.rsplit("/", 1)[-1])
    if not match:
        return None
    version = unquote(match["version"])
    try:
        debian_upstream(version)
    except ParseError:
        return None
    return Candidate(match["package"], version, match["arch"], path, path)


def parse_madison(text: str, source: str = "apt-cache madison") -> list[Candidate]:
    """`apt-cache madison` lines 'package | version | origin' -> candidates from apt's indexes."""
    out: list[Candidate] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith(("N:", "W:", "E:")):
            continue
        cells = [c.strip() for c in line.split("|")]
        if len(cells) != 3:
            raise ParseError(source, f"expected 'package | version | origin', found {line.strip()!r}", number)
        package, version, origin = cells
        if origin.endswith("Sources"):
            continue
        words = origin.split()
        # "<uri> <suite>/<component> <arch> Packages"; a flat repository prints "<uri>  Packages" (no arch).
        arch = words[-2] if len(words) >= 3 and words[-1] == "Packages" and "/" not in words[-2] else None
        out.append(Candidate(package, version, arch, f"apt ({origin})"))
    return out


def _best(candidates: Iterable[Candidate]) -> Candidate | None:
    """Among versions with the same upstream, the highest Debian version (a .deb before an index on a tie)."""
    best: Candidate | None = None
    for cand in candidates:
        if best is None:
            best = cand
            continue
        order = compare_versions(cand.version, best.version)
        if order > 0 or (order == 0 and cand.path and not best.path):
            best = cand
    return best


# ---------------------------------------------------------------------------------------------
# The alignment plan
# ---------------------------------------------------------------------------------------------


@dataclass
class Change:
    """One package in the transaction: from which version to which, and where the new one comes from."""

    package: str
    action: str  # downgrade | upgrade | install | remove
    from_version: str | None
    to_version: str | None
    source: str | None

    def line(self) -> str:
        if self.action == "remove":
            return f"{self.package} {self.from_version} -> (removed: the old branch's or version's package)"
        before = self.from_version or "(not installed)"
        return f"{self.package} {before} -> {self.to_version} ({self.action}, from {self.source})"


@dataclass
class AlignmentPlan:
    """The decision for one host, and everything the role needs to act on it."""

    status: str  # aligned | align | not_package_managed | no_userspace | no_kernel_module | missing | refuse
    reason: str
    kernel_version: str | None
    branch: str | None = None
    target_branch: str | None = None
    package_set: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    missing: list[Json] = field(default_factory=list)
    install_args: list[str] = field(default_factory=list)
    hold: list[str] = field(default_factory=list)
    installed: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> Json:
        return {
            "status": self.status,
            "reason": self.reason,
            "kernel_version": self.kernel_version,
            "branch": self.branch,
            "target_branch": self.target_branch,
            "package_set": self.package_set,
            "changes": [asdict(c) for c in self.changes],
            "change_lines": [c.line() for c in self.changes],
            "missing": self.missing,
            "install_args": self.install_args,
            "hold": self.hold,
            "installed": self.installed,
            "held": self.held,
            "errors": self.errors,
            "needs_transaction": bool(self.changes),
        }


def target_package_set(installed: Sequence[DpkgPackage], target_version: str) -> tuple[str | None, list[str]]:
    """The user-space branch installed now, and the package names the target version needs.

    Same names with the branch replaced by the kernel's; the firmware package renamed to the target
    version; the nvidia-kernel-common-B and nvidia-firmware-B-V anchors always included."""
    target_branch = target_version.split(".")[0]
    branches = sorted({b for p in installed if (b := nvidia_branch(p.package))})
    branch = branches[0] if len(branches) == 1 else (target_branch if target_branch in branches else None)
    names: set[str] = set()
    for pkg in installed:
        b = nvidia_branch(pkg.package)
        if b is None or b.endswith("-server") != (branch or "").endswith("-server"):
            continue
        if embedded_upstream(pkg.package):  # nvidia-firmware-B-V: follows the target version
            continue
        names.add(_rename_branch(pkg.package, b, target_branch))
    names.add(KERNEL_COMMON.format(branch=target_branch))
    names.add(FIRMWARE.format(branch=target_branch, version=target_version))
    return branch, sorted(names)


def _rename_branch(package: str, old: str, new: str) -> str:
    parts = package.split("-")
    old_first = old.split("-")[0]
    return "-".join(new if part == old_first else part for part in parts) if old_first != new else package


def plan_alignment(
    kernel_module: Mapping[str, Any] | None,
    probe: UserspaceProbe,
    smi: Mapping[str, Any],
    deb_paths: Sequence[str] = (),
    apt_candidates: Sequence[Candidate] = (),
    deny: Sequence[str] = DENY_PATTERNS,
    deb_dirs: Sequence[str] = ("/var/cache/apt/archives",),
    missing_hint: str = DEFAULT_MISSING_HINT,
    apt_searched: bool = False,
) -> AlignmentPlan:
    """Decide what to do on one host: nothing, one transaction, or refuse (with what is missing and where)."""
    state = driver_state(kernel_module, probe, smi, deny)
    kernel = state["kernel_module_version"]
    plan = AlignmentPlan(status=state["status"], reason=state["reason"], kernel_version=kernel)
    if state["status"] in ("no_kernel_module", "not_package_managed", "no_userspace"):
        return plan
    installed = userspace_packages(probe.packages, deny)
    by_name = {p.package: p for p in installed}
    plan.installed = sorted(by_name)
    plan.held = sorted(p.package for p in installed if p.held)
    plan.branch, plan.package_set = target_package_set(installed, kernel)
    plan.target_branch = kernel.split(".")[0]
    plan.hold = list(plan.package_set)

    arch = probe.arch
    offers: dict[str, list[Candidate]] = {}
    for offer in [c for c in map(parse_deb_filename, deb_paths) if c] + list(apt_candidates):
        if offer.arch in (None, "all", arch) or arch is None:
            offers.setdefault(offer.package, []).append(offer)

    matching = {name: [c for c in offers.get(name, []) if _upstream_or_none(c) == kernel] for name in plan.package_set}
    preferred = _preferred_version(matching)
    wanted = set(plan.package_set)
    for name in plan.package_set:
        have = by_name.get(name)
        if have is not None and have.upstream == kernel and have.installed:
            continue
        denied = is_denied(name, deny)
        if denied:
            plan.errors.append(f"{name} is in the package set but matches the deny list ({denied}); "
                               "it carries a kernel module or DKMS and is never installed in a container")
            continue
        cand = (next((c for c in matching[name] if c.version == preferred and c.path), None)
                or next((c for c in matching[name] if c.version == preferred), None)
                or _best(matching[name]))
        if cand is None:
            plan.missing.append({"package": name, "version": kernel,
                                 "expected_file": f"{name}_{kernel}-*_{{{arch or 'amd64'},all}}.deb"})
            continue
        action = "install"
        if have is not None:
            order = compare_versions(cand.version, have.version)
            action = "downgrade" if order < 0 else ("upgrade" if order > 0 else "reinstall")
        plan.changes.append(Change(name, action, have.version if have else None, cand.version, cand.source))
    for pkg in installed:
        if pkg.package not in wanted:
            plan.changes.append(Change(pkg.package, "remove", pkg.version, None, None))

    if plan.errors:
        plan.status, plan.reason = "refuse", "; ".join(plan.errors)
        return plan
    if plan.missing:
        same_branch = plan.branch == plan.target_branch
        nothing_of_branch = not any(_upstream_or_none(c) == kernel for cands in offers.values() for c in cands)
        where = ", ".join(deb_dirs) + (" and apt's package indexes" if apt_searched else "")
        files = "; ".join(m["expected_file"] for m in plan.missing)
        if not same_branch and nothing_of_branch:
            plan.status = "refuse"
            plan.reason = (f"the kernel module is {kernel} (branch {plan.target_branch}) but user space is branch "
                           f"{plan.branch}, and no packages of branch {plan.target_branch} at {kernel} are "
                           f"available in {where}. Refusing to change anything. Provide the branch "
                           f"{plan.target_branch} user-space set: {missing_hint}. Missing: {files}")
        else:
            plan.status = "missing"
            plan.reason = (f"{len(plan.missing)} of {len(plan.package_set)} packages of the {kernel} user-space set "
                           f"are not available in {where}; nothing was changed. Missing: {files}. "
                           f"To fix: {missing_hint}")
        plan.changes = []
        return plan
    plan.install_args = [c.source if c.source and c.source.startswith("/") else f"{c.package}={c.to_version}"
                         for c in plan.changes if c.action != "remove"]
    plan.install_args += [f"{c.package}-" for c in plan.changes if c.action == "remove"]
    if plan.changes:
        plan.status = "align"
        plan.reason = (f"{state['reason']}: {len(plan.changes)} package(s) change in one apt transaction "
                       f"to match the kernel module {kernel}")
    else:
        plan.status = "aligned"
    return plan


def plan_request(request: Mapping[str, Any]) -> Json:
    """The alignment plan from a request dict (kernel_module, probe, smi, debs, apt_candidates (madison text),
    deny (added to the deny list), deb_dirs, missing_hint, apt_searched), as the role and tests pass it."""
    madison = request.get("apt_candidates")
    plan = plan_alignment(
        request.get("kernel_module"),
        UserspaceProbe.from_dict(request["probe"]),
        request.get("smi") or {},
        deb_paths=list(request.get("debs") or []),
        apt_candidates=parse_madison(madison) if madison else [],
        deny=DENY_PATTERNS + tuple(request.get("deny") or ()),
        deb_dirs=list(request.get("deb_dirs") or ["/var/cache/apt/archives"]),
        missing_hint=request.get("missing_hint") or DEFAULT_MISSING_HINT,
        apt_searched=bool(request.get("apt_searched")),
    )
    return plan.to_dict()


def plan_from_state(state: Mapping[str, Any], deny: Sequence[str] = (), deb_dirs: Sequence[str] | None = None,
                    missing_hint: str = "", madison: str | None = None) -> Json:
    """The alignment plan for one host from its host_state; `madison` is apt-cache madison's answer once the
    package folders lacked something (None: not asked yet)."""
    return plan_request({"kernel_module": state.get("kernel_module"), "probe": state.get("userspace") or {},
                         "smi": state.get("smi") or {}, "debs": sorted(state.get("debs") or []), "deny": list(deny),
                         "deb_dirs": deb_dirs, "missing_hint": missing_hint, "apt_candidates": madison,
                         "apt_searched": madison is not None})


def _preferred_version(matching: Mapping[str, Sequence[Candidate]]) -> str | None:
    """The full version (one Debian revision) that covers most of the set, the highest on a tie.

    Libraries depend on each other at the exact version (libnvidia-decode-B (= V)), so mixing an Ubuntu
    revision and a CUDA-repo revision of the same upstream breaks the transaction."""
    coverage: dict[str, int] = {}
    for cands in matching.values():
        for version in {c.version for c in cands}:
            coverage[version] = coverage.get(version, 0) + 1
    if not coverage:
        return None
    def by_coverage_then_version(a: str, b: str) -> int:
        return (coverage[a] - coverage[b]) or compare_versions(a, b)

    return max(coverage, key=cmp_to_key(by_coverage_then_version))


def _upstream_or_none(cand: Candidate) -> str | None:
    try:
        return cand.upstream
    except ParseError:
        return None


# ---------------------------------------------------------------------------------------------
# apt's simulation: the dependency closure, checked before anything is installed
# ---------------------------------------------------------------------------------------------


@dataclass
class SimulatedAction:
    """One line of `apt-get -s`: Inst (with the version replaced, if any), Remv or Purg."""

    action: str  # Inst | Conf | Remv | Purg
    package: str
    old_version: str | None
    new_version: str | None


_SIM_LINE = re.compile(
    r"(?P<action>Inst|Conf|Remv|Purg) (?P<package>\S+)(?: \[(?P<old>[^\]]+)\])?(?: \((?P<new>\S+)[^)]*\))?")


def parse_apt_simulation(text: str) -> list[SimulatedAction]:
    """The Inst/Conf/Remv/Purg lines of `apt-get -s install ...` (a Conf without an Inst configures a
    package an interrupted run left unpacked)."""
    actions: list[SimulatedAction] = []
    for line in text.splitlines():
        match = _SIM_LINE.match(line.strip())
        if match:
            actions.append(SimulatedAction(match["action"], match["package"].split(":", 1)[0],
                                           match["old"], match["new"]))
    return actions


def check_transaction(simulation: str, plan: Mapping[str, Any], deny: Sequence[str] = DENY_PATTERNS) -> Json:
    """Compare apt's simulated transaction with the plan: refuse denied packages and unplanned removals."""
    actions = parse_apt_simulation(simulation)
    planned = {c["package"]: c for c in plan.get("changes", [])}
    kernel = plan.get("kernel_version")
    errors: list[str] = []
    extra: list[str] = []
    for act in actions:
        if act.action == "Conf":
            continue
        denied = is_denied(act.package, deny)
        if act.action == "Inst" and denied:
            errors.append(f"the transaction would install {act.package} {act.new_version} (deny list: {denied}); "
                          "it carries a kernel module or DKMS")
        elif act.action in ("Remv", "Purg"):
            if planned.get(act.package, {}).get("action") != "remove":
                errors.append(f"the transaction would remove {act.package} {act.old_version or ''}".rstrip()
                              + ", which the plan does not remove")
        elif act.package in planned:
            upstream = _safe_upstream(act.new_version)
            if upstream != kernel:
                errors.append(f"apt chose {act.package} {act.new_version}, expected upstream {kernel}")
        else:
            extra.append(f"{act.package} {act.old_version or '(new)'} -> {act.new_version}")
    simulated = {a.package for a in actions}
    not_simulated = sorted(p for p, c in planned.items() if p not in simulated)
    if not_simulated:
        errors.append(f"apt's simulation does not change {', '.join(not_simulated)}, which the plan changes")
    return {"ok": not errors, "errors": errors, "extra": extra, "actions": [asdict(a) for a in actions]}


def _safe_upstream(version: str | None) -> str | None:
    try:
        return debian_upstream(version) if version else None
    except ParseError:
        return None


# ---------------------------------------------------------------------------------------------
# apt configuration the role writes
# ---------------------------------------------------------------------------------------------


def pin_preferences(packages: Sequence[str], version: str) -> str:
    """apt_preferences(5) stanza: the set stays at the kernel module's upstream version (priority 1001)."""
    if not packages:
        raise ValueError("expected at least one package to pin, found none")
    return (f"Explanation: NVIDIA user space must equal the host kernel module {version}\n"
            f"Package: {' '.join(sorted(packages))}\n"
            f"Pin: version {version}-*\n"
            "Pin-Priority: 1001\n")


def dpkg_audit_packages(text: str) -> list[str]:
    """Package names `dpkg --audit` lists as half-installed or unconfigured (' name   description' lines)."""
    names = []
    for line in text.splitlines():
        if line.startswith(" ") and line.strip():
            word = line.split()[0]
            if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?", word):
                names.append(word.split(":", 1)[0])
    return names
