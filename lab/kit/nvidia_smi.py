#!/usr/bin/python3
# dflash-lab STAND-IN for nvidia-smi. Not NVIDIA software: the lab has no GPUs.
#
# Shipped as /usr/bin/nvidia-smi by the lab's synthetic nvidia-utils-<branch>
# package. It prints the real tool's formats (580/595 layout, checked against
# real captures in tests/lab/test_gpusim.py) for the GPUs described in the lab
# profile /etc/dflash-lab/gpu-profile.json, lists the processes that lab
# workloads registered in /run/dflash-lab/gpu-procs/<pid>.json while their pid
# is alive, and fails exactly like NVML when the installed user-space library
# (libnvidia-ml.so.1 -> libnvidia-ml.so.<version>) differs from the simulated
# kernel module. Python 3 standard library only.
#
# Environment overrides (tests on the host):
#   DFLASH_LAB_GPU_PROFILE    profile JSON   (default /etc/dflash-lab/gpu-profile.json)
#   DFLASH_LAB_GPU_PROCS      registry dir   (default /run/dflash-lab/gpu-procs)
#   DFLASH_LAB_NVML_LIB       libnvidia-ml.so.1 path to resolve with readlink -f
#   DFLASH_LAB_USERSPACE_VERSION  user-space version, skips the library lookup
#   DFLASH_LAB_SMI_VERSION    the tool's own version (default: baked in at build)
from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Replaced with the package's upstream version when build_debs.py builds nvidia-utils.
BAKED_VERSION = "@NVIDIA_SMI_VERSION@"

PROFILE_PATH = "/etc/dflash-lab/gpu-profile.json"
PROCS_DIR = "/run/dflash-lab/gpu-procs"
NVML_LIB_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/lib/libnvidia-ml.so.1",
)

# Exit codes of the real tool (man page "RETURN VALUE"; 18 is
# NVML_ERROR_LIB_RM_VERSION_MISMATCH, which nvidia-smi returns on a mismatch).
EXIT_INVALID_ARGUMENT = 2
EXIT_LIBRARY_NOT_FOUND = 12
EXIT_VERSION_MISMATCH = 18

WIDTH = 91  # characters per line of the 570+ table layout


class SmiError(Exception):
    """An error the real tool reports on stdout with a given exit code."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


@dataclass
class Gpu:
    """One simulated GPU: the profile's model data merged with its own identity."""

    index: int
    name: str
    pci_bus_id: str
    uuid: str
    serial: str
    memory_total_mib: int
    memory_reserved_mib: int
    memory_idle_used_mib: int
    compute_cap: str
    pci_device_id: str
    vbios_version: str
    persistence_mode: str
    fan: str
    temperature_c: int
    temperature_busy_c: int
    utilization_busy_pct: int
    pstate: str
    power_idle_w: int
    power_busy_w: int
    power_limit_w: int
    ecc: str
    mig: str
    compute_mode: str
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def memory_used_mib(self) -> int:
        return self.memory_idle_used_mib + sum(p.used_memory_mib for p in self.processes)

    @property
    def memory_free_mib(self) -> int:
        return max(0, self.memory_total_mib - self.memory_reserved_mib - self.memory_used_mib)

    @property
    def busy(self) -> bool:
        return bool(self.processes)


@dataclass
class GpuProcess:
    """A live process holding memory on one GPU (from the lab registry)."""

    pid: int
    gpu_index: int
    used_memory_mib: int
    process_name: str
    type: str = "C"


@dataclass
class State:
    """Everything one invocation needs: versions, GPUs, processes."""

    smi_version: str
    nvml_version: str
    driver_version: str
    cuda_version: str
    gpus: list[Gpu]


# --------------------------------------------------------------------------- state


def load_profile(path: str) -> dict:
    """Read the lab profile; a missing profile looks like a missing driver."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise SmiError(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n",
            9,
        ) from None


def library_version(env: dict[str, str]) -> str | None:
    """The installed NVML user-space version: readlink -f libnvidia-ml.so.1, else dpkg."""
    if env.get("DFLASH_LAB_USERSPACE_VERSION"):
        return env["DFLASH_LAB_USERSPACE_VERSION"]
    candidates = [env["DFLASH_LAB_NVML_LIB"]] if env.get("DFLASH_LAB_NVML_LIB") else list(NVML_LIB_CANDIDATES)
    for cand in candidates:
        if os.path.exists(cand):
            match = re.search(r"libnvidia-ml\.so\.(\d+(?:\.\d+)+)$", os.path.realpath(cand))
            if match:
                return match.group(1)
    return None


def nvml_short(version: str) -> str:
    """NVML reports major.minor of the library version (580.159.03 -> 580.159)."""
    return ".".join(version.split(".")[:2])


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[-1].split()
    if not rest or rest[0] in ("Z", "X"):
        return None  # a zombie holds no GPU memory
    return rest[19]


def _proc_name(pid: int, fallback: str) -> str:
    """Process name as nvidia-smi shows it: argv[0] of the process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    return argv0 or fallback


