#!/usr/bin/env python3
"""Make the hash-locked requirement files of every venv the deploy installs, and download locked wheels.

    tools/make_locks.py lock [--inventory production --inventory lab] [--check]
    tools/make_locks.py wheelhouse --dest DIR (--inventory production | LOCK...)

`lock` asks Ansible, per inventory, what each container needs locked (dflash_lock_requests in
group_vars/all/locks.yml: the services' pins and the target platform) and resolves each pin with
`uv pip compile --generate-hashes` for that platform, into the lock file the roles install from (locks/). A lock
whose pin and platform are unchanged is re-resolved only with --refresh; --check resolves nothing and fails
when a lock is missing or does not match its request (what CI runs).
`wheelhouse` downloads the wheels of locks for their platform with hashes required (`pip download`), for a
host without PyPI (the lab; an air-gapped container): the role copies the folder and installs offline. With
--inventory it takes that inventory's locks, except those made from a local wheel folder (lock_from).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dflash_infra import locks  # noqa: E402

BIN = Path(sys.executable).parent
INVENTORIES = ("production", "lab")


def requests(inventory: str) -> list[dict[str, Any]]:
    """Every distinct lock request of the inventory's containers, as Ansible renders dflash_lock_requests."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_NOCOLOR="1")
    argv = [str(BIN / "ansible"), "proxmox_containers", "-i", str(REPO / "inventory" / inventory),
            "--playbook-dir", str(REPO), "-m", "ansible.builtin.debug", "-a", "var=dflash_lock_requests"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    try:
        hosts = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"make_locks: expected Ansible to render dflash_lock_requests for inventory/{inventory}, "
                         f"it printed (rc {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}") from None
    seen: dict[str, dict[str, Any]] = {}
    for host, result in sorted(hosts.items()):
        wanted = result.get("dflash_lock_requests")
        if not isinstance(wanted, list):
            raise SystemExit(f"make_locks: {host} in inventory/{inventory}: expected a list in dflash_lock_requests, "
                             f"found {result!r}"[:2000])
        for request in wanted:
            if seen.setdefault(request["lock"], request) != request:
                raise SystemExit(f"make_locks: two requests for {request['lock']}: {seen[request['lock']]}, {request}")
    return list(seen.values())


def problems(request: dict[str, Any], wheels: bool = True) -> list[str]:
    """Why the lock file of a request is not what `lock` would write for it (empty when it is); `wheels` also
    checks a lock made from a wheel folder against the wheels there now."""
    path = Path(request["lock"])
    try:
        pinned = locks.pin(request["requirement"])[1]
    except locks.LockError as exc:
        return [str(exc)]
    if pinned != str(request.get("version")):
        return [f"the pin {request['requirement']} is not the version the settings name ({request.get('version')}): "
                "make pip_spec and version agree in group_vars"]
    if not path.is_file():
        return [f"{path.relative_to(REPO)} is missing: run make locks"]
    try:
        lock = locks.parse(path.read_text(), str(path.relative_to(REPO)))
    except locks.LockError as exc:
        return [str(exc)]
    wanted = (request["requirement"], str(request["python"]), request["platform"])
    found = (lock.requirement, lock.python, lock.platform)
    if wanted != found:
        return [f"{path.relative_to(REPO)} locks {found}, the settings ask for {wanted}: run make locks"]
    return wheel_problems(lock, Path(request["lock_from"]), path) if wheels and request.get("lock_from") else []


def wheel_problems(lock: locks.Lock, folder: Path, path: Path) -> list[str]:
    """A lock made from a wheel folder (a wheel built here, like the lab's engine stand-in) against the wheels
    there now: each locked package needs a wheel whose sha256 the lock lists."""
    out = []
    for name, version in sorted(lock.packages.items()):
        wheels = [w for w in sorted(folder.glob("*.whl"))
                  if locks.canonical(w.name.split("-")[0]) == name and w.name.split("-")[1] == version]
        digests = [hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels]
        if not wheels:
            out.append(f"{path.relative_to(REPO)} locks {name}=={version}, and {folder} has no wheel of it: build it "
                       "first (make lab-wheels)")
        elif not set(digests) & set(lock.hashes[name]):
            out.append(f"{path.relative_to(REPO)} locks {name}=={version} with sha256 {', '.join(lock.hashes[name])}; "
                       f"the wheel in {folder} has {', '.join(digests)} (rebuilt from changed sources): run make locks")
    return out


