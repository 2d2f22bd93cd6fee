"""Parsers for what a GPU host prints, one module per source:

- `smi_query`: nvidia-smi --query-gpu / --query-compute-apps CSV
- `smi_table`: the default nvidia-smi table and nvidia-smi --version
- `nvml`: nvidia-smi that could not start (NVML errors), the driver version in libnvidia-ml's path
- `proc`: /proc/driver/nvidia/version (and dmesg's load banner), /proc/devices,
  /proc/driver/nvidia/gpus/<bus>/information
- `dpkg`: Debian package versions and NVIDIA branches, dpkg-query -W, dpkg -l
- `engine_log`: SGLang's start-up memory lines in its log
- `kinds`: the input kinds of `dflash-infra parse KIND` and the filter plugins

Every parser takes the text plus a `source` label (a file name, or a phrase such as
"ct129: nvidia-smi") and returns records with `to_dict()` (JSON-safe) or plain dicts. Input of
the wrong shape raises ParseError, whose one-line message names the source, the line and what
was expected, so callers can print it as is. The public names are importable from here.
"""

from __future__ import annotations

from dflash_infra.parsers.common import ParseError
from dflash_infra.parsers.dpkg import (
    DpkgPackage,
    debian_upstream,
    embedded_upstream,
    nvidia_branch,
    parse_dpkg_list,
    parse_dpkg_query,
)
from dflash_infra.parsers.kinds import PARSERS, parse_file, parse_text
from dflash_infra.parsers.nvml import NvmlStatus, library_version_from_path, parse_nvml
from dflash_infra.parsers.proc import (
    KernelModule,
    ProcDevices,
    parse_driver,
    parse_gpu_information,
    parse_proc_devices,
)
from dflash_infra.parsers.smi_query import ComputeApp, GpuRecord, parse_apps, parse_gpus
from dflash_infra.parsers.smi_table import SmiGpu, SmiProcess, SmiTable, SmiVersion, parse_smi_table, parse_smi_version

__all__ = [
    "PARSERS",
    "ComputeApp",
    "DpkgPackage",
    "GpuRecord",
    "KernelModule",
    "NvmlStatus",
    "ParseError",
    "ProcDevices",
    "SmiGpu",
    "SmiProcess",
    "SmiTable",
    "SmiVersion",
    "debian_upstream",
    "embedded_upstream",
    "library_version_from_path",
    "nvidia_branch",
    "parse_apps",
    "parse_dpkg_list",
    "parse_dpkg_query",
    "parse_driver",
    "parse_file",
    "parse_gpu_information",
    "parse_gpus",
    "parse_nvml",
    "parse_proc_devices",
    "parse_smi_table",
    "parse_smi_version",
    "parse_text",
]