def live_processes(procs_dir: str) -> list[GpuProcess]:
    """Registrations whose pid is alive (and is still the same process)."""
    found: list[GpuProcess] = []
    try:
        names = sorted(os.listdir(procs_dir))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(procs_dir, name), encoding="utf-8") as fh:
                reg = json.load(fh)
            pid = int(reg["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        start = _proc_start_time(pid)
        if start is None or (reg.get("start_time") and str(reg["start_time"]) != start):
            continue
        pname = _proc_name(pid, str(reg.get("process_name", "python3")))
        for slot in reg.get("gpus", []):
            found.append(
                GpuProcess(
                    pid=pid,
                    gpu_index=int(slot["index"]),
                    used_memory_mib=int(slot["used_memory_mib"]),
                    process_name=pname,
                    type=str(reg.get("type", "C")),
                )
            )
    return found


def build_state(env: dict[str, str]) -> State:
    """Load profile, check the library against the kernel module, attach processes."""
    profile = load_profile(env.get("DFLASH_LAB_GPU_PROFILE", PROFILE_PATH))
    driver = str(profile["kernel_module"]["version"])
    lib = library_version(env)
    if lib is None:
        raise SmiError(
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
            "the NVIDIA Display Driver is properly installed and present in your system.\n"
            "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n",
            EXIT_LIBRARY_NOT_FOUND,
        )
    if lib != driver:
        raise SmiError(
            "Failed to initialize NVML: Driver/library version mismatch\n"
            f"NVML library version: {nvml_short(lib)}\n",
            EXIT_VERSION_MISMATCH,
        )
    baked = BAKED_VERSION if not BAKED_VERSION.startswith("@") else lib
    model = profile["gpu_model"]
    gpus = [
        Gpu(
            index=int(g["index"]),
            name=model["name"],
            pci_bus_id=g["pci_bus_id"],
            uuid=g["uuid"],
            serial=str(g.get("serial", "[N/A]")),
            memory_total_mib=int(model["memory_total_mib"]),
            memory_reserved_mib=int(model.get("memory_reserved_mib", 0)),
            memory_idle_used_mib=int(model.get("memory_idle_used_mib", 0)),
            compute_cap=str(model["compute_cap"]),
            pci_device_id=str(model.get("pci_device_id", "[N/A]")),
            vbios_version=str(model.get("vbios_version", "[N/A]")),
            persistence_mode=str(model.get("persistence_mode", "On")),
            fan=str(model.get("fan", "N/A")),
            temperature_c=int(model.get("temperature_c", 30)),
            temperature_busy_c=int(model.get("temperature_busy_c", int(model.get("temperature_c", 30)) + 30)),
            utilization_busy_pct=int(model.get("utilization_busy_pct", 100)),
            pstate=str(model.get("pstate", "P8")),
            power_idle_w=int(model.get("power_idle_w", 20)),
            power_busy_w=int(model.get("power_busy_w", 300)),
            power_limit_w=int(model.get("power_limit_w", 300)),
            ecc=str(model.get("ecc", "Off")),
            mig=str(model.get("mig", "N/A")),
            compute_mode=str(model.get("compute_mode", "Default")),
        )
        for g in profile["gpus"]
    ]
    by_index = {g.index: g for g in gpus}
    for proc in live_processes(env.get("DFLASH_LAB_GPU_PROCS", PROCS_DIR)):
        if proc.gpu_index in by_index:
            by_index[proc.gpu_index].processes.append(proc)
    return State(
        smi_version=env.get("DFLASH_LAB_SMI_VERSION", baked),
        nvml_version=nvml_short(lib),
        driver_version=driver,
        cuda_version=str(profile.get("cuda_version", "13.0")),
        gpus=gpus,
    )


# --------------------------------------------------------------------------- values


def _branch(version: str) -> int:
    return int(version.split(".")[0])


def _pstate(gpu: Gpu) -> str:
    return "P0" if gpu.busy else gpu.pstate


def _power(gpu: Gpu) -> int:
    return gpu.power_busy_w if gpu.busy else gpu.power_idle_w


def _util(gpu: Gpu) -> int:
    return gpu.utilization_busy_pct if gpu.busy else 0


def _temp(gpu: Gpu) -> int:
    return gpu.temperature_busy_c if gpu.busy else gpu.temperature_c


def _on_off(value: str) -> str:
    return {"On": "Enabled", "Off": "Disabled"}.get(value, value)


@dataclass(frozen=True)
class Field:
    """A --query-gpu field: canonical header name, unit tag and value function."""

    name: str
    unit: str | None
    value: Callable[[Gpu, State], str]


def _mib(v: int) -> str:
    return f"{v} MiB"


GPU_FIELDS: dict[str, Field] = {}


def _gpu_field(names: tuple[str, ...], unit: str | None, fn: Callable[[Gpu, State], str]) -> None:
    f = Field(names[0], unit, fn)
    for n in names:
        GPU_FIELDS[n] = f


_gpu_field(("timestamp",), None,
           lambda g, s: time.strftime("%Y/%m/%d %H:%M:%S.") + f"{int(time.time() * 1000) % 1000:03d}")
_gpu_field(("driver_version",), None, lambda g, s: s.driver_version)
_gpu_field(("count",), None, lambda g, s: str(len(s.gpus)))
_gpu_field(("name", "gpu_name"), None, lambda g, s: g.name)
_gpu_field(("serial", "gpu_serial"), None, lambda g, s: g.serial)
_gpu_field(("uuid", "gpu_uuid"), None, lambda g, s: g.uuid)
_gpu_field(("pci.bus_id", "gpu_bus_id"), None, lambda g, s: g.pci_bus_id)
_gpu_field(("pci.device_id",), None, lambda g, s: g.pci_device_id)
_gpu_field(("index",), None, lambda g, s: str(g.index))
_gpu_field(("vbios_version",), None, lambda g, s: g.vbios_version)
_gpu_field(("persistence_mode",), None, lambda g, s: _on_off(g.persistence_mode))
_gpu_field(("compute_mode",), None, lambda g, s: g.compute_mode)
_gpu_field(("pstate",), None, lambda g, s: _pstate(g))
_gpu_field(("fan.speed",), "%", lambda g, s: "[N/A]" if g.fan == "N/A" else g.fan.replace("%", " %"))
_gpu_field(("temperature.gpu",), None, lambda g, s: str(_temp(g)))
_gpu_field(("utilization.gpu",), "%", lambda g, s: f"{_util(g)} %")
_gpu_field(("utilization.memory",), "%", lambda g, s: f"{_util(g) // 2} %")
_gpu_field(("memory.total",), "MiB", lambda g, s: _mib(g.memory_total_mib))
_gpu_field(("memory.reserved",), "MiB", lambda g, s: _mib(g.memory_reserved_mib))
_gpu_field(("memory.used",), "MiB", lambda g, s: _mib(g.memory_used_mib))
_gpu_field(("memory.free",), "MiB", lambda g, s: _mib(g.memory_free_mib))
_gpu_field(("compute_cap",), None, lambda g, s: g.compute_cap)
_gpu_field(("power.draw",), "W", lambda g, s: f"{_power(g):.2f} W")
_gpu_field(("power.limit",), "W", lambda g, s: f"{g.power_limit_w:.2f} W")
_gpu_field(("ecc.mode.current",), None, lambda g, s: "[N/A]" if g.ecc == "N/A" else _on_off(g.ecc))
_gpu_field(("mig.mode.current",), None, lambda g, s: "[N/A]" if g.mig == "N/A" else g.mig)

# --query-compute-apps fields: canonical name -> (aliases, unit)
APP_FIELDS: dict[str, tuple[str, str | None]] = {
    "timestamp": ("timestamp", None),
    "gpu_name": ("gpu_name", None),
    "gpu_bus_id": ("gpu_bus_id", None),
    "gpu_serial": ("gpu_serial", None),
    "gpu_uuid": ("gpu_uuid", None),
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "used_memory": ("used_gpu_memory", "MiB"),
}


# --------------------------------------------------------------------------- output


@dataclass(frozen=True)
class CsvFormat:
    """The --format=csv[,noheader][,nounits] options."""

    header: bool = True
    units: bool = True


def parse_format(spec: str | None) -> CsvFormat:
    """Parse --format; only csv exists for queries."""
    if spec is None:
        raise SmiError('"--format" is required when using "--query-gpu" or "--query-compute-apps".\n',
                       EXIT_INVALID_ARGUMENT)
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if "csv" not in parts or any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise SmiError("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n",
                       EXIT_INVALID_ARGUMENT)
    return CsvFormat(header="noheader" not in parts, units="nounits" not in parts)


def _strip_unit(value: str, unit: str | None, fmt: CsvFormat) -> str:
    if fmt.units or unit is None:
        return value
    return value[: -len(unit) - 1] if value.endswith(" " + unit) else value


def _header(name: str, unit: str | None) -> str:
    return f"{name} [{unit}]" if unit else name


def query_gpu(state: State, fields: list[str], fmt: CsvFormat, ids: list[int] | None) -> str:
    """--query-gpu output: one line per GPU, ', ' separated, units in header and values."""
    resolved: list[Field] = []
    for name in fields:
        if name not in GPU_FIELDS:
            raise SmiError(f'Field "{name}" is not a valid field to query.\n\n', EXIT_INVALID_ARGUMENT)
        resolved.append(GPU_FIELDS[name])
    lines = []
    if fmt.header:
        lines.append(", ".join(_header(f.name, f.unit) for f in resolved))
    for gpu in _selected(state, ids):
        lines.append(", ".join(_strip_unit(f.value(gpu, state), f.unit, fmt) for f in resolved))
    return "".join(line + "\n" for line in lines)


def query_apps(state: State, fields: list[str], fmt: CsvFormat, ids: list[int] | None) -> str:
    """--query-compute-apps output: one line per (process, GPU)."""
    for name in fields:
        if name not in APP_FIELDS:
            raise SmiError(f'Field "{name}" is not a valid field to query.\n\n', EXIT_INVALID_ARGUMENT)
    stamp = time.strftime("%Y/%m/%d %H:%M:%S.") + f"{int(time.time() * 1000) % 1000:03d}"
    lines = []
    if fmt.header:
        lines.append(", ".join(_header(*APP_FIELDS[n]) for n in fields))
    for gpu in _selected(state, ids):
        for proc in sorted(gpu.processes, key=lambda p: p.pid):
            values = {
                "timestamp": stamp,
                "gpu_name": gpu.name,
                "gpu_bus_id": gpu.pci_bus_id,
                "gpu_serial": gpu.serial,
                "gpu_uuid": gpu.uuid,
                "pid": str(proc.pid),
                "process_name": proc.process_name,
                "used_gpu_memory": _strip_unit(f"{proc.used_memory_mib} MiB", "MiB", fmt),
            }
            lines.append(", ".join(values[APP_FIELDS[n][0]] for n in fields))
    return "".join(line + "\n" for line in lines)


def _selected(state: State, ids: list[int] | None) -> list[Gpu]:
    if ids is None:
        return state.gpus
    known = {g.index: g for g in state.gpus}
    missing = [i for i in ids if i not in known]
    if missing:
        raise SmiError("No devices were found\n", 6)
    return [known[i] for i in ids]


def _row(text: str) -> str:
    return "|" + text.ljust(WIDTH - 2) + "|"


def _gpu_name(name: str) -> str:
    return name if len(name) <= 27 else name[:24] + "..."


def _proc_name_cell(name: str, width: int = 32) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3):]


