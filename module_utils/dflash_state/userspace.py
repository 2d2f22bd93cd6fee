"""The NVIDIA user space in a container: dpkg's NVIDIA packages (with holds) and the libraries the loader
finds with their owning packages, printed in the tab-separated record format the controller parses
(dflash_infra.driver.parse_userspace_probe):

    arch <arch>
    pkg  <package> <version> <dpkg status abbreviation>
    lib  <soname> <path> <resolved file> <owning package, empty when no package owns it>
"""

from __future__ import annotations

import os
import platform

from .commands import run

SONAMES = ("libnvidia-ml.so.1", "libcuda.so.1")
# Where the loader and container runtimes put the driver libraries (a bind-mounted /usr/local/nvidia/lib64
# from a container runtime included), after ldconfig's cache.
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/nvidia/lib64")
PACKAGE_PATTERNS = ("*nvidia*", "dkms", "cuda-drivers*")


def _arch() -> str:
    result = run(["dpkg", "--print-architecture"])
    return result["stdout"].strip() if result["rc"] == 0 and result["stdout"].strip() else platform.machine()


def _packages() -> list[str]:
    # dpkg-query exits 1 when one of the patterns matches nothing; the other lines are still printed.
    result = run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", *PACKAGE_PATTERNS])
    return [f"pkg\t{line}" for line in result["stdout"].splitlines() if line.strip()]


def _library_paths(soname: str) -> list[str]:
    paths: list[str] = []
    cache = run(["ldconfig", "-p"])
    for line in cache["stdout"].splitlines():
        words = line.split()
        if words and words[0] == soname:
            paths.append(words[-1])
    paths += [os.path.join(d, soname) for d in LIBRARY_DIRS if os.path.exists(os.path.join(d, soname))]
    return list(dict.fromkeys(paths))


def _owners(files: list[str]) -> dict[str, str]:
    """file -> owning package for the files dpkg knows (one dpkg-query call for all of them)."""
    if not files:
        return {}
    result = run(["dpkg-query", "-S", *files])
    owners: dict[str, str] = {}
    for line in result["stdout"].splitlines():
        package, sep, path = line.partition(": ")
        if sep:
            owners.setdefault(path.strip(), package.split(",")[0].split(":")[0].strip())
    return owners


def dpkg_health() -> dict[str, object]:
    """What an interrupted dpkg run leaves behind: `dpkg --audit`'s report and, only when it reports something,
    `apt-get check`'s exit code (apt loads its whole cache for it, a third of a second on a converged host)."""
    audit = run(["dpkg", "--audit"])
    out: dict[str, object] = {"audit": audit["stdout"], "audit_rc": audit["rc"], "apt_check_rc": None}
    if audit["stdout"].strip():
        check = run(["apt-get", "check", "-q"])
        out.update(apt_check_rc=check["rc"], apt_check_output=(check["stdout"] + check["stderr"])[-2000:])
    return out


def probe() -> str:
    """The record text described above (read-only)."""
    lines = [f"arch\t{_arch()}", *_packages()]
    found = [(soname, path, os.path.realpath(path)) for soname in SONAMES for path in _library_paths(soname)]
    owners = _owners(sorted({resolved for _, _, resolved in found}))
    lines += [f"lib\t{soname}\t{path}\t{resolved}\t{owners.get(resolved, '')}" for soname, path, resolved in found]
    return "\n".join(lines) + "\n"
