"""Hash-locked requirement files ("locks") of the venvs dflash-infra installs, and how a venv compares to one.

A lock is `uv pip compile --generate-hashes` output for one pin (a service's `pip_spec`, `name==version`) on one
target platform (a Python major.minor and `<arch>-manylinux_<glibc major>_<minor>`), under a first line that
`make locks` (tools/make_locks.py) adds and this module reads back:

    # dflash-infra lock: requirement=sglang==0.5.23 python=3.12 platform=x86_64-manylinux_2_34

The locked_venv role installs a lock with `pip install --require-hashes --no-deps -r`, so a venv holds exactly
the locked distributions; host_state reads what a venv holds (its dist-info folders) and the copy of the lock it
was last installed from, and `venv_status` decides from that on the controller.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HEADER = "# dflash-infra lock:"
# What `python -m venv` puts into every venv; compared only when a lock lists them.
TOOLING = frozenset({"pip", "setuptools", "wheel"})
# The distributions whose versions the deployment record keeps (those a lock has).
NOTABLE = ("sglang", "sglang-kernel", "torch", "flashinfer-python", "transformers", "triton", "smg")

_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
_PLATFORM = re.compile(r"([a-z0-9_]+)-manylinux_(\d+)_(\d+)")
_PYTHON = re.compile(r"3\.\d+")


class LockError(ValueError):
    """A lock file that is not what `make locks` writes."""


def canonical(name: str) -> str:
    """PEP 503 name: what dist-info metadata and a lock are compared by."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pin(requirement: str) -> tuple[str, str]:
    """(canonical name, version) of an exact `name==version` requirement; LockError for anything else."""
    match = _PIN.fullmatch(requirement.strip())
    if not match:
        raise LockError(f"expected a pin of the form name==version, found {requirement!r} (a lock pins exact releases; "
                        "build a wheel of anything else and pin its version)")
    return canonical(match.group(1)), match.group(2)


def file_name(requirement: str, python: str, platform: str) -> str:
    """The lock's file name: one per pin and target platform (locks/<name>-<version>-py<python>-<platform>.txt)."""
    name, version = pin(requirement)
    if not _PYTHON.fullmatch(str(python)) or not _PLATFORM.fullmatch(platform):
        raise LockError(f"expected a Python like 3.12 and a platform like x86_64-manylinux_2_34, found {python!r} "
                        f"and {platform!r}")
    return f"{name}-{version}-py{python}-{platform}.txt"


def header(requirement: str, python: str, platform: str) -> str:
    return f"{HEADER} requirement={requirement} python={python} platform={platform}"


@dataclass(frozen=True)
class Lock:
    requirement: str
    python: str
    platform: str
    packages: dict[str, str]  # canonical name -> version
    hashes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return pin(self.requirement)[0]

    @property
    def version(self) -> str:
        return pin(self.requirement)[1]


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """Requirement lines with their backslash continuations joined and comments removed, with line numbers."""
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        if buffer.strip():
            yield start, buffer.strip()
        buffer = ""
    if buffer.strip():
        yield start, buffer.strip()


def parse(text: str, source: str = "lock") -> Lock:
    """The lock's pin, platform and packages; LockError naming the line for anything else (markers, a missing
    hash, a duplicate, a header that does not match the packages)."""
    first = next((line for line in text.splitlines() if line.startswith(HEADER)), None)
    if first is None:
        raise LockError(f"{source}: expected a first line '{HEADER} requirement=... python=... platform=...' "
                        "(make locks writes it), found none")
    fields = dict(word.split("=", 1) for word in first[len(HEADER):].split() if "=" in word)
    missing = [key for key in ("requirement", "python", "platform") if not fields.get(key)]
    if missing:
        raise LockError(f"{source}: its header lacks {', '.join(missing)}: {first!r}")
    file_name(fields["requirement"], fields["python"], fields["platform"])  # checks all three
    packages: dict[str, str] = {}
    hashes: dict[str, tuple[str, ...]] = {}
    for number, line in _logical_lines(text):
        words = line.split()
        if ";" in line:
            raise LockError(f"{source}:{number}: environment markers in a lock for one platform: {line[:120]!r}")
        match = _PIN.fullmatch(words[0])
        if not match:
            raise LockError(f"{source}:{number}: expected name==version, found {words[0]!r}")
        digests = tuple(word.split(":", 1)[1] for word in words[1:] if _HASH.fullmatch(word))
        if len(digests) != len(words) - 1 or not digests:
            raise LockError(f"{source}:{number}: expected --hash=sha256:<64 hex> after {words[0]}, found "
                            f"{' '.join(words[1:])[:120]!r}")
        name = canonical(match.group(1))
        if name in packages:
            raise LockError(f"{source}:{number}: {name} is locked twice")
        packages[name], hashes[name] = match.group(2), digests
    name, version = pin(fields["requirement"])
    if packages.get(name) != version:
        raise LockError(f"{source}: its header pins {name}=={version}, its packages have "
                        f"{name}=={packages.get(name, 'nothing')}; run make locks")
    return Lock(fields["requirement"], fields["python"], fields["platform"], packages, hashes)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - ansible-core depends on packaging
        return a == b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def compare(installed: Mapping[str, str], lock: Lock) -> dict[str, list[dict[str, str]]]:
    """What a venv holding `installed` (canonical name -> version) lacks, holds at another version, or holds
    beyond the lock (pip, setuptools and wheel only when the lock lists them)."""
    have = {canonical(name): str(version) for name, version in installed.items()}
    missing = [{"name": n, "locked": v} for n, v in sorted(lock.packages.items()) if n not in have]
    changed = [{"name": n, "installed": have[n], "locked": v} for n, v in sorted(lock.packages.items())
               if n in have and not same_version(have[n], v)]
    extra = [{"name": n, "installed": v} for n, v in sorted(have.items())
             if n not in lock.packages and n not in TOOLING]
    return {"missing": missing, "changed": changed, "extra": extra}


