"""NVIDIA user space vs kernel module: probe parsing, the alignment plan, apt's closure check, the deny list.

Inputs mimic the real formats exactly: dpkg-query's tab-separated records, apt's cache file names
(name_version_arch.deb, ':' as %3a), `apt-get -s` and `apt-cache madison` lines, `dpkg --audit` text, and
the H200 test machine's bind-mounted libraries (tests/fixtures/nvidia/h200-test-machine/misc.txt).
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_infra import driver
from dflash_infra.parsers import parse_driver
from helpers import ROOT

sys.path.insert(0, str(ROOT / "filter_plugins"))
import driver as driver_filters

REV = "0ubuntu0.24.04.1"
CACHE = "/var/cache/apt/archives"
# Ubuntu 24.04's user-space packages of one branch (source nvidia-graphics-drivers-B), without the firmware.
USERSPACE = ("libnvidia-cfg1-{b}", "libnvidia-common-{b}", "libnvidia-compute-{b}", "libnvidia-decode-{b}",
             "libnvidia-encode-{b}", "libnvidia-extra-{b}", "libnvidia-fbc1-{b}", "libnvidia-gl-{b}",
             "nvidia-compute-utils-{b}", "nvidia-kernel-common-{b}", "nvidia-utils-{b}")
ARCH_ALL = {"libnvidia-common"}
INCIDENT_PROC = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.126.09  Tue Jan  6 21:04:43 UTC 2026\n"
                 "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def names(branch: str, version: str) -> list[str]:
    return [n.format(b=branch) for n in USERSPACE] + [f"nvidia-firmware-{branch}-{version}"]


def deb_path(name: str, version: str, directory: str = CACHE) -> str:
    arch = "all" if name.rsplit("-", 1)[0] in ARCH_ALL else "amd64"
    return f"{directory}/{name}_{version.replace(':', '%3a')}_{arch}.deb"


def cache_debs(version: str, branch: str | None = None, traps: bool = True) -> list[str]:
    branch = branch or version.split(".")[0]
    full = f"{version}-{REV}"
    paths = [deb_path(n, full) for n in names(branch, version)]
    if traps:
        paths += [deb_path(f"nvidia-dkms-{branch}", full), deb_path(f"nvidia-driver-{branch}-open", full),
                  f"{CACHE}/linux-modules-nvidia-{branch}-6.8.0-60-generic_6.8.0-60.63+1_amd64.deb"]
    return paths


def probe_text(version: str | None, branch: str = "580", lib_dir: str = LIBDIR, owned: bool = True,
               extra_pkgs: str = "") -> str:
    """What module_utils/dflash_state/userspace.py (in dflash_host_state) prints
    (dpkg-query's ${Package}\\t${Version}\\t${db:Status-Abbrev})."""
    lines = ["arch\tamd64"]
    if version:
        lines += [f"pkg\t{n}\t{version}-{REV}\tii " for n in names(branch, version)]
        lines += ["pkg\tlibnvidia-compute\t\tun ", f"pkg\tnvidia-kernel-common-{branch}-{version}\t\tun "]
    lines += [line for line in extra_pkgs.splitlines() if line]
    if version:
        owner = f"libnvidia-compute-{branch}" if owned else ""
        for so in ("libnvidia-ml.so", "libcuda.so"):
            lines.append(f"lib\t{so}.1\t{lib_dir}/{so}.1\t{lib_dir}/{so}.{version}\t{owner}")
    return "\n".join(lines) + "\n"


def incident(version: str = "580.159.03", kernel: str = INCIDENT_PROC, **kw) -> dict:
    return {"kernel_module": parse_driver(kernel).to_dict(),
            "probe": driver.parse_userspace_probe(probe_text(version, **kw)),
            "smi": driver.smi_status(18, "Failed to initialize NVML: Driver/library version mismatch\n"
                                         "NVML library version: 580.159\n")}


def plan_for(debs: list[str], version: str = "580.159.03", kernel: str = INCIDENT_PROC, madison: str = "",
             **kw) -> driver.AlignmentPlan:
    state = incident(version, kernel, **kw)
    return driver.plan_alignment(state["kernel_module"], state["probe"], state["smi"], debs,
                                 driver.parse_madison(madison), apt_searched=bool(madison))


# --------------------------------------------------------------------------- Debian versions


KNOWN_ORDER = [
    "580.95.05-0ubuntu1", "580.126.09-0ubuntu0.24.04.1", "580.126.09-0ubuntu0.24.04.2",
    "580.126.09-1ubuntu1", "580.159.03-0ubuntu0.24.04.1", "595.71.05-0ubuntu0.24.04.1", "1:1.0-1",
]


def test_known_driver_versions_sort_like_dpkg() -> None:
    for low, high in itertools.pairwise(KNOWN_ORDER):
        assert driver.compare_versions(low, high) == -1, (low, high)
        assert driver.compare_versions(high, low) == 1
    assert driver.compare_versions("1.0~rc1-1", "1.0-1") == -1
    assert driver.compare_versions("580.126.09-1", "580.126.09-1") == 0


_VERSION_TEXT = st.builds(
    lambda epoch, up, rev: (f"{epoch}:" if epoch else "") + up + (f"-{rev}" if rev else ""),
    st.sampled_from([0, 0, 1]),
    st.from_regex(r"[0-9][0-9a-z.+~]{0,6}", fullmatch=True),
    st.one_of(st.just(""), st.from_regex(r"[0-9a-z.+~]{1,5}", fullmatch=True)),
)


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="needs dpkg to compare against")
@settings(max_examples=150, deadline=None)
@given(_VERSION_TEXT, _VERSION_TEXT)
def test_compare_versions_agrees_with_dpkg(a: str, b: str) -> None:
    ours = driver.compare_versions(a, b)
    for op, holds in (("lt", ours < 0), ("eq", ours == 0), ("gt", ours > 0)):
        real = subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True).returncode == 0
        assert real == holds, f"{a} {op} {b}: dpkg says {real}"


