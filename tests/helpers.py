"""Test helpers: repository paths and the project's own tools."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A console script of the running venv (ansible-playbook, dflash-infra, ...)."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def ansible_environment() -> dict[str, str]:
    """The environment ansible-playbook runs with in tests: the repo's ansible.cfg, no colour."""
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def run(argv: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, **kwargs)


def use_module_utils() -> None:
    """Make the repository's module_utils importable as ansible.module_utils.<name>, the way AnsiballZ ships them
    to the hosts (their packages import each other relatively)."""
    import ansible.module_utils

    path = str(ROOT / "module_utils")
    if path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(path)


# The hosts run modules with their own python3 and the standard library only; so do the module tests.
HOST_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def run_module(module: str, args: dict[str, Any], check: bool = False, diff: bool = False) -> dict[str, Any]:
    """Run one of the repository's modules for real on localhost (`ansible localhost -m`); its result."""
    env = dict(ansible_environment(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    argv = [tool("ansible"), "localhost", "-i", "localhost,", "-c", "local",
            "-e", f"ansible_python_interpreter={HOST_PYTHON}", "-m", module, "-a", json.dumps(args)]
    proc = run(argv + (["--check"] if check else []) + (["--diff"] if diff else []), env=env)
    try:
        result: dict[str, Any] = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        raise AssertionError(f"ansible -m {module} printed no result (rc {proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}") from None
    return result


PROMETHEUS_CACHE = ROOT / ".cache" / "promtool"
ALERTMANAGER_CACHE = ROOT / ".cache" / "alertmanager"


def debian_prometheus() -> Path:
    """Debian's package prometheus (the server and promtool), fetched once with `apt-get download` and unpacked into
    .cache/promtool/root, never installed; returns that root."""
    return debian_unpacked("prometheus", PROMETHEUS_CACHE, "usr/bin/prometheus")


def debian_alertmanager() -> Path:
    """Debian's package prometheus-alertmanager (the server and amtool), as debian_prometheus: unpacked into
    .cache/alertmanager/root, never installed; returns that root."""
    return debian_unpacked("prometheus-alertmanager", ALERTMANAGER_CACHE, "usr/bin/amtool")


def debian_alertmanager_argv(*args: str) -> list[str]:
    """The command line of Debian's Alertmanager as unpacked by debian_alertmanager: Debian's build reads its default
    notification template from /usr/share/prometheus/alertmanager, which an unpacked package does not put there, so
    it runs in a mount namespace of its own (unshare -m) where the package's /usr/share lies over this machine's (a
    read-only overlay, gone with the process; nothing is installed or changed here)."""
    root = debian_alertmanager()
    binary = root / "usr" / "bin" / "prometheus-alertmanager"
    overlay = f"mount -t overlay overlay -o lowerdir={root / 'usr' / 'share'}:/usr/share /usr/share"
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{overlay} && exec "$0" "$@"', str(binary),
            *args]


def debian_unpacked(package: str, cache: Path, probe: str) -> Path:
    """A Debian package fetched once with `apt-get download` and unpacked into `cache`/root (done when `probe` is
    there), never installed; returns that root. Unpacked beside and renamed into place under a lock, so the tiers
    that run at once (promtool beside the labs, Prometheus in a lab) never see half a tree."""
    import fcntl

    root = cache / "root"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f"{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / probe).is_file():
            return root
        for old in [*cache.glob(f"{package}_*.deb"), cache / "root.tmp", root]:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
        download = ["apt-get", "download", package]
        got = subprocess.run(download, cwd=cache, capture_output=True, text=True, check=False)
        if got.returncode != 0:  # a machine without package lists yet
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, check=False)
            got = subprocess.run(download, cwd=cache, capture_output=True, text=True, check=False)
        assert got.returncode == 0, f"apt-get download {package} failed (run apt-get update?):\n{got.stderr}"
        (deb,) = cache.glob(f"{package}_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(cache / "root.tmp")], check=True)
        (cache / "root.tmp").rename(root)
    return root