def table(state: State) -> str:
    """The default nvidia-smi table (580/595 layout; 610+ uses the KMD/UMD header)."""
    rule = "+" + "-" * (WIDTH - 2) + "+"
    cols = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    if _branch(state.driver_version) >= 610:
        head = (f" NVIDIA-SMI {state.smi_version:<23}KMD Version: {state.driver_version:<14}"
                f"CUDA UMD Version: {state.cuda_version}")
    else:
        head = (f" NVIDIA-SMI {state.smi_version:<23}Driver Version: {state.driver_version:<15}"
                f"CUDA Version: {state.cuda_version}")
    out = [time.asctime() + "       ", rule, _row(head), cols]
    out += [
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for gpu in state.gpus:
        pm = gpu.persistence_mode
        out.append(
            f"|{gpu.index:>4}  {_gpu_name(gpu.name):<27}    {pm:<3} "
            f"|{gpu.pci_bus_id:>19} Off "
            f"|{gpu.ecc if gpu.ecc != 'N/A' else 'N/A':>21} |"
        )
        out.append(
            f"|{gpu.fan:>4}   {str(_temp(gpu)) + 'C':>3}    {_pstate(gpu):>2}{str(_power(gpu)) + 'W':>16} "
            f"/{str(gpu.power_limit_w) + 'W':>6} "
            f"|{str(gpu.memory_used_mib) + 'MiB':>11} /{str(gpu.memory_total_mib) + 'MiB':>10} "
            f"|{str(_util(gpu)) + '%':>8}{gpu.compute_mode:>13} |"
        )
        out.append(f"|{'':41}|{'':24}|{gpu.mig:>21} |")
        out.append(cols)
    out.append("")
    out += [
        rule,
        _row(" Processes:"),
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * (WIDTH - 2) + "|",
    ]
    procs = [p for g in state.gpus for p in sorted(g.processes, key=lambda p: p.pid)]
    if not procs:
        out.append(_row("  No running processes found"))
    for p in procs:
        out.append(
            f"|{p.gpu_index:>5}   N/A  N/A{p.pid:>16}{p.type:>7}   "
            f"{_proc_name_cell(p.process_name):<32}{str(p.used_memory_mib) + 'MiB':>14} |"
        )
    out.append(rule)
    return "".join(line + "\n" for line in out)


def version_text(state: State) -> str:
    """nvidia-smi --version (580/595 layout; the 610 branch renamed two lines)."""
    if _branch(state.driver_version) >= 610:
        return (
            f"NVIDIA-SMI version  : {state.smi_version}\n"
            f"NVML version        : {state.nvml_version}\n"
            'DRIVER version      : Deprecated, see "KMD version" instead\n'
            'CUDA version        : Deprecated, see "CUDA UMD version" instead\n'
            f"KMD version         : {state.driver_version}\n"
            f"CUDA UMD version    : {state.cuda_version}\n"
        )
    return (
        f"NVIDIA-SMI version  : {state.smi_version}\n"
        f"NVML version        : {state.nvml_version}\n"
        f"DRIVER version      : {state.driver_version}\n"
        f"CUDA Version        : {state.cuda_version}\n"
    )


def list_gpus(state: State) -> str:
    """nvidia-smi -L."""
    return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in state.gpus)


