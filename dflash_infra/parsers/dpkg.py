"""Debian package versions and names (NVIDIA driver branches), dpkg-query -W and dpkg -l."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflash_infra.parsers.common import VERSION, Json, ParseError, one_line

_UPSTREAM = re.compile(r"[0-9][A-Za-z0-9.+~-]*")
_REVISION = re.compile(r"[A-Za-z0-9.+~]+")


def debian_upstream(version: str, source: str = "package version") -> str:
    """The upstream part of a Debian version: epoch and Debian revision stripped.

    '580.126.09-0ubuntu0.24.04.1' -> '580.126.09'; '1:1.1.13-1ubuntu0.1' -> '1.1.13'. NVIDIA
    user space must equal the kernel module on this part only (Ubuntu and CUDA-repo
    revisions differ for the same driver).
    """
    text = version.strip()
    epoch, colon, rest = text.partition(":")
    if not colon:
        epoch, rest = "", text
    elif not epoch.isdigit():
        raise ParseError(
            source, f"expected a Debian version like '1:2.3-4', the epoch must be a number, found {version!r}"
        )
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    if not _UPSTREAM.fullmatch(upstream) or (dash and not _REVISION.fullmatch(revision)):
        raise ParseError(
            source, f"expected a Debian version like '580.126.09-0ubuntu0.24.04.1', found {version!r}"
        )
    return upstream


def _split_arch(package: str) -> tuple[str, str | None]:
    name, colon, arch = package.partition(":")
    return name, (arch if colon else None)


def nvidia_branch(package: str) -> str | None:
    """The NVIDIA driver branch a package belongs to, from its name; None for packages outside a branch.

    'libnvidia-compute-580:amd64' -> '580'; 'nvidia-firmware-580-580.126.09' -> '580';
    'libnvidia-compute-550-server' -> '550-server' (a separate series with its own packages);
    'nvidia-driver-580-open' -> '580'; 'nvidia-settings', 'linux-signatures-nvidia-6.8.0-40-generic' -> None.
    """
    parts = _split_arch(package.strip())[0].split("-")
    after = next((i + 1 for i, part in enumerate(parts) if "nvidia" in part), None)
    if after is None:
        return None
    for i in range(after, len(parts)):
        part = parts[i]
        if "." in part:  # a kernel or driver version: the branch, if any, came before it
            return None
        if len(part) == 3 and part.isdigit():
            server = i + 1 < len(parts) and parts[i + 1] == "server"
            return part + ("-server" if server else "")
    return None


def embedded_upstream(package: str) -> str | None:
    """A driver version carried in a package NAME: 'nvidia-firmware-580-580.95.05' -> '580.95.05'."""
    name = _split_arch(package.strip())[0]
    branch = nvidia_branch(name)
    if branch is None:
        return None
    parts = name.split("-")
    branch_parts = branch.split("-")
    candidate = parts[-1]
    follows_branch = parts[-1 - len(branch_parts) : -1] == branch_parts
    if follows_branch and VERSION.fullmatch(candidate) and candidate.startswith(branch_parts[0] + "."):
        return candidate
    return None


# Desired action, package state and error flag letters of dpkg's status abbreviation.
_DESIRED, _STATE, _ERROR = "uihrp", "ncHUFWti", " R"


def _valid_status(status: str) -> bool:
    return (
        2 <= len(status) <= 3
        and status[0] in _DESIRED
        and status[1] in _STATE
        and (len(status) == 2 or status[2] in _ERROR)
    )


@dataclass
class DpkgPackage:
    """One package as dpkg reports it. `status` is dpkg's abbreviation ('ii', 'hi', 'rc', 'iU', ...)."""

    package: str
    version: str
    upstream: str | None
    status: str | None
    arch: str | None = None

    @property
    def installed(self) -> bool:
        """Unpacked and configured ('ii' or 'hi'); 'rc', 'iU', 'iF' are not usable installs."""
        return self.status is not None and self.status[1] == "i"

    @property
    def held(self) -> bool:
        return self.status is not None and self.status[0] == "h"

    def to_dict(self) -> Json:
        return {
            "package": self.package,
            "arch": self.arch,
            "version": self.version,
            "upstream": self.upstream,
            "status": self.status,
            "installed": self.installed,
            "held": self.held,
        }


def _package(
    name: str, version: str, status: str | None, arch: str | None, source: str, line: int
) -> DpkgPackage:
    package, name_arch = _split_arch(name)
    try:
        upstream = debian_upstream(version, source) if version else None
    except ParseError:
        raise ParseError(source, f"{package}: expected a Debian version, found {version!r}", line) from None
    return DpkgPackage(
        package=package, version=version, upstream=upstream, status=status, arch=arch or name_arch
    )


def parse_dpkg_query(text: str, source: str = "dpkg-query -W") -> list[DpkgPackage]:
    """Tab-separated `dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'` output.

    The status column is optional (plain `dpkg-query -W` prints package and version only)."""
    packages: list[DpkgPackage] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3) or not fields[0].strip():
            raise ParseError(
                source,
                f"expected 'package<TAB>version[<TAB>status]', "
                f"found {len(fields)} tab-separated fields: {one_line(line)!r}",
                number,
            )
        status = (fields[2].rstrip() or None) if len(fields) == 3 else None
        if status is not None and not _valid_status(status):
            raise ParseError(source, f"expected a dpkg status like 'ii' or 'rc', found {fields[2]!r}", number)
        packages.append(_package(fields[0].strip(), fields[1].strip(), status, None, source, number))
    return packages


def _is_dpkg_list_header(line: str) -> bool:
    return line.startswith(("Desired=", "| Status=", "|/ Err?=", "||/ ", "+++-"))


def parse_dpkg_list(text: str, source: str = "dpkg -l") -> list[DpkgPackage]:
    """Rows of `dpkg -l` (also piped through grep, or cut down to status, name and version)."""
    packages: list[DpkgPackage] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or _is_dpkg_list_header(line):
            continue
        words = line.split(None, 4)
        if len(words) < 3 or not _valid_status(words[0]):
            raise ParseError(
                source,
                "expected a dpkg -l row '<status> <package> <version> [<arch> <description>]', "
                f"found {one_line(line)!r}",
                number,
            )
        arch = words[3] if len(words) >= 4 else None
        packages.append(_package(words[1], words[2], words[0], arch, source, number))
    return packages