# --------------------------------------------------------------------------- deny list


@pytest.mark.parametrize("name", [
    "nvidia-dkms-580", "nvidia-dkms-580-open", "nvidia-driver-580", "nvidia-driver-580-open",
    "nvidia-driver-595-server-open", "nvidia-headless-580", "nvidia-headless-no-dkms-580",
    "nvidia-kernel-source-580-open", "linux-modules-nvidia-580-open-6.8.0-60-generic",
    "linux-objects-nvidia-580-6.8.0-60-generic", "linux-signatures-nvidia-6.8.0-60-generic",
    "cuda-drivers", "cuda-drivers-580", "nvidia-open", "nvidia-open-580", "dkms", "nvidia-dkms-580:amd64",
])
def test_kernel_side_packages_are_denied(name: str) -> None:
    assert driver.is_denied(name) is not None


@pytest.mark.parametrize("name", [*names("580", "580.126.09"), "nvidia-settings", "libnvidia-container1"])
def test_user_space_and_anchor_packages_are_allowed(name: str) -> None:
    assert driver.is_denied(name) is None


# --------------------------------------------------------------------------- parsing


def test_cache_file_names_parse_with_epochs_and_arch_all() -> None:
    cand = driver.parse_deb_filename(f"{CACHE}/libnvidia-common-580_580.126.09-0ubuntu0.24.04.1_all.deb")
    assert (cand.package, cand.version, cand.arch, cand.upstream) == (
        "libnvidia-common-580", "580.126.09-0ubuntu0.24.04.1", "all", "580.126.09")
    assert cand.install_arg == cand.path
    epoch = driver.parse_deb_filename(f"{CACHE}/bsdutils_1%3a2.38.1-5+deb12u3_amd64.deb")
    assert epoch.version == "1:2.38.1-5+deb12u3" and epoch.upstream == "2.38.1"
    assert driver.parse_deb_filename(f"{CACHE}/lock") is None
    assert driver.parse_deb_filename(f"{CACHE}/partial") is None


def test_madison_lines_become_index_candidates() -> None:
    text = (" libnvidia-compute-580 | 580.126.09-1ubuntu1 | https://developer.download.nvidia.com/compute/cuda/"
            "repos/ubuntu2404/x86_64  Packages\n"
            " libnvidia-compute-580 | 580.126.09-0ubuntu0.24.04.1 | http://archive.ubuntu.com/ubuntu "
            "noble-updates/restricted amd64 Packages\n"
            "nvidia-graphics-drivers-580 | 580.126.09-0ubuntu0.24.04.1 | http://archive.ubuntu.com/ubuntu "
            "noble-updates/restricted Sources\n")
    cands = driver.parse_madison(text)
    assert [(c.package, c.version, c.arch) for c in cands] == [
        ("libnvidia-compute-580", "580.126.09-1ubuntu1", None),
        ("libnvidia-compute-580", "580.126.09-0ubuntu0.24.04.1", "amd64")]
    assert cands[0].install_arg == "libnvidia-compute-580=580.126.09-1ubuntu1"


