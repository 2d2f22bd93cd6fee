"""The lab's GPU simulation kit prints what real NVIDIA tools print, and its packages look like Ubuntu's.

The nvidia-smi stand-in is compared line by line with real captures (the project's H200 test
machine, public captures), run against temporary profiles through its environment overrides.
Synthetic .debs are inspected with dpkg-deb; model fixtures are parsed as safetensors; the
training-job stand-in registers GPU memory and loses it when it dies. The last test provisions
two copies of the lab's base rootfs when it exists and the tests run as root.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dflash_infra import parsers

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "lab" / "kit"
SMI = KIT / "nvidia_smi.py"
CAPTURES = REPO / "tests" / "fixtures" / "nvidia"
H200 = CAPTURES / "h200-test-machine"
PUBLIC = (CAPTURES / "public-captures.md").read_text()
MODEL_FIXTURES = REPO / "tests" / "fixtures" / "models"
BASE_ROOTFS = REPO / ".cache" / "lab" / "rootfs" / "base"

sys.path.insert(0, str(KIT))
import build_debs  # noqa: E402
import make_models  # noqa: E402
import provision  # noqa: E402

TIMESTAMP = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ 1-3]\d \d\d:\d\d:\d\d \d{4} {7}$")

# The H200 test machine as a lab profile: the values its captures show.
H200_PROFILE = {
    "kernel_module": {"version": "580.159.04", "flavor": "open"},
    "cuda_version": "13.0",
    "gpu_model": {
        "name": "NVIDIA H200", "memory_total_mib": 143771, "memory_reserved_mib": 616, "memory_idle_used_mib": 0,
        "compute_cap": "9.0", "persistence_mode": "On", "fan": "N/A", "temperature_c": 32, "temperature_busy_c": 32,
        "utilization_busy_pct": 0, "pstate": "P0", "power_idle_w": 125, "power_busy_w": 121, "power_limit_w": 700,
        "ecc": "0", "mig": "Disabled", "compute_mode": "Default",
    },
    "gpus": [{"index": 0, "pci_bus_id": "00000000:00:06.0", "uuid": "GPU-ec97746d-7bd3-ef73-507a-8163a5efd05f"}],
}


def public_block(heading: str, nth: int = 0) -> str:
    """The nth fenced block after a heading of public-captures.md, verbatim."""
    section = PUBLIC[PUBLIC.index(heading):]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S)
    return blocks[nth]


def profile_json(host: str) -> dict:
    return yaml.safe_load((REPO / "lab" / "profiles" / f"{host}.yml").read_text())


class Smi:
    """Runs the nvidia-smi stand-in against a temporary profile and process registry."""

    def __init__(self, tmp: Path, profile: dict, userspace: str | None = None) -> None:
        self.tmp = tmp
        self.profile_path = tmp / "gpu-profile.json"
        self.profile_path.write_text(json.dumps(profile))
        self.procs = tmp / "gpu-procs"
        self.procs.mkdir(exist_ok=True)
        self.env = dict(os.environ, DFLASH_LAB_GPU_PROFILE=str(self.profile_path), DFLASH_LAB_GPU_PROCS=str(self.procs))
        self.env["DFLASH_LAB_USERSPACE_VERSION"] = userspace or profile["kernel_module"]["version"]

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SMI), *args], env=env or self.env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL)

    def ok(self, *args: str) -> str:
        proc = self.run(*args)
        assert proc.returncode == 0, f"nvidia-smi {' '.join(args)} exited {proc.returncode}: {proc.stdout}{proc.stderr}"
        return proc.stdout

    def register(self, pid: int, memory: dict[int, int]) -> None:
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]
        reg = {"pid": pid, "start_time": start, "gpus": [{"index": i, "used_memory_mib": m} for i, m in memory.items()]}
        (self.procs / f"{pid}.json").write_text(json.dumps(reg))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose argv[0] is 'python3', like the H200 capture's GPU process."""
    proc = subprocess.Popen(["python3", "-c", "import sys; sys.stdin.read()"], executable=sys.executable,
                            stdin=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait()


# ------------------------------------------------------------------ nvidia-smi vs real captures


def test_default_table_matches_h200_capture_byte_for_byte(tmp_path: Path) -> None:
    out = Smi(tmp_path, H200_PROFILE).ok()
    real = (H200 / "nvidia-smi.txt").read_text()
    assert TIMESTAMP.match(out.splitlines()[0]), out.splitlines()[0]
    assert TIMESTAMP.match(real.splitlines()[0])
    assert out.splitlines()[1:] == real.splitlines()[1:]
    assert out.endswith("\n")


def test_table_with_a_process_matches_h200_capture(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    profile = json.loads(json.dumps(H200_PROFILE))
    profile["gpu_model"]["memory_idle_used_mib"] = 9  # the capture: 10767 MiB used, 10758 MiB by the process
    smi = Smi(tmp_path, profile)
    smi.register(sleeper.pid, {0: 10758})
    out = smi.ok().replace(f"{sleeper.pid:>16}", f"{446:>16}")
    real = (H200 / "nvidia-smi-with-process.txt").read_text()
    assert out.splitlines()[1:] == real.splitlines()[1:]


def test_version_and_query_outputs_match_h200_captures(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    smi = Smi(tmp_path, H200_PROFILE)
    assert smi.ok("--version") == (H200 / "nvidia-smi-version.txt").read_text()
    fields = "index,name,memory.total,driver_version,compute_cap,pci.bus_id,uuid"
    assert smi.ok(f"--query-gpu={fields}", "--format=csv") == (H200 / "query-gpu-header.csv").read_text()
    smi.register(sleeper.pid, {0: 10758})
    apps = smi.ok("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv")
    assert apps.replace(str(sleeper.pid), "446") == (H200 / "query-compute-apps.csv").read_text()


def test_list_gpus_and_queries_follow_public_capture_shapes(tmp_path: Path) -> None:
    smi = Smi(tmp_path, H200_PROFILE)
    listing = smi.ok("-L")
    real = public_block("#### 3.20a", 1)
    assert re.sub(r"GPU-[0-9a-f-]{36}", "GPU-X", listing) == re.sub(r"GPU-[0-9a-f-]{36}", "GPU-X", real)
    # 3.15: memory.used/free header and units
    header = smi.ok("--query-gpu=index,name,memory.total,memory.used,memory.free", "--format=csv").splitlines()[0]
    assert header == public_block("### 3.15").splitlines()[0]
    # 3.19: the process_name alias `name` is printed under its canonical header
    assert smi.ok("--query-compute-apps=gpu_uuid,name", "--format=csv") == "gpu_uuid, process_name\n"


def test_ct200_queries_print_the_profile_in_real_formats(tmp_path: Path) -> None:
    smi = Smi(tmp_path, profile_json("ct200"))
    out = smi.ok("--query-gpu=index,name,memory.total,memory.used,memory.free,driver_version,compute_cap,pci.bus_id,"
                 "uuid", "--format=csv")
    lines = out.splitlines()
    assert lines[0] == ("index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], driver_version, "
                        "compute_cap, pci.bus_id, uuid")
    assert len(lines) == 9
    cells = lines[1].split(", ")
    assert cells[:3] == ["0", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "97887 MiB"]
    assert cells[5:7] == ["595.71.05", "12.0"]
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d", cells[7])
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", cells[8])
    # 2.1: noheader keeps units out of nothing but the header; nounits strips them from values
    assert smi.ok("--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader").splitlines()[0] == (
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 595.71.05, 12.0")
    assert smi.ok("--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits").splitlines()[0] == "97887, 2"
    gpus = parsers.parse_gpus(out)
    assert [g.index for g in gpus] == list(range(8))
    assert {g.memory_total_mib for g in gpus} == {97887}
    bare = smi.ok("--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")
    assert parsers.parse_gpus(bare, fields=["index", "name", "memory.total"])[7].memory_total_mib == 97887


def test_ct200_table_has_the_real_column_layout(tmp_path: Path) -> None:
    out = Smi(tmp_path, profile_json("ct200")).ok()
    lines = out.splitlines()
    assert all(len(line) == 91 for line in lines[1:] if line), [line for line in lines[1:] if line and len(line) != 91]
    # GPU rows have the real column boundaries (3.2: the same GPU model on 590.48.01)
    real = public_block("### 3.2").splitlines()
    bars = lambda line: [i for i, ch in enumerate(line) if ch == "|"]  # noqa: E731
    assert bars(lines[8]) == bars(real[7]) and bars(lines[9]) == bars(real[8])
    assert lines[8].startswith("|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:16:00.0 Off "
                               "|                  Off |")
    table = parsers.parse_smi_table(out)
    assert (table.driver_version, table.cuda_version, table.smi_version) == ("595.71.05", "13.2", "595.71.05")
    assert len(table.gpus) == 8 and table.gpus[0].name_truncated
    assert table.processes_state == "none_running"


def test_mismatch_prints_the_nvml_error_and_exits_18(tmp_path: Path) -> None:
    """ct129's incident: kernel module 580.126.09, user space 580.159.03.

    Exit status 18 is NVML_ERROR_LIB_RM_VERSION_MISMATCH; public reports of the real tool show
    `echo $?` -> 18 after this message (anderskm/gputil#55, mozilla/translations#1167).
    """
    smi = Smi(tmp_path, profile_json("ct129"), userspace="580.159.03")
    expected = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n"
    assert expected.splitlines() == public_block("### 4.4", 1).splitlines()[2:]
    for args in ([], ["--query-gpu=name", "--format=csv"], ["--query-compute-apps=pid", "--format=csv"], ["-L"]):
        proc = smi.run(*args)
        assert (proc.stdout, proc.returncode) == (expected, 18), args
    status = parsers.parse_nvml(expected)
    assert (status.status, status.library_version) == ("mismatch", "580.159")


def test_library_version_comes_from_readlink_of_libnvidia_ml(tmp_path: Path) -> None:
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libnvidia-ml.so.580.126.09").write_text("stand-in\n")
    (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.126.09")
    smi = Smi(tmp_path, profile_json("ct129"))
    env = {k: v for k, v in smi.env.items() if k != "DFLASH_LAB_USERSPACE_VERSION"}
    env["DFLASH_LAB_NVML_LIB"] = str(libdir / "libnvidia-ml.so.1")
    proc = smi.run("--version", env=env)
    assert proc.returncode == 0 and "NVML version        : 580.126\n" in proc.stdout
    (libdir / "libnvidia-ml.so.1").unlink()
    (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.159.03")
    (libdir / "libnvidia-ml.so.580.159.03").write_text("stand-in\n")
    assert smi.run(env=env).returncode == 18
    (libdir / "libnvidia-ml.so.1").unlink()
    proc = smi.run(env=env)
    assert proc.returncode == 12 and "couldn't find libnvidia-ml.so" in proc.stdout


def test_proc_driver_version_stand_in_has_the_real_first_lines() -> None:
    open_text = provision.proc_version_text(profile_json("ct200")["kernel_module"])
    prop_text = provision.proc_version_text(profile_json("ct129")["kernel_module"])
    real_open = public_block("### 1.1").splitlines()[0]
    real_prop = public_block("### 1.9").splitlines()[1]
    volatile = r"\d+\.\d+(\.\d+)?|\(.*?\)|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d [\d:]+ UTC \d{4}"
    shape = lambda line: re.sub(volatile, "X", line)  # noqa: E731
    assert shape(open_text.splitlines()[0]) == shape(real_open)
    assert shape(prop_text.splitlines()[0]) == shape(real_prop)
    assert open_text.splitlines()[1].startswith("GCC version:  gcc version ") and open_text.endswith(" \n")
    assert parsers.parse_driver(open_text).to_dict()["version"] == "595.71.05"
    assert parsers.parse_driver(open_text).flavor == "open"
    proprietary = parsers.parse_driver(prop_text)
    assert (proprietary.version, proprietary.flavor) == ("580.126.09", "proprietary")


# ------------------------------------------------------------------ synthetic .debs


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed (apt-get install dpkg-dev)")
    out = tmp_path_factory.mktemp("debs")
    return out, build_debs.build_all(out, list(build_debs.DEFAULT_VERSIONS), "0ubuntu0.24.04.1", "6.8.0-60-generic")


def control(path: Path) -> dict[str, str]:
    text = subprocess.run(["dpkg-deb", "-f", str(path)], check=True, text=True, capture_output=True).stdout
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line[:1] not in (" ", ""):
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


USERSPACE = ["libnvidia-compute", "nvidia-utils", "libnvidia-decode", "libnvidia-encode", "libnvidia-gl",
             "libnvidia-common", "libnvidia-extra", "libnvidia-fbc1", "libnvidia-cfg1", "nvidia-compute-utils",
             "nvidia-kernel-common"]


@pytest.mark.parametrize("upstream", build_debs.DEFAULT_VERSIONS)
def test_userspace_debs_have_ubuntus_names_versions_and_dependencies(debs: tuple[Path, dict], upstream: str) -> None:
    out, manifest = debs
    branch = upstream.split(".")[0]
    version = f"{upstream}-0ubuntu0.24.04.1"
    entry = manifest["versions"][upstream]
    names = {p["package"]: out / p["file"] for p in entry["userspace"]}
    assert set(names) == {f"{n}-{branch}" for n in USERSPACE} | {f"nvidia-firmware-{branch}-{upstream}"}
    virtual = f"nvidia-kernel-common-{branch}-{upstream}"
    for name, path in names.items():
        fields = control(path)
        assert (fields["Package"], fields["Version"]) == (name, version)
        depends = [d.strip() for d in fields.get("Depends", "").split(",")]
        if name.startswith("libnvidia-"):
            assert virtual in depends, (name, depends)
    kc = control(names[f"nvidia-kernel-common-{branch}"])
    assert virtual in [p.strip() for p in kc["Provides"].split(",")]
    assert f"nvidia-firmware-{branch}-{upstream} (= {version})" in kc["Depends"]
    assert f"libnvidia-compute-{branch} (= {version})" in control(names[f"nvidia-utils-{branch}"])["Depends"]
    assert f"libnvidia-compute-{branch} (= {version})" in control(names[f"libnvidia-decode-{branch}"])["Depends"]
    assert control(names[f"libnvidia-common-{branch}"])["Architecture"] == "all"
    listing = subprocess.run(["dpkg-deb", "-c", str(names[f"libnvidia-compute-{branch}"])], check=True, text=True,
                             capture_output=True).stdout
    for lib in ("libnvidia-ml.so", "libcuda.so"):
        assert re.search(rf"-rw-r--r-- .* [1-9]\d* .*/{re.escape(lib)}\.{re.escape(upstream)}$", listing, re.M)
        assert f"/{lib}.1 -> {lib}.{upstream}" in listing


def test_trap_packages_sit_beside_the_real_ones(debs: tuple[Path, dict]) -> None:
    out, manifest = debs
    entry = manifest["versions"]["580.126.09"]
    traps = {p["package"]: out / p["file"] for p in entry["traps"]}
    assert {"nvidia-dkms-580", "nvidia-driver-580", "linux-modules-nvidia-580-6.8.0-60-generic"} <= set(traps)
    assert control(traps["nvidia-dkms-580"])["Depends"].startswith("dkms")
    driver_deps = control(traps["nvidia-driver-580"])["Depends"]
    assert "nvidia-dkms-580 (= 580.126.09-0ubuntu0.24.04.1)" in driver_deps
    assert "libnvidia-compute-580 (= 580.126.09-0ubuntu0.24.04.1)" in driver_deps
    assert all(p.parent.parent == out / "580.126.09" and p.suffix == ".deb" for p in traps.values())


def test_nvidia_utils_ships_the_stand_in_with_its_version_baked_in(debs: tuple[Path, dict], tmp_path: Path) -> None:
    out, manifest = debs
    pkg = next(out / p["file"] for p in manifest["versions"]["595.71.05"]["userspace"]
               if p["package"] == "nvidia-utils-595")
    subprocess.run(["dpkg-deb", "-x", str(pkg), str(tmp_path / "x")], check=True)
    smi = tmp_path / "x" / "usr" / "bin" / "nvidia-smi"
    assert os.access(smi, os.X_OK)
    env = dict(os.environ, DFLASH_LAB_GPU_PROFILE=str(tmp_path / "p.json"), DFLASH_LAB_USERSPACE_VERSION="595.71.05")
    (tmp_path / "p.json").write_text(json.dumps(profile_json("ct200")))
    proc = subprocess.run([sys.executable, str(smi), "--version"], env=env, text=True, capture_output=True)
    assert proc.stdout.startswith("NVIDIA-SMI version  : 595.71.05\nNVML version        : 595.71\n")
    assert parsers.parse_smi_version(proc.stdout).cuda_version == "13.2"


def test_debs_are_rebuilt_only_when_inputs_change(debs: tuple[Path, dict], tmp_path: Path) -> None:
    out = tmp_path / "d"
    build_debs.build_all(out, ["580.126.09"], "0ubuntu0.24.04.1", "6.8.0-60-generic")
    stamp = (out / ".stamp").stat().st_mtime_ns
    build_debs.build_all(out, ["580.126.09"], "0ubuntu0.24.04.1", "6.8.0-60-generic")
    assert (out / ".stamp").stat().st_mtime_ns == stamp
    manifest = build_debs.build_all(out, ["580.126.09", "570.195.03"], "0ubuntu0.24.04.1", "6.8.0-60-generic")
    assert set(manifest["versions"]) == {"580.126.09", "570.195.03"}


# ------------------------------------------------------------------ model fixtures


def read_safetensors(path: Path) -> dict:
    """Parse a safetensors file with the standard library and check its layout."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    assert n % 8 == 0
    offsets = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert offsets[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(offsets))
    assert len(blob) == 8 + n + offsets[-1][1]
    for k, v in header.items():
        if k != "__metadata__":
            assert v["dtype"] == "BF16" and v["shape"][0] * 2 == v["data_offsets"][1] - v["data_offsets"][0]
    return header


def test_model_fixtures_are_valid_safetensors_with_real_configs(tmp_path: Path) -> None:
    make_models.main(["--out", str(tmp_path / "a")])
    make_models.main(["--out", str(tmp_path / "b")])
    target = tmp_path / "a" / make_models.TARGET
    for name in ("config.json", "generation_config.json"):
        assert (target / name).read_bytes() == (MODEL_FIXTURES / make_models.TARGET / name).read_bytes()
    draft = tmp_path / "a" / make_models.DRAFT
    assert (draft / "config.json").read_bytes() == (MODEL_FIXTURES / make_models.DRAFT / "config.json").read_bytes()
    published = json.loads((MODEL_FIXTURES / "published-files.json").read_text())[make_models.TARGET]
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 55562855904
    assert sorted(set(index["weight_map"].values())) == [s["file"] for s in published["shards"]]
    assert len(index["weight_map"]) == published["tensors"]
    seen = {}
    for shard in published["shards"]:
        header = read_safetensors(target / shard["file"])
        seen.update({k: shard["file"] for k in header if k != "__metadata__"})
    assert seen == index["weight_map"]
    read_safetensors(draft / "model.safetensors")
    digest = lambda d: hashlib.sha256(b"".join(p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file())).hexdigest()  # noqa: E731
    assert digest(tmp_path / "a") == digest(tmp_path / "b")


# ------------------------------------------------------------------ training-job stand-in


def wait_for(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll until predicate() holds (a safety bound only, not a timing assertion)."""
    for _ in range(3000):
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.mark.parametrize("ignore_sigterm", [False, True])
def test_training_stand_in_registers_and_unregisters(tmp_path: Path, ignore_sigterm: bool) -> None:
    smi = Smi(tmp_path, profile_json("ct200"))
    log = tmp_path / "train_slammed5.log"
    env = dict(smi.env, TRAIN_INTERVAL_S="0.05", TRAIN_IGNORE_SIGTERM="1" if ignore_sigterm else "0")
    with open(log, "ab") as fh:
        proc = subprocess.Popen(["python3", str(KIT / "train.py")], executable=sys.executable, env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (smi.procs / f"{proc.pid}.json").exists() and "step 2/" in log.read_text(), "registration")
        apps = parsers.parse_apps(smi.ok("--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid",
                                         "--format=csv"))
        assert [(a.pid, a.process_name, a.used_memory_mib) for a in apps] == [(proc.pid, "python3", 91000)] * 8
        assert [a.gpu_uuid for a in apps] == [g["uuid"] for g in profile_json("ct200")["gpus"]]
        used = smi.ok("--query-gpu=memory.used", "--format=csv,noheader,nounits").split()
        assert used == ["91002"] * 8
        table = parsers.parse_smi_table(smi.ok())
        assert len(table.processes) == 8 and table.processes[0].pid == proc.pid
        proc.send_signal(signal.SIGTERM)
        if ignore_sigterm:
            wait_for(lambda: "ignoring it" in log.read_text(), "the ignored-SIGTERM log line")
            assert proc.poll() is None
            proc.kill()
            proc.wait()
            assert (smi.procs / f"{proc.pid}.json").exists()  # SIGKILL leaves the file; the dead pid holds nothing
        else:
            assert proc.wait() == 143
            assert not (smi.procs / f"{proc.pid}.json").exists()
            assert "saving checkpoint" in log.read_text()
        assert smi.ok("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv") == (
            "pid, process_name, used_gpu_memory [MiB]\n")
        assert smi.ok("--query-gpu=memory.used", "--format=csv,noheader,nounits").split() == ["2"] * 8
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_sh_starts_the_job_in_the_background(tmp_path: Path) -> None:
    smi = Smi(tmp_path, profile_json("ct200"))
    log = tmp_path / "train_slammed5.log"
    env = dict(smi.env, TRAIN_LOG=str(log), TRAIN_SCRIPT=str(KIT / "train.py"), TRAIN_INTERVAL_S="0.05",
               TRAIN_ENV_FILE=str(tmp_path / "none.env"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    res = subprocess.run(["bash", str(KIT / "run.sh")], env=env, text=True, capture_output=True)
    assert res.returncode == 0, res.stderr
    pid = int((tmp_path / "train.pid").read_text())
    try:
        wait_for(lambda: "step 1/" in log.read_text(), "the first progress line")
        progress = r"^\[\d{4}-\d\d-\d\d [\d:]{8}\] step 1/\d+ \| epoch .* \| loss \d+\.\d{4} \|"
        assert re.search(progress, log.read_text(), re.M)
        assert [a.pid for a in parsers.parse_apps(smi.ok("--query-compute-apps=pid,process_name,used_gpu_memory",
                                                            "--format=csv"))] == [pid] * 8
    finally:
        os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------ provisioning a real rootfs


@pytest.mark.lab
def test_provision_installs_the_kit_into_a_rootfs(lab) -> None:
    # The session's lab fixture builds the cached base rootfs this test copies.
    assert (BASE_ROOTFS.parent / "base.stamp").exists()
    scratch = REPO / ".cache" / "lab" / "scratch-kit" / f"pytest-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        for host in ("ct200", "ct129"):
            root = scratch / host
            subprocess.run(["cp", "-a", str(BASE_ROOTFS), str(root)], check=True)
            first = subprocess.run([str(KIT / "provision"), str(root), host], text=True, capture_output=True)
            assert first.returncode == 0, first.stderr
            again = subprocess.run([str(KIT / "provision"), str(root), host], text=True, capture_output=True)
            assert again.returncode == 0 and "already installed" in again.stdout, again.stdout + again.stderr
            chroot = ["chroot", str(root), "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
            smi = subprocess.run([*chroot, "nvidia-smi"], text=True, capture_output=True)
            dpkg = subprocess.run([*chroot, "dpkg-query", "-W", "-f=${Package} ${Version}\\n", "*nvidia*"], text=True,
                                  capture_output=True).stdout
            archives = sorted(p.name for p in (root / "var/cache/apt/archives").glob("*nvidia*.deb"))
            readme = (root / "etc/dflash-lab/README").read_text()
            assert readme.startswith("dflash-lab: this container is a LAB STAND-IN")
            assert json.loads((root / "etc/dflash-lab/gpu-profile.json").read_text())["host"] == host
            assert (root / "usr/lib/tmpfiles.d/dflash-lab.conf").read_text().count("/run/dflash-lab/gpu-procs") == 1
            proc_version = (root / "var/lib/dflash-lab/proc/driver/nvidia/version").read_text()
            if host == "ct200":
                assert smi.returncode == 0 and parsers.parse_smi_table(smi.stdout).driver_version == "595.71.05"
                assert "libnvidia-compute-595 595.71.05-0ubuntu0.24.04.1" in dpkg
                assert parsers.parse_driver(proc_version).flavor == "open"
                assert os.access(root / "root/run.sh", os.X_OK) and (root / "root/train.py").is_file()
                assert (root / "etc/systemd/system/multi-user.target.wants/lab-training-autostart.service").is_symlink()
                assert "nvidia-dkms-595-open_595.71.05-0ubuntu0.24.04.1_amd64.deb" in archives
            else:
                assert (smi.returncode, smi.stdout) == (
                    18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n")
                assert "libnvidia-compute-580 580.159.03-0ubuntu0.24.04.1" in dpkg
                assert parsers.parse_driver(proc_version).flavor == "proprietary"
                assert "libnvidia-compute-580_580.126.09-0ubuntu0.24.04.1_amd64.deb" in archives
                assert "nvidia-driver-580_580.126.09-0ubuntu0.24.04.1_amd64.deb" in archives
                assert any(a.startswith("linux-modules-nvidia-580-") for a in archives)
                read_safetensors(root / "root/models/Qwen3.6-27B/model-00015-of-00015.safetensors")
                assert (root / "root/models/Qwen3.6-27B-DFlash/config.json").is_file()
                # The fix the nvidia_userspace role makes: the matching set from the cache, in one dpkg call.
                fix = [f"/var/cache/apt/archives/{a}" for a in archives if "580.126.09-" in a and not re.match(
                    r"(nvidia-dkms|nvidia-driver|linux-modules)", a)]
                assert len(fix) == 12
                assert subprocess.run([*chroot, "dpkg", "-i", *fix], capture_output=True).returncode == 0
                assert subprocess.run([*chroot, "nvidia-smi", "-L"], capture_output=True).returncode == 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
