"""library/dflash_holds.py run for real on localhost against dpkg itself, on a dpkg database of its own
(--admindir in a temporary folder, so that this machine's holds are never touched): the user-space set held in one
dpkg call, an already held package left alone, check mode writing nothing, a package not installed refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import run_module

PACKAGES = ("libnvidia-compute-570", "nvidia-utils-570", "libnvidia-gl-570")


def status_entry(name: str, want: str = "install", status: str = "installed") -> str:
    return (f"Package: {name}\nStatus: {want} ok {status}\nPriority: optional\nSection: non-free/libs\n"
            f"Installed-Size: 1\nMaintainer: Debian NVIDIA Maintainers\nArchitecture: amd64\n"
            f"Version: 570.195.03-1\nDescription: {name}\n\n")


def admindir(tmp_path: Path, entries: list[str]) -> Path:
    folder = tmp_path / "dpkg"
    for sub in ("info", "updates", "triggers"):
        (folder / sub).mkdir(parents=True)
    (folder / "status").write_text("".join(entries))
    (folder / "available").write_text("")
    return folder


def selections(folder: Path) -> dict[str, str]:
    out = subprocess.run(["dpkg", f"--admindir={folder}", "--get-selections"], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split() for line in out.splitlines())


def test_the_set_is_held_in_one_call_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    folder = admindir(tmp_path, [status_entry(PACKAGES[0]), status_entry(PACKAGES[1], want="hold"),
                                 status_entry(PACKAGES[2]), status_entry("bash")])
    args = {"names": list(PACKAGES), "admindir": str(folder)}
    checked = run_module("dflash_holds", args, check=True)
    assert (checked["changed"], checked["held"], checked["already"]) == (
        True, [PACKAGES[0], PACKAGES[2]], [PACKAGES[1]]), checked
    assert selections(folder) == {PACKAGES[0]: "install", PACKAGES[1]: "hold", PACKAGES[2]: "install",
                                  "bash": "install"}
    done = run_module("dflash_holds", args)
    assert done["changed"] is True and done["held"] == [PACKAGES[0], PACKAGES[2]], done
    assert selections(folder) == {**dict.fromkeys(PACKAGES, "hold"), "bash": "install"}
    again = run_module("dflash_holds", args)
    assert again["changed"] is False and again["held"] == [] and again["already"] == list(PACKAGES), again
    assert run_module("dflash_holds", {"names": [], "admindir": str(folder)})["changed"] is False


def test_a_package_that_is_not_installed_is_refused_naming_it(tmp_path: Path) -> None:
    folder = admindir(tmp_path, [status_entry(PACKAGES[0]), status_entry(PACKAGES[1], "deinstall", "config-files")])
    failed = run_module("dflash_holds", {"names": list(PACKAGES), "admindir": str(folder)})
    assert failed.get("failed") is True and failed["msg"] == (
        f"expected every package to hold installed, found {PACKAGES[1]}, {PACKAGES[2]} not installed (hold the set "
        "after the transaction that installs it)"), failed
    assert selections(folder)[PACKAGES[0]] == "install"  # nothing held when the set is not all there