def test_probe_output_parses_packages_and_libraries() -> None:
    probe = driver.parse_userspace_probe(probe_text("580.159.03"))
    assert probe.arch == "amd64"
    compute = next(p for p in probe.packages if p.package == "libnvidia-compute-580")
    assert compute.upstream == "580.159.03" and compute.installed and not compute.held
    assert [lib.version for lib in probe.libraries] == ["580.159.03", "580.159.03"]
    assert all(lib.package_managed for lib in probe.libraries)
    assert driver.UserspaceProbe.from_dict(probe.to_dict()).to_dict() == probe.to_dict()
    with pytest.raises(driver.ParseError, match="expected a line starting with arch, pkg or lib"):
        driver.parse_userspace_probe("arch\tamd64\nbogus\tline\n")


def test_nvidia_smi_status_mismatch_ok_and_absent() -> None:
    mismatch = driver.smi_status(18, "Failed to initialize NVML: Driver/library version mismatch\n"
                                     "NVML library version: 580.159\n")
    assert mismatch["status"] == "mismatch" and mismatch["library_version"] == "580.159"
    assert driver.smi_status(0, "0, NVIDIA RTX A6000, 49140\n")["status"] == "ok"
    absent = driver.smi_status(2, "", "", "[Errno 2] No such file or directory: b'nvidia-smi'")
    assert absent["status"] == "absent"


def test_dpkg_audit_text_lists_the_unconfigured_packages() -> None:
    text = ("The following packages have been unpacked but not yet configured.\n"
            "They must be configured using dpkg --configure or the configure\n"
            "menu option in dselect for them to work:\n"
            " libnvidia-cfg1-580:amd64 NVIDIA binary OpenGL/GLX configuration library\n"
            " libnvidia-common-580 Shared files used by the NVIDIA libraries\n"
            " nvidia-utils-580     NVIDIA driver support binaries\n\n")
    assert driver.dpkg_audit_packages(text) == ["libnvidia-cfg1-580", "libnvidia-common-580", "nvidia-utils-580"]
    assert driver.dpkg_audit_packages("") == []


# --------------------------------------------------------------------------- driver state


def test_incident_state_is_a_mismatch() -> None:
    state = incident()
    summary = driver.driver_state(state["kernel_module"], state["probe"], state["smi"])
    assert summary["status"] == "mismatch"
    assert summary["kernel_module_version"] == "580.126.09" and summary["userspace_version"] == "580.159.03"
    assert "kernel module 580.126.09, user space 580.159.03" in summary["reason"]


def test_bind_mounted_libraries_are_not_package_managed() -> None:
    # The H200 test machine: libraries under /usr/local/nvidia/lib64, no NVIDIA package in dpkg.
    text = ("arch\tamd64\n"
            "lib\tlibnvidia-ml.so.1\t/usr/local/nvidia/lib64/libnvidia-ml.so.1\t"
            "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04\t\n"
            "lib\tlibnvidia-ml.so.1\t/lib/libnvidia-ml.so.1\t/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04\t\n"
            "lib\tlibcuda.so.1\t/usr/local/nvidia/lib64/libcuda.so.1\t/usr/local/nvidia/lib64/libcuda.so.580.159.04\t\n")
    proc = (ROOT / "tests/fixtures/nvidia/h200-test-machine/proc-driver-nvidia-version.txt").read_text()
    kernel = parse_driver(proc).to_dict()
    probe = driver.parse_userspace_probe(text)
    plan = driver.plan_alignment(kernel, probe, {"status": "ok"}, cache_debs("580.159.04"))
    assert plan.status == "not_package_managed"
    assert "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04" in plan.reason
    assert "not package managed" in plan.reason and plan.install_args == []


def test_no_kernel_module_and_no_user_space() -> None:
    probe = driver.parse_userspace_probe(probe_text("580.126.09"))
    assert driver.plan_alignment({}, probe, {"status": "absent"}).status == "no_kernel_module"
    empty = driver.parse_userspace_probe(probe_text(None))
    kernel = parse_driver(INCIDENT_PROC).to_dict()
    assert driver.plan_alignment(kernel, empty, {"status": "absent"}).status == "no_userspace"


# --------------------------------------------------------------------------- the plan