def diff_lines(diff: Mapping[str, Sequence[Mapping[str, str]]]) -> list[str]:
    """One line per package: `name old -> new`, `+ name new (missing)`, `- name old (not in the lock)`."""
    return ([f"{d['name']} {d['installed']} -> {d['locked']}" for d in diff.get("changed", [])]
            + [f"+ {d['name']} {d['locked']} (missing)" for d in diff.get("missing", [])]
            + [f"- {d['name']} {d['installed']} (not in the lock)" for d in diff.get("extra", [])])


def platform_problems(lock: Lock, host: str, machine: str | None, glibc: str | None, python: str | None,
                      python_source: str) -> list[str]:
    """Why this host cannot run the lock's wheels: another CPU architecture, a glibc older than the wheels'
    manylinux tag, another Python than the lock's (python_source says whose version `python` is)."""
    match = _PLATFORM.fullmatch(lock.platform)
    assert match is not None  # parse() checked it
    arch, need = match.group(1), (int(match.group(2)), int(match.group(3)))
    what = f"{lock.requirement} is locked for Python {lock.python} on {lock.platform}"
    problems = []
    if machine and machine != arch:
        problems.append(f"{host}: {what}; this host is {machine}. Lock for this host's platform "
                        "(dflash_venv_platform).")
    have = tuple(int(p) for p in re.findall(r"\d+", glibc or "")[:2])
    if len(have) < 2:
        problems.append(f"{host}: {what} (its wheels need glibc >= {need[0]}.{need[1]}); this host's glibc version "
                        f"could not be read ({glibc!r}).")
    elif have < need:
        problems.append(f"{host}: {what}, and its wheels need glibc >= {need[0]}.{need[1]}; this host has glibc "
                        f"{have[0]}.{have[1]}. Move the container to a distribution with glibc >= "
                        f"{need[0]}.{need[1]} (Debian 12, Ubuntu 22.04 or later) or pin a release with older wheels.")
    if not python:
        problems.append(f"{host}: {what}; {python_source} did not answer with its version.")
    elif ".".join(python.split(".")[:2]) != lock.python:
        problems.append(f"{host}: {what}; {python_source} is Python {python}. Point the venv's interpreter at a "
                        f"Python {lock.python} (and remove a venv made by another one), or lock for "
                        f"{'.'.join(python.split('.')[:2])} in dflash_venv_platform and run make locks.")
    return problems


def venv_status(state: Mapping[str, Any], venv: str, lock_text: str, protected: str = "", host: str = "",
                source: str = "lock") -> dict[str, Any]:
    """How the venv at `venv` (host_state's venvs section) compares to the lock: what to install, remove or
    copy, the platform problems, and a refusal when the protected distribution (the engine itself) was changed
    by hand in a venv installed from this very lock."""
    lock = parse(lock_text, source)
    seen = (state.get("venvs") or {}).get(venv) or {}
    has_python = bool(seen.get("python"))
    diff = compare(dict(seen.get("distributions") or {}) if has_python else {}, lock)
    digest = sha256(lock_text)
    copy = seen.get("lock") or {}
    from_this_lock = bool(copy.get("exists")) and copy.get("sha256") == digest
    refused = ""
    if protected and from_this_lock:
        for d in diff["changed"]:
            if d["name"] == canonical(protected):
                refused = (f"{host}: {venv} was installed from {source} ({lock.requirement}), and its {d['name']} is "
                           f"now {d['installed']}: the engine itself was changed by hand. The deploy does not "
                           f"replace an engine build it did not install: to serve that build, lock it (its wheel "
                           f"and dflash_engine.pip_spec, then make locks); to go back to {lock.requirement}, run "
                           f"again with -e sglang_engine_replace_changed=true.")
    python_source = f"{venv}/bin/python" if has_python else str(seen.get("interpreter") or "the venv's interpreter")
    python = seen.get("python_version") if has_python else seen.get("interpreter_version")
    system = ((state.get("system") or {}).get("platform") or {})
    problems = platform_problems(lock, host, system.get("machine"), system.get("glibc"), python, python_source)
    lines = diff_lines(diff)
    needs_install = not has_python or bool(diff["missing"] or diff["changed"])
    return {
        "venv": venv, "source": source, "requirement": lock.requirement, "python": lock.python,
        "platform": lock.platform, "lock_sha256": digest, "packages": len(lock.packages),
        **diff, "lines": lines, "needs_venv": not has_python, "needs_install": needs_install,
        "needs_uninstall": bool(diff["extra"]), "needs_lock_copy": not from_this_lock,
        "in_sync": has_python and not lines and from_this_lock, "refused": refused, "problems": problems,
        "notable": {n: lock.packages[n] for n in NOTABLE if n in lock.packages},
    }


def installed_problems(installed: Mapping[str, str], lock_text: str, venv: str, host: str = "") -> list[str]:
    """After an install: every way the venv (importlib.metadata's view) still differs from the lock."""
    lines = diff_lines(compare(installed, parse(lock_text)))
    return [f"{host}: {venv} differs from its lock after installing it: {'; '.join(lines)}."] if lines else []