def compile_lock(request: dict[str, Any]) -> tuple[Path, float]:
    """Resolve one request into its lock file (written whole, then renamed); the path and the seconds it took."""
    path = Path(request["lock"])
    argv = [str(BIN / "uv"), "pip", "compile", "--quiet", "--no-config", "--generate-hashes",
            "--python-version", str(request["python"]), "--python-platform", request["platform"],
            "--custom-compile-command", "make locks", "--no-header", "-"]
    if request.get("lock_from"):
        argv += ["--no-index", "--find-links", request["lock_from"]]
    start = time.monotonic()
    proc = subprocess.run(argv, input=request["requirement"] + "\n", capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"make_locks: uv pip compile {request['requirement']} for Python {request['python']} on "
                         f"{request['platform']} failed:\n{proc.stderr[-3000:]}")
    text = (locks.header(request["requirement"], str(request["python"]), request["platform"]) + "\n"
            + "# Resolved by uv pip compile --generate-hashes; installed by pip install --require-hashes --no-deps.\n"
            + proc.stdout)
    locks.parse(text, str(path))  # what the roles will read
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
    return path, time.monotonic() - start


def compatible_platforms(platform: str) -> list[str]:
    """The wheel platform tags a host of `<arch>-manylinux_2_Y` runs (pip's --platform takes each literally):
    manylinux_2_Y down to manylinux_2_5 and their legacy aliases."""
    arch, _, tag = platform.partition("-")
    glibc_minor = int(tag.rsplit("_", 1)[1])
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for minor in range(glibc_minor, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in legacy:
            tags.append(f"{legacy[minor]}_{arch}")
    return tags


def wheelhouse(dest: Path, lock_paths: list[Path]) -> None:
    """Download every wheel of each lock for its platform into dest, hashes required."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in lock_paths:
        lock = locks.parse(path.read_text(), str(path))
        platforms = [word for tag in compatible_platforms(lock.platform) for word in ("--platform", tag)]
        argv = [str(BIN / "python"), "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--require-hashes", "--only-binary=:all:", "--implementation", "cp",
                "--python-version", lock.python, *platforms, "--dest", str(dest), "-r", str(path)]
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"make_locks: pip download of {path.name} failed:\n{proc.stderr[-3000:]}")
        print(f"wheelhouse: {path.name}: {len(lock.packages)} wheels in {dest} ({time.monotonic() - start:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lock = sub.add_parser("lock", help="write the locks of the inventories' containers")
    lock.add_argument("--inventory", action="append", choices=INVENTORIES)
    lock.add_argument("--check", action="store_true", help="resolve nothing; fail when a lock does not match")
    lock.add_argument("--refresh", action="store_true", help="re-resolve locks whose pin and platform are unchanged")
    house = sub.add_parser("wheelhouse", help="download the wheels of locks for their platform")
    house.add_argument("--dest", type=Path, required=True)
    house.add_argument("--inventory", choices=INVENTORIES)
    house.add_argument("locks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.command == "wheelhouse":
        paths = list(args.locks) + ([Path(r["lock"]) for r in requests(args.inventory) if not r.get("lock_from")]
                                    if args.inventory else [])
        if not paths:
            parser.error("wheelhouse: name locks or an --inventory")
        wheelhouse(args.dest, paths)
        return 0
    failed = 0
    total = time.monotonic()
    for inventory in args.inventory or INVENTORIES:
        for request in requests(inventory):
            name = Path(request["lock"]).relative_to(REPO)
            found = problems(request)
            if args.check:
                failed += bool(found)
                print(f"{inventory}: {name}: " + ("; ".join(found) if found else "matches its request"))
            elif found or args.refresh:
                path, seconds = compile_lock(request)
                parsed = locks.parse(path.read_text())
                print(f"{inventory}: {name}: {len(parsed.packages)} packages, {path.stat().st_size} bytes, "
                      f"resolved in {seconds:.1f} s")
            else:
                print(f"{inventory}: {name}: up to date (--refresh re-resolves it)")
    print(f"make locks: {time.monotonic() - total:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