def test_incident_plan_downgrades_the_whole_set_in_one_transaction() -> None:
    plan = plan_for(cache_debs("580.126.09") + cache_debs("580.159.03"))
    assert plan.status == "align" and plan.kernel_version == "580.126.09"
    assert plan.branch == plan.target_branch == "580"
    assert plan.package_set == sorted(names("580", "580.126.09"))
    actions = {c.package: c.action for c in plan.changes}
    assert actions.pop("nvidia-firmware-580-580.126.09") == "install"
    assert actions.pop("nvidia-firmware-580-580.159.03") == "remove"
    assert set(actions.values()) == {"downgrade"} and len(actions) == 11
    assert all(a.startswith(CACHE) and "580.126.09" in a for a in plan.install_args[:-1])
    assert plan.install_args[-1] == "nvidia-firmware-580-580.159.03-"
    assert not any(driver.is_denied(a.rsplit("/", 1)[-1].split("_")[0]) for a in plan.install_args)
    line = next(c.line() for c in plan.changes if c.package == "libnvidia-compute-580")
    assert line.startswith("libnvidia-compute-580 580.159.03-0ubuntu0.24.04.1 -> 580.126.09-0ubuntu0.24.04.1 "
                           "(downgrade, from /var/cache/apt/archives/")
    assert plan.hold == plan.package_set and plan.held == []


def test_aligned_host_plans_nothing() -> None:
    plan = plan_for(cache_debs("580.126.09"), version="580.126.09")
    assert plan.status == "aligned" and plan.changes == [] and plan.install_args == []
    assert plan.hold == sorted(names("580", "580.126.09"))


def test_missing_debs_fail_before_any_change_and_say_where_to_get_them() -> None:
    debs = [d for d in cache_debs("580.126.09") if "libnvidia-compute-580_" not in d and "firmware" not in d]
    plan = plan_for(debs + cache_debs("580.159.03"))
    assert plan.status == "missing" and plan.changes == [] and plan.install_args == []
    assert {m["package"] for m in plan.missing} == {"libnvidia-compute-580", "nvidia-firmware-580-580.126.09"}
    assert "libnvidia-compute-580_580.126.09-*_{amd64,all}.deb" in plan.reason
    assert "nothing was changed" in plan.reason and "/var/cache/apt/archives" in plan.reason
    assert "cuda/repos" in plan.reason


def test_apt_index_fills_what_the_cache_lacks() -> None:
    debs = [d for d in cache_debs("580.126.09") if "libnvidia-compute-580_" not in d]
    madison = (" libnvidia-compute-580 | 580.126.09-0ubuntu0.24.04.1 | http://archive.ubuntu.com/ubuntu "
               "noble-updates/restricted amd64 Packages\n"
               " libnvidia-compute-580 | 580.126.09-1ubuntu1 | https://developer.download.nvidia.com/compute/cuda/"
               "repos/ubuntu2404/x86_64  Packages\n")
    plan = plan_for(debs, madison=madison)
    assert plan.status == "align"
    # The revision the rest of the set has wins over the higher CUDA-repo revision (exact-version Depends).
    assert "libnvidia-compute-580=580.126.09-0ubuntu0.24.04.1" in plan.install_args
    compute = next(c for c in plan.changes if c.package == "libnvidia-compute-580")
    assert compute.source.startswith("apt (")


def test_other_branch_without_its_packages_is_refused() -> None:
    kernel = INCIDENT_PROC.replace("580.126.09", "595.71.05")
    plan = plan_for(cache_debs("580.126.09") + cache_debs("580.159.03"), kernel=kernel)
    assert plan.status == "refuse" and plan.changes == []
    assert "kernel module is 595.71.05 (branch 595) but user space is branch 580" in plan.reason
    assert "Refusing to change anything" in plan.reason


def test_other_branch_with_its_packages_switches_the_whole_set() -> None:
    kernel = INCIDENT_PROC.replace("580.126.09", "595.71.05")
    plan = plan_for(cache_debs("595.71.05") + cache_debs("580.159.03"), kernel=kernel)
    assert plan.status == "align" and plan.target_branch == "595"
    assert plan.package_set == sorted(names("595", "595.71.05"))
    removed = sorted(c.package for c in plan.changes if c.action == "remove")
    assert removed == sorted(names("580", "580.159.03"))
    assert all(c.action == "install" for c in plan.changes if c.action != "remove")