# --------------------------------------------------------------------------- cli


@dataclass
class Args:
    """The subset of nvidia-smi's command line the lab needs."""

    query_gpu: list[str] | None = None
    query_apps: list[str] | None = None
    fmt: str | None = None
    ids: list[int] | None = None
    version: bool = False
    list_gpus: bool = False
    help: bool = False


def parse_args(argv: list[str]) -> Args:
    """Parse --opt=value and --opt value forms like the real tool."""
    args = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, val = arg.partition("=")

        def value(key: str = key, eq: str = eq, val: str = val) -> str:
            nonlocal i
            if eq:
                return val
            i += 1
            if i >= len(argv):
                raise SmiError(f'Option "{key}" requires a value.\n', EXIT_INVALID_ARGUMENT)
            return argv[i]

        if key in ("--query-gpu",):
            args.query_gpu = [f.strip() for f in value().split(",") if f.strip()]
        elif key in ("--query-compute-apps",):
            args.query_apps = [f.strip() for f in value().split(",") if f.strip()]
        elif key in ("--format",):
            args.fmt = value()
        elif key in ("-i", "--id"):
            args.ids = [int(x) for x in value().split(",") if x.strip()]
        elif key in ("--version",):
            args.version = True
        elif key in ("-L", "--list-gpus"):
            args.list_gpus = True
        elif key in ("-h", "--help"):
            args.help = True
        else:
            raise SmiError(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n",
                EXIT_INVALID_ARGUMENT,
            )
        i += 1
    return args


def run(argv: list[str], env: dict[str, str]) -> tuple[str, int]:
    """Run one invocation; returns (stdout text, exit code)."""
    try:
        args = parse_args(argv)
        if args.help:
            return ("NVIDIA System Management Interface -- dflash-lab stand-in (no GPUs here).\n"
                    "Supports: --query-gpu, --query-compute-apps, --format, -i, -L, --version.\n", 0)
        state = build_state(env)
        if args.version:
            return version_text(state), 0
        if args.list_gpus:
            return list_gpus(state), 0
        if args.query_gpu is not None:
            return query_gpu(state, args.query_gpu, parse_format(args.fmt), args.ids), 0
        if args.query_apps is not None:
            return query_apps(state, args.query_apps, parse_format(args.fmt), args.ids), 0
        return table(state), 0
    except SmiError as err:
        return err.text, err.code


def main() -> int:
    text, code = run(sys.argv[1:], dict(os.environ))
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