def test_trap_package_in_the_installed_set_is_never_planned() -> None:
    extra = f"pkg\tnvidia-dkms-580\t580.159.03-{REV}\tii \n"
    plan = plan_for(cache_debs("580.126.09"), extra_pkgs=extra)
    assert "nvidia-dkms-580" not in plan.package_set
    assert not any("dkms" in a for a in plan.install_args)


# --------------------------------------------------------------------------- apt's closure


USERSPACE_580 = [n.format(b="580") for n in USERSPACE]
# `apt-get -s install` of the 580.126.09 .debs over 580.159.03 (apt 2.6 in the lab), plus the firmware swap.
SIM_INCIDENT = "".join(
    [f"Inst {n} [580.159.03-{REV}] (580.126.09-{REV} local-deb [amd64]) []\n" for n in USERSPACE_580]
    + [f"Inst nvidia-firmware-580-580.126.09 (580.126.09-{REV} local-deb [amd64])\n",
       f"Remv nvidia-firmware-580-580.159.03 [580.159.03-{REV}]\n"]
    + [f"Conf {n} (580.126.09-{REV} local-deb [amd64])\n" for n in USERSPACE_580])


def test_simulation_of_the_incident_matches_the_plan() -> None:
    plan = plan_for(cache_debs("580.126.09") + cache_debs("580.159.03")).to_dict()
    check = driver.check_transaction(SIM_INCIDENT, plan)
    assert check["ok"], check["errors"]
    assert check["extra"] == []


def test_closure_that_pulls_in_dkms_is_refused() -> None:
    plan = plan_for(cache_debs("580.126.09") + cache_debs("580.159.03")).to_dict()
    sim = SIM_INCIDENT + f"Inst dkms (3.0.10-8+deb12u1 Debian:12.11/stable [all])\n" \
                         f"Inst nvidia-dkms-580 (580.126.09-{REV} local-deb [amd64])\n"
    check = driver.check_transaction(sim, plan)
    assert not check["ok"]
    assert any("nvidia-dkms-580" in e and "deny list" in e for e in check["errors"])
    assert any(e.startswith("the transaction would install dkms") for e in check["errors"])


def test_closure_that_removes_an_unplanned_package_is_refused() -> None:
    plan = plan_for(cache_debs("580.126.09") + cache_debs("580.159.03")).to_dict()
    check = driver.check_transaction(SIM_INCIDENT + "Remv python3-torch [2.5.1]\n", plan)
    assert not check["ok"] and "would remove python3-torch 2.5.1" in check["errors"][0]


def test_closure_at_the_wrong_version_is_refused() -> None:
    plan = plan_for(cache_debs("580.126.09") + cache_debs("580.159.03")).to_dict()
    sim = SIM_INCIDENT.replace("Inst libnvidia-gl-580 [580.159.03-0ubuntu0.24.04.1] (580.126.09",
                               "Inst libnvidia-gl-580 [580.159.03-0ubuntu0.24.04.1] (580.142")
    check = driver.check_transaction(sim, plan)
    assert any("apt chose libnvidia-gl-580 580.142" in e for e in check["errors"])


# --------------------------------------------------------------------------- apt configuration, filters


def test_pin_stanza_pins_the_upstream_version_at_1001() -> None:
    text = driver.pin_preferences(["nvidia-utils-580", "libnvidia-compute-580"], "580.126.09")
    assert "Package: libnvidia-compute-580 nvidia-utils-580\n" in text
    assert "Pin: version 580.126.09-*\n" in text and text.endswith("Pin-Priority: 1001\n")
    with pytest.raises(ValueError, match="at least one package"):
        driver.pin_preferences([], "580.126.09")


def test_filters_are_thin_adapters_over_the_library() -> None:
    filters = driver_filters.FilterModule().filters()
    state = incident()
    host = {"kernel_module": state["kernel_module"], "userspace": state["probe"].to_dict(), "smi": state["smi"],
            "debs": cache_debs("580.126.09")}
    plan = filters["dflash_driver_plan_from_state"](host, [])
    assert plan["status"] == "align" and plan["needs_transaction"]
    assert filters["dflash_driver_check_transaction"](SIM_INCIDENT, plan)["ok"]
    # A deny pattern of the inventory is added to the built-in list, never replaces it.
    assert not filters["dflash_driver_check_transaction"](SIM_INCIDENT, plan, ["libnvidia-compute-580"])["ok"]
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="at least one package"):
        filters["dflash_driver_pin"]([], "580.126.09")
