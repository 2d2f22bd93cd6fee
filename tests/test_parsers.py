"""The parsers against real captures: this project's H200 test machine and public outputs
(tests/fixtures/nvidia/public-captures.md, section numbers below refer to it)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture_fixtures import block, h200, output, outputs, paragraphs, sections
from dflash_infra.parsers import (
    PARSERS,
    ParseError,
    debian_upstream,
    embedded_upstream,
    library_version_from_path,
    nvidia_branch,
    parse_apps,
    parse_dpkg_list,
    parse_dpkg_query,
    parse_driver,
    parse_file,
    parse_gpu_information,
    parse_gpus,
    parse_nvml,
    parse_proc_devices,
    parse_smi_table,
    parse_smi_version,
    parse_text,
)

# Property tests run without a per-example time limit (no wall-clock limits in tests).
PROPERTY = settings(deadline=None, max_examples=200)

H200_INFORMATION = "proc-driver-nvidia-gpus-0000_00_06.0-information.txt"

NVIDIA_SMI_FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def misc_part(start: str) -> str:
    """The output that follows a `+ <command>` trace line in the H200 misc.txt, up to the next trace line."""
    lines = h200("misc.txt").splitlines()
    begin = lines.index(start) + 1
    end = next(i for i in range(begin, len(lines)) if lines[i].startswith("+ "))
    return "".join(line + "\n" for line in lines[begin:end])


def test_capture_file_has_the_sections_the_tests_use() -> None:
    assert {"1.1", "2.3", "3.5", "3.20b", "3.21f", "3.22", "4.2", "5.9"} <= set(sections())
    # Prompt lines are split off, output lines come back unchanged.
    assert outputs("1.16")[-1] == ("", "")
    assert output("2.10").startswith("index, name, memory.total [MiB]\n")
    assert output("3.6").startswith("Sun Jan 25 17:03:20 2026       \n")


# --------------------------------------------------------------------------- H200 test machine


class TestH200:
    def test_query_gpu_with_header(self) -> None:
        [gpu] = parse_gpus(h200("query-gpu-header.csv"), "query-gpu-header.csv")
        assert gpu.to_dict() == {
            "index": 0,
            "name": "NVIDIA H200",
            "memory_total_mib": 143771,
            "compute_cap": "9.0",
            "driver_version": "580.159.04",
            "pci_bus_id": "00000000:00:06.0",
            "uuid": "GPU-ec97746d-7bd3-ef73-507a-8163a5efd05f",
        }

    def test_query_compute_apps(self) -> None:
        [app] = parse_apps(h200("query-compute-apps.csv"))
        assert app.to_dict() == {"pid": 446, "process_name": "python3", "used_memory_mib": 10758}

    def test_kernel_module_is_open_580_159_04(self) -> None:
        module = parse_driver(h200("proc-driver-nvidia-version.txt"))
        assert module.to_dict() == {
            "version": "580.159.04",
            "flavor": "open",
            "arch": "x86_64",
            "gcc_version": "15.3.0",
        }

    def test_idle_table(self) -> None:
        table = parse_smi_table(h200("nvidia-smi.txt"))
        assert (table.smi_version, table.driver_version, table.cuda_version) == (
            "580.159.04",
            "580.159.04",
            "13.0",
        )
        [gpu] = table.gpus
        assert (gpu.index, gpu.name, gpu.bus_id) == (0, "NVIDIA H200", "00000000:00:06.0")
        assert (gpu.memory_used_mib, gpu.memory_total_mib) == (0, 143771)
        assert (gpu.persistence_mode, gpu.compute_mode, gpu.name_truncated) == ("On", "Default", False)
        assert table.processes == [] and table.processes_state == "none_running"

    def test_table_with_a_process(self) -> None:
        table = parse_smi_table(h200("nvidia-smi-with-process.txt"))
        assert table.gpus[0].memory_used_mib == 10767
        [proc] = table.processes
        assert proc.to_dict() == {
            "gpu": 0,
            "gpu_instance": None,
            "compute_instance": None,
            "pid": 446,
            "type": "C",
            "process_name": "python3",
            "used_memory_mib": 10758,
        }
        assert table.processes_state == "listed"

    def test_version(self) -> None:
        version = parse_smi_version(h200("nvidia-smi-version.txt"))
        assert version.to_dict() == {
            "smi_version": "580.159.04",
            "nvml_version": "580.159",
            "driver_version": "580.159.04",
            "cuda_version": "13.0",
        }

    @pytest.mark.parametrize(
        "name",
        ["nvidia-smi.txt", "nvidia-smi-with-process.txt", "nvidia-smi-version.txt", "nvidia-smi-q.txt"],
    )
    def test_nvml_is_ok(self, name: str) -> None:
        status = parse_nvml(h200(name))
        assert status.status == "ok" and status.message == ""
        # -q prints no NVIDIA-SMI or NVML version line, so the library version stays unknown.
        assert status.library_version == (None if name == "nvidia-smi-q.txt" else "580.159")

    def test_proc_devices(self) -> None:
        devices = parse_proc_devices(misc_part("+ cat /proc/devices"))
        assert devices.major("nvidia-uvm") == 238
        assert devices.major("nvidia") == devices.major("nvidiactl") == 195
        assert devices.major("nvidia-caps") == 241  # exact name, not nvidia-caps-imex-channels (242)
        assert devices.major("nvidia-caps-imex-channels") == 242
        assert devices.major("virtblk", kind="block") == 254
        assert devices.major("nvidia-frontend") is None
        # This kernel registers infiniband_mad and infiniband_verbs twice, with different majors.
        assert devices.ambiguous == {"infiniband_mad": [231, 245], "infiniband_verbs": [231, 244]}
        with pytest.raises(
            ParseError, match=r"infiniband_mad is registered with several majors \[231, 245\]"
        ):
            devices.major("infiniband_mad")

    def test_user_space_is_not_package_managed(self) -> None:
        packages = parse_dpkg_list(misc_part("+ grep -i nvidia"))
        assert [(p.package, p.upstream, p.status) for p in packages] == [
            ("cuda-nsight-compute-13-0", "13.0.2", "ii"),
            ("cuda-nvtx-13-0", "13.0.85", "ii"),
            ("libnccl-dev", "2.28.3", "hi"),
            ("libnccl2", "2.28.3", "hi"),
            ("nsight-compute-2025.3.1", "2025.3.1.4", "ii"),
        ]
        assert [p.package for p in packages if p.held] == ["libnccl-dev", "libnccl2"]
        assert all(p.installed for p in packages)
        # No driver package at all: the libraries come from a bind mount.
        assert not any(nvidia_branch(p.package) for p in packages)

    def test_gpu_information_without_nvml(self) -> None:
        info = parse_gpu_information(h200(H200_INFORMATION), H200_INFORMATION)
        assert info == {
            "name": "NVIDIA H200",
            "uuid": "GPU-ee3729f3-f3e0-707b-4478-8312f077d0e1",
            "bus_location": "0000:00:06.0",
            "pci_bus_id": "00000000:00:06.0",
            "device_minor": 0,
            "irq": 41,
            "bus_type": "PCIe",
            "dma_size_bits": 52,
            "dma_mask": "0xfffffffffffff",
            "video_bios": "96.00.a5.00.1a",
            "firmware": "580.159.04",
            "excluded": False,
        }
        # The GSP firmware is the loaded kernel module's own version.
        assert info["firmware"] == parse_driver(h200("proc-driver-nvidia-version.txt")).version

    def test_gpu_information_names_the_gpu_nvidia_smi_lists(self) -> None:
        # Taken the same day: NVML and the kernel module agree on the GPU behind bus 00:06.0 (the older
        # query-gpu-header.csv was taken with another GPU there).
        [gpu] = parse_gpus(h200("query-gpu-bus-uuid-2026-12-01.csv"))
        info = parse_gpu_information(h200(H200_INFORMATION))
        assert (gpu.name, gpu.uuid, gpu.pci_bus_id) == (info["name"], info["uuid"], info["pci_bus_id"])
        assert gpu.memory_total_mib == 143771

    def test_injected_libraries_match_the_kernel_module(self) -> None:
        resolved = [
            line for line in h200("misc.txt").splitlines() if line.startswith("/usr/local/nvidia/lib64/")
        ]
        assert len(resolved) == 4
        versions = {library_version_from_path(path) for path in resolved}
        assert versions == {parse_driver(h200("proc-driver-nvidia-version.txt")).version} == {"580.159.04"}


# --------------------------------------------------------------------------- kernel module


class TestDriver:
    def test_open_module_565(self) -> None:
        assert parse_driver(block("1.1")).to_dict() == {
            "version": "565.57.01",
            "flavor": "open",
            "arch": "x86_64",
            "gcc_version": "13.3.0",
        }

    def test_proprietary_three_part(self) -> None:
        assert parse_driver(output("1.9")).to_dict() == {
            "version": "580.173.02",
            "flavor": "proprietary",
            "arch": "x86_64",
        }

    def test_proprietary_two_part_next_to_other_commands(self) -> None:
        # 4.4 prints /proc/driver/nvidia/version, then modinfo (580.159.03) and dpkg rows.
        module = parse_driver(block("4.4"))
        assert (module.version, module.flavor, module.gcc_version) == ("580.142", "proprietary", "12.3.0")

    def test_proxmox_host_debian_gcc(self) -> None:
        module = parse_driver(block("5.4", 6))
        assert module.to_dict() == {
            "version": "580.159.04",
            "flavor": "proprietary",
            "arch": "x86_64",
            "gcc_version": "14.2.0",
        }

    def test_dmesg_banners_aarch64(self) -> None:
        # The nvidia-modeset banner on the next line has the same shape and must not be taken.
        assert parse_driver(block("1.13", 0), "dmesg").to_dict() == {
            "version": "580.95.05",
            "flavor": "open",
            "arch": "aarch64",
        }
        assert parse_driver(block("1.13", 1), "dmesg").to_dict() == {
            "version": "535.161.07",
            "flavor": "proprietary",
            "arch": "aarch64",
        }

    def test_journal_banner(self) -> None:
        module = parse_driver(output("1.16"), "journalctl -k")
        assert (module.version, module.flavor, module.arch) == ("580.173.02", "open", "x86_64")

    def test_last_load_banner_wins(self) -> None:
        first = block("1.13", 1).splitlines()[0]
        second = block("1.13", 0).splitlines()[0]
        assert parse_driver(f"{first}\n{second}\n", "dmesg").version == "580.95.05"

    @pytest.mark.parametrize("flavor", ["proprietary", "open"])
    def test_documentation_lines_have_no_version(self, flavor: str) -> None:
        line = next(
            text
            for text in block("1.12").splitlines()
            if "NVRM version:" in text and ("Open" in text) == (flavor == "open")
        )
        with pytest.raises(
            ParseError,
            match=r"version\.txt line 1: expected a version like 580\.126\.09 .*found '\[\.\.\.\]'",
        ):
            parse_driver(line.strip(), "version.txt")

    def test_no_banner(self) -> None:
        with pytest.raises(
            ParseError, match=r"^version\.txt: expected a line 'NVRM version: .*is the nvidia module loaded\?"
        ):
            parse_driver("cat: /proc/driver/nvidia/version: No such file or directory\n", "version.txt")

    def test_banner_of_another_shape(self) -> None:
        with pytest.raises(ParseError, match=r"line 1: expected 'NVIDIA UNIX \[Open\] \.\.\. Kernel Module"):
            parse_driver("NVRM version: something else 1.2.3\n")


# --------------------------------------------------------------------------- --query-gpu CSV


class TestQueryGpu:
    def test_noheader_needs_fields(self) -> None:
        text = output("2.1")
        with pytest.raises(
            ParseError, match=r"gpus\.csv line 1: no CSV header and no field list.*--fields a,b,c"
        ):
            parse_gpus(text, "gpus.csv")
        [gpu] = parse_gpus(
            text, "gpus.csv", fields=["name", "driver_version", "compute_cap"], require=["name"]
        )
        assert gpu.to_dict() == {
            "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "memory_total_mib": None,
            "driver_version": "580.126.09",
            "compute_cap": "12.0",
        }

    def test_planner_needs_memory(self) -> None:
        with pytest.raises(
            ParseError, match=r"gpus\.csv: expected the GPU fields name, memory\.total; missing memory\.total"
        ):
            parse_gpus(output("2.1"), "gpus.csv", fields=["name", "driver_version", "compute_cap"])

    def test_header_with_units_and_an_unknown_field(self) -> None:
        gpus = parse_gpus(output("2.3"))
        assert [g.to_dict() for g in gpus] == [
            {
                "name": "NVIDIA L40S",
                "memory_total_mib": 46068,
                "driver_version": "595.71.05",
                "pci_bus_id": "00000000:01:00.0",
                "pci_device_id": "0x26B910DE",
            },
            {
                "name": "NVIDIA L40S",
                "memory_total_mib": 46068,
                "driver_version": "595.71.05",
                "pci_bus_id": "00000000:91:00.0",
                "pci_device_id": "0x26B910DE",
            },
        ]

    def test_two_a6000(self) -> None:
        gpus = parse_gpus(output("2.10"))
        assert [(g.index, g.name, g.memory_total_mib) for g in gpus] == [
            (0, "NVIDIA RTX A6000", 49140),
            (1, "NVIDIA RTX A6000", 49140),
        ]

    def test_max_q_full_name_and_uuids(self) -> None:
        names = parse_gpus(block("3.4", 1), require=["name", "compute_cap"])
        assert {(g.name, g.compute_cap) for g in names} == {
            ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "12.0")
        }
        uuids = parse_gpus(block("3.4", 2), require=["index", "uuid"])
        assert [(g.index, g.uuid) for g in uuids] == [
            (0, "GPU-23b4975b-2171-ea56-f5f7-f78bf0cd300a"),
            (1, "GPU-d0b27d44-e215-eeda-b053-6a2342e854c5"),
        ]

    def test_used_and_free_memory(self) -> None:
        gpus_csv, _apps_csv = paragraphs(output("3.15"))
        [gpu] = parse_gpus(gpus_csv)
        assert gpu.to_dict() == {
            "index": 0,
            "name": "NVIDIA L40S",
            "memory_total_mib": 46068,
            "memory_used_mib": 9123,
            "memory_free_mib": 36346,
        }

    def test_nvml_mismatch_instead_of_csv(self) -> None:
        with pytest.raises(
            ParseError,
            match=r"^gpus\.csv: nvidia-smi failed instead of printing --query-gpu CSV: Failed to initialize NVML: "
            r"Driver/library version mismatch \(NVML library version 580\.159\)$",
        ):
            parse_gpus(block("5.4", 7), "gpus.csv")

    def test_wrong_field_count(self) -> None:
        text = h200("query-gpu-header.csv") + "1, NVIDIA H200, 143771 MiB\n"
        with pytest.raises(
            ParseError,
            match=r"^gpus\.csv line 3: expected 7 fields \(index, name, memory\.total, driver_version, compute_cap, "
            r"pci\.bus_id, uuid\), found 3",
        ):
            parse_gpus(text, "gpus.csv")

    def test_bad_memory_value(self) -> None:
        with pytest.raises(
            ParseError,
            match=r"gpus\.csv line 2: memory\.total must be a number of MiB like '49140 MiB', found '48 GB'",
        ):
            parse_gpus("index, name, memory.total [MiB]\n0, NVIDIA RTX A6000, 48 GB\n", "gpus.csv")

    def test_bad_compute_cap(self) -> None:
        with pytest.raises(ParseError, match=r"line 1: compute_cap must look like '12\.0', found 'sm_120'"):
            parse_gpus("NVIDIA X, 97887, sm_120\n", fields=["name", "memory.total", "compute_cap"])

    def test_fields_that_contradict_the_header(self) -> None:
        with pytest.raises(
            ParseError,
            match=r"line 1: the header names index, name, memory\.total but the field list says "
            r"name, index, memory\.total",
        ):
            parse_gpus(output("2.10"), fields=["name", "index", "memory.total"])

    def test_no_rows(self) -> None:
        with pytest.raises(
            ParseError, match=r"^gpus\.csv: no GPU rows: expected nvidia-smi --query-gpu CSV output$"
        ):
            parse_gpus("", "gpus.csv")
        with pytest.raises(ParseError, match="no GPU rows"):
            parse_gpus("index, name, memory.total [MiB]\n", "gpus.csv")

    def test_aliases_and_not_available(self) -> None:
        [gpu] = parse_gpus(
            "0, NVIDIA H200, 143771, [N/A]\n", fields=["index", "gpu_name", "memory.total", "gpu_uuid"]
        )
        assert gpu.to_dict() == {"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771}


# --------------------------------------------------------------------------- --query-compute-apps CSV


class TestQueryApps:
    def test_triton_host(self) -> None:
        _gpus_csv, apps_csv = paragraphs(output("3.15"))
        assert [a.to_dict() for a in parse_apps(apps_csv)] == [
            {"pid": 44378, "process_name": "tritonserver", "used_memory_mib": 1836},
            {
                "pid": 44966,
                "process_name": "/opt/tritonserver/backends/python/triton_python_backend_stub",
                "used_memory_mib": 974,
            },
            {"pid": 52114, "process_name": "/usr/bin/python3", "used_memory_mib": 6294},
        ]

    def test_name_alias_printed_as_process_name(self) -> None:
        text = output("3.19")
        assert text.startswith("gpu_uuid, process_name\n")  # the query said `name`
        apps = parse_apps(text, fields=["gpu_uuid", "name"], require=["process_name"])
        assert [(a.gpu_uuid, a.process_name, a.pid) for a in apps] == [
            ("GPU-d0180485-9584-433c-6782-c335d5df2cb3", "vgpu", None),
            ("GPU-777ead31-954e-837f-590f-6c4974d8e571", "vgpu", None),
            ("GPU-777ead31-954e-837f-590f-6c4974d8e571", "vgpu", None),
        ]
        with pytest.raises(
            ParseError,
            match=r"expected the compute app fields pid, process_name, used_gpu_memory; missing pid, used_gpu_memory",
        ):
            parse_apps(text)

    def test_idle_is_an_empty_list(self) -> None:
        assert parse_apps(block("3.20a", 3)) == []

    def test_all_columns_under_load(self) -> None:
        apps = parse_apps(block("3.20a", 4))
        assert [(a.pid, a.process_name, a.used_memory_mib) for a in apps] == [
            (10291, "/root/tools/memhog", 2566),
            (10293, "/root/tools/memhog", 1542),
            (10309, "./gpu_burn", 28234),
        ]
        assert apps[0].to_dict() == {
            "pid": 10291,
            "process_name": "/root/tools/memhog",
            "used_memory_mib": 2566,
            "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "timestamp": "2026/07/03 22:11:09.916",
            "gpu_name": "NVIDIA H200",
            "gpu_bus_id": "00000000:83:00.0",
            "gpu_serial": "0000000000000",
        }

    def test_not_available_serial(self) -> None:
        apps = parse_apps(block("3.20b", 2))
        assert [(a.pid, a.used_memory_mib, a.extra["gpu_serial"]) for a in apps] == [
            (28512, 370, None),
            (28511, 230, None),
        ]

    def test_not_available_memory(self) -> None:
        [app] = parse_apps("pid, process_name, used_gpu_memory [MiB]\n7, python3, [N/A]\n")
        assert app.to_dict() == {"pid": 7, "process_name": "python3", "used_memory_mib": None}

    def test_bad_pid(self) -> None:
        with pytest.raises(
            ParseError, match=r"apps\.csv line 2: pid must be a whole number, found 'python3'"
        ):
            parse_apps("pid, process_name, used_gpu_memory [MiB]\npython3, 446, 10758 MiB\n", "apps.csv")


# --------------------------------------------------------------------------- NVML status


class TestNvml:
    @pytest.mark.parametrize(
        ("section", "index", "library"), [("3.10", 0, "565.57"), ("4.4", 1, "580.159"), ("5.4", 7, "580.159")]
    )
    def test_mismatch(self, section: str, index: int, library: str) -> None:
        assert parse_nvml(block(section, index)).to_dict() == {
            "status": "mismatch",
            "library_version": library,
            "message": "Failed to initialize NVML: Driver/library version mismatch",
        }

    def test_driver_not_loaded(self) -> None:
        status = parse_nvml(NVIDIA_SMI_FAILED)
        assert (status.status, status.library_version) == ("error", None)
        assert status.message.startswith("NVIDIA-SMI has failed because it couldn't communicate")

    def test_no_nvidia_smi(self) -> None:
        status = parse_nvml("bash: line 1: nvidia-smi: command not found\n")
        assert status.to_dict() == {
            "status": "error",
            "library_version": None,
            "message": "bash: line 1: nvidia-smi: command not found",
        }

    def test_nothing_printed(self) -> None:
        assert parse_nvml("\n").to_dict() == {
            "status": "error",
            "library_version": None,
            "message": "nvidia-smi printed nothing",
        }

    @pytest.mark.parametrize(
        ("section", "index", "library"),
        [("3.5", 0, "610.57"), ("3.20b", 0, "610.57"), ("3.20c", 0, "595.80"), ("2.3", 0, None)],
    )
    def test_ok(self, section: str, index: int, library: str | None) -> None:
        assert parse_nvml(output(section, index)).to_dict() == {
            "status": "ok",
            "library_version": library,
            "message": "",
        }

    def test_table_parser_reports_the_failure(self) -> None:
        with pytest.raises(
            ParseError,
            match=r"^nvidia-smi: nvidia-smi failed instead of printing its table: NVIDIA-SMI has failed",
        ):
            parse_smi_table(NVIDIA_SMI_FAILED)


# --------------------------------------------------------------------------- default nvidia-smi table

# (section, block, smi/driver version, cuda, GPU count, first GPU name, used MiB, total MiB, processes_state)
TABLES = [
    ("3.1", 0, "550.127.05", "12.4", 9, "NVIDIA RTX A6000", 1, 46068, "none_running"),
    ("3.2", 0, "590.48.01", "13.1", 2, "NVIDIA RTX PRO 6000 Blac...", 15, 97887, "listed"),
    ("3.3", 0, "580.95.05", "13.0", 2, "NVIDIA H100 80GB HBM3", 18903, 81559, "listed"),
    ("3.4", 0, "595.71.05", "13.2", 2, "NVIDIA RTX PRO 6000 Blac...", 15, 97887, "absent"),
    ("3.5", 0, "610.57.04", "13.3", 3, "NVIDIA RTX PRO 6000 Blac...", 562, 97887, "absent"),
    ("3.6", 0, "580.95.05", "13.0", 1, "NVIDIA RTX PRO 6000 Blac...", 2, 97887, "none_running"),
    ("3.20a", 2, "590.48.01", "13.1", 1, "NVIDIA H200", 32362, 143771, "listed"),
    ("3.20b", 1, "610.57.04", "13.3", 1, "NVIDIA GeForce RTX 2080 ...", 815, 8192, "listed"),
    ("3.20d", 0, "590.48.01", "13.1", 1, "NVIDIA H100 80GB HBM3", 0, 81559, "none_running"),
    ("3.21a", 0, "565.57.01", "12.7", 8, "NVIDIA H100 80GB HBM3", 1, 81559, "none_running"),
    ("3.21b", 0, "550.127.05", "12.4", 8, "NVIDIA GeForce RTX 4090", 2, 24564, "none_running"),
    ("3.21c", 0, "550.127.05", "12.4", 8, "NVIDIA RTX 6000 Ada Gene...", 2, 49140, "none_running"),
    ("3.21d", 0, "550.127.05", "12.4", 1, "NVIDIA GH200 480GB", 3, 97871, "none_running"),
    ("3.21e", 0, "570.124.06", "12.8", 1, "NVIDIA GeForce RTX 5090", 2, 32607, "none_running"),
    ("3.21f", 0, "535.161.07", "12.2", 1, "NVIDIA GeForce GTX 1050 Ti", 0, 4096, "none_running"),
    ("3.22", 0, "535.86.10", "12.5", 2, "NVIDIA RTX A6000", 21636, 49140, "empty"),
    ("3.23", 0, "580.82.09", "13.0", 2, "NVIDIA GeForce RTX 5090", 2, 32607, "absent"),
]


class TestSmiTable:
    @pytest.mark.parametrize(
        ("section", "index", "version", "cuda", "count", "name", "used", "total", "state"), TABLES
    )
    def test_layouts(
        self,
        section: str,
        index: int,
        version: str,
        cuda: str,
        count: int,
        name: str,
        used: int,
        total: int,
        state: str,
    ) -> None:
        table = parse_smi_table(output(section, index), f"section {section}")
        assert (table.smi_version, table.driver_version, table.cuda_version) == (version, version, cuda)
        assert len(table.gpus) == count
        assert [g.index for g in table.gpus] == list(range(count))
        first = table.gpus[0]
        assert (first.name, first.memory_used_mib, first.memory_total_mib) == (name, used, total)
        assert first.name_truncated == name.endswith("...")
        assert table.processes_state == state
        json.dumps(table.to_dict())

    def test_nine_a6000_with_ecc(self) -> None:
        table = parse_smi_table(output("3.1"))
        assert {g.memory_total_mib for g in table.gpus} == {46068}  # ECC on; 49140 MiB with ECC off
        assert [g.bus_id for g in table.gpus][-1] == "00000000:D6:00.0"

    def test_xorg_on_both_pro_6000(self) -> None:
        table = parse_smi_table(output("3.2"))
        assert [(p.gpu, p.pid, p.type, p.process_name, p.used_memory_mib) for p in table.processes] == [
            (0, 1614, "G", "/usr/lib/xorg/Xorg", 4),
            (1, 1614, "G", "/usr/lib/xorg/Xorg", 4),
        ]
        assert [g.persistence_mode for g in table.gpus] == ["Off", "Off"]

    def test_training_processes_on_two_h100(self) -> None:
        table = parse_smi_table(output("3.3"))
        assert [(p.gpu, p.pid, p.used_memory_mib) for p in table.processes] == [
            (0, 4935, 18256),
            (0, 4936, 630),
            (1, 4935, 630),
            (1, 4936, 18258),
        ]
        assert {p.process_name for p in table.processes} == {"...und/unsloth/.venv/bin/python3"}

    def test_kmd_header(self) -> None:
        table = parse_smi_table(output("3.20b", 1))
        assert (table.driver_version, table.cuda_version) == ("610.57.04", "13.3")
        assert [(p.pid, p.type, p.process_name) for p in table.processes][:2] == [
            (1720, "G", "/usr/bin/gnome-shell"),
            (4556, "G", "/usr/bin/Xwayland"),
        ]

    def test_container_cannot_see_host_processes(self) -> None:
        table = parse_smi_table(output("3.22"))
        assert table.processes == [] and table.processes_state == "empty"
        assert table.gpus[0].memory_used_mib == 21636  # memory is in use all the same

    def test_mixed_gpus(self) -> None:
        table = parse_smi_table(output("3.23", 0))
        assert [(g.name, g.memory_total_mib) for g in table.gpus] == [
            ("NVIDIA GeForce RTX 5090", 32607),
            ("NVIDIA GeForce RTX 4090", 24564),
        ]

    def test_cut_off_table_is_refused(self) -> None:
        with pytest.raises(
            ParseError, match=r"^smi\.txt line 13: GPU 1 has no second row .*the table looks cut off$"
        ):
            parse_smi_table(output("3.23", 1), "smi.txt")

    def test_no_table(self) -> None:
        with pytest.raises(ParseError, match=r"^smi\.txt: expected the nvidia-smi table header"):
            parse_smi_table(output("2.10"), "smi.txt")

    def test_mig_style_process_row(self) -> None:
        # The H200 capture with GI/CI numbers in the columns where MIG mode prints them.
        text = h200("nvidia-smi-with-process.txt").replace(
            "|    0   N/A  N/A             446      C   python3 ",
            "|    0     1    0             446      C   python3 ",
        )
        [proc] = parse_smi_table(text).processes
        assert (proc.gpu_instance, proc.compute_instance, proc.pid) == (1, 0, 446)

    def test_bad_memory_cell(self) -> None:
        text = h200("nvidia-smi.txt").replace("      0MiB / 143771MiB", "      0MiB / 143771GiB")
        with pytest.raises(
            ParseError, match=r"line 10: GPU 0: expected memory like '15MiB', found '143771GiB'"
        ):
            parse_smi_table(text)


class TestSmiVersion:
    def test_old_layout(self) -> None:
        assert parse_smi_version(block("3.20a", 0)).to_dict() == {
            "smi_version": "590.48.01",
            "nvml_version": "590.48",
            "driver_version": "590.48.01",
            "cuda_version": "13.1",
        }

    def test_610_layout_with_deprecated_lines(self) -> None:
        assert parse_smi_version(block("3.20b", 0)).to_dict() == {
            "smi_version": "610.57.04",
            "nvml_version": "610.57",
            "driver_version": "610.57.04",
            "cuda_version": "13.3",
        }

    def test_two_part_driver(self) -> None:
        version = parse_smi_version(block("3.20c", 0))
        assert (version.smi_version, version.nvml_version, version.driver_version) == (
            "595.80",
            "595.80",
            "595.80",
        )

    def test_not_a_version_output(self) -> None:
        with pytest.raises(ParseError, match=r"^v\.txt: expected a line 'NVIDIA-SMI version  : <version>'"):
            parse_smi_version(block("3.20a", 1), "v.txt")


# --------------------------------------------------------------------------- /proc/devices


class TestProcDevices:
    def test_new_naming_without_uvm(self) -> None:
        devices = parse_proc_devices(output("5.9", 0))
        assert devices.major("nvidia") == devices.major("nvidia-modeset") == 195
        assert devices.major("nvidia-uvm") is None
        assert devices.major("nvme") == 239

    def test_imex_and_nvswitch(self) -> None:
        devices = parse_proc_devices(output("5.9", 2))
        assert devices.to_dict() == {
            "character": {
                "nvidia": 195,
                "nvidiactl": 195,
                "nvidia-caps-imex-channels": 234,
                "nvidia-nvswitch": 509,
            },
            "block": {},
        }

    @pytest.mark.parametrize(
        ("index", "command", "line", "found"),
        [
            (1, "grep nvidia /proc/devices", 2, "508 nvidia-uvm # confirms the dynamic allocation"),
            (3, None, 2, "..."),
            (5, None, 1, "195 nvidia <- the frontend"),
        ],
    )
    def test_annotated_pastes_are_refused(
        self, index: int, command: str | None, line: int, found: str
    ) -> None:
        with pytest.raises(
            ParseError, match=rf"^devices line {line}: expected '<major> <name>' .*found '{found}"
        ):
            parse_proc_devices(output("5.9", index, command), "devices")

    def test_empty(self) -> None:
        with pytest.raises(
            ParseError, match=r"expected '<major> <name>' lines \(cat /proc/devices\), found none"
        ):
            parse_proc_devices("Character devices:\n")


# --------------------------------------------------------------------------- /proc/driver/nvidia/gpus/<bus>/information


def information(**replace: str | None) -> str:
    """The H200 information file with some lines replaced (None drops a line)."""
    lines = []
    for line in h200(H200_INFORMATION).splitlines():
        key = line.split(":", 1)[0]
        if key not in replace:
            lines.append(line)
        elif replace[key] is not None:
            lines.append(f"{key}: \t {replace[key]}")
    return "".join(f"{line}\n" for line in lines)


class TestGpuInformation:
    def test_uninitialised_gpu_has_no_uuid_or_vbios_yet(self) -> None:
        info = parse_gpu_information(information(**{"GPU UUID": "GPU-????????-????-????-????-????????????",
                                                    "Video BIOS": "??.??.??.??.??"}))
        assert (info["uuid"], info["video_bios"], info["name"]) == (None, None, "NVIDIA H200")

    def test_older_drivers(self) -> None:
        # Before the 460 branch 'GPU Excluded' was 'Blacklisted'; before GSP there is no firmware line.
        text = information(**{"GPU Excluded": None, "GPU Firmware": None}) + "Blacklisted:\t Yes\n"
        info = parse_gpu_information(text)
        assert (info["excluded"], info["firmware"]) == (True, None)
        assert parse_gpu_information(information(**{"GPU Excluded": None}))["excluded"] is False

    def test_bus_with_hex_digits_in_nvidia_smi_spelling(self) -> None:
        info = parse_gpu_information(information(**{"Bus Location": "0000:3b:00.0", "Device Minor": "7"}))
        assert (info["bus_location"], info["pci_bus_id"], info["device_minor"]) == (
            "0000:3b:00.0", "00000000:3B:00.0", 7)

    def test_unknown_lines_are_left_out(self) -> None:
        info = parse_gpu_information(information() + "Interconnect: \t NVLink\n")
        assert "Interconnect" not in json.dumps(info)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (lambda: "", r"^info: expected the 'Model:', 'GPU UUID:', 'Bus Location:' \.\.\. lines of "
                         r"/proc/driver/nvidia/gpus/<bus>/information, found nothing$"),
            (lambda: information(**{"Device Minor": None, "IRQ": None}),
             r"^info: expected the lines Model:, IRQ:, GPU UUID:, Bus Location:, Device Minor: of "
             r"/proc/driver/nvidia/gpus/<bus>/information; missing IRQ:, Device Minor:$"),
            (lambda: information(**{"Device Minor": "zero"}),
             r"^info line 9: Device Minor must be a whole number, found 'zero'$"),
            (lambda: information(**{"Bus Location": "00:06.0"}),
             r"^info line 8: Bus Location must be a PCI address like '0000:17:00\.0', found '00:06\.0'$"),
            (lambda: information(**{"GPU UUID": "ee3729f3"}),
             r"^info line 3: GPU UUID must look like 'GPU-ee3729f3-.*', found 'ee3729f3'$"),
            (lambda: information(**{"GPU Excluded": "maybe"}),
             r"^info line 11: GPU Excluded must be Yes or No, found 'maybe'$"),
            (lambda: information(**{"DMA Size": "52"}),
             r"^info line 6: DMA Size must be a number of bits like '52 bits', found '52'$"),
            (lambda: information(**{"Model": "N/A"}), r"^info line 1: Model must name the GPU model, found 'N/A'$"),
            (lambda: information() + information(),
             r"^info line 12: 'Model:' appears twice \(first on line 1\); expected the information file of one GPU$"),
            (lambda: information() + "garbage\n",
             r"^info line 12: expected 'Key: value' lines of .*, found 'garbage'$"),
            (lambda: h200("proc-driver-nvidia-version.txt"), r"^info: expected the lines Model:, .*; missing Model:, "),
        ],
    )
    def test_malformed(self, text, message: str) -> None:
        with pytest.raises(ParseError, match=message) as caught:
            parse_gpu_information(text(), "info")
        assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- dpkg


class TestDpkgList:
    def test_ubuntu_archive_580_open(self) -> None:
        packages = {p.package: p for p in parse_dpkg_list(output("4.1"))}
        assert len(packages) == 25
        compute = packages["libnvidia-compute-580"]
        assert (compute.arch, compute.version, compute.upstream, compute.status) == (
            "amd64",
            "580.95.05-0ubuntu0.24.04.3",
            "580.95.05",
            "ii",
        )
        assert packages["libnvidia-common-580"].arch == "all"
        assert packages["libnvidia-egl-wayland1"].upstream == "1.1.13"  # epoch 1: stripped
        assert packages["nvidia-settings"].upstream == "510.47.03"  # a version of its own, no branch
        assert nvidia_branch("nvidia-settings") is None
        assert embedded_upstream("nvidia-firmware-580-580.95.05") == "580.95.05"
        branch_580 = {
            p.upstream
            for p in packages.values()
            if nvidia_branch(p.package) == "580" and "linux-" not in p.package
        }
        assert branch_580 == {"580.95.05"}

    def test_cuda_repo_next_to_archive_with_broken_states(self) -> None:
        packages = parse_dpkg_list(output("4.2"))
        by_name = {(p.package, p.upstream): p for p in packages}
        assert by_name[("libnvidia-compute-550", "550.163.01")].version == "550.163.01-0ubuntu0.24.04.2"
        assert by_name[("libnvidia-compute-580", "580.95.05")].version == "580.95.05-0ubuntu1"
        dkms = by_name[("nvidia-dkms-580-open", "580.95.05")]
        driver = by_name[("nvidia-driver-580-open", "580.95.05")]
        assert (dkms.status, dkms.installed, driver.status, driver.installed) == ("iF", False, "iU", False)
        assert (
            nvidia_branch("nvidia-firmware-580") == "580" and embedded_upstream("nvidia-firmware-580") is None
        )
        assert {nvidia_branch(p.package) for p in packages if p.package.startswith("libnvidia-compute")} == {
            "550",
            "580",
        }

    def test_lxc_user_space_differs_from_host_module(self) -> None:
        packages = parse_dpkg_list(output("4.3"))
        assert [(p.package, p.arch, p.upstream) for p in packages][:2] == [
            ("libnvidia-compute-580", "amd64", "580.159.03"),
            ("libnvidia-decode-580", "amd64", "580.159.03"),
        ]
        # Columns cut down by the author: no arch column, and no :arch suffix on these names.
        assert packages[-1].to_dict() == {
            "package": "nvidia-utils-580",
            "arch": None,
            "version": "580.159.03-0ubuntu0.22.04.1",
            "upstream": "580.159.03",
            "status": "ii",
            "installed": True,
            "held": False,
        }
        host_module = parse_driver(block("5.4", 6)).version
        assert host_module == "580.159.04" != packages[0].upstream

    def test_module_and_packages_disagree(self) -> None:
        text = block("4.4")
        rows = "".join(line + "\n" for line in text.splitlines() if line[:3] in ("ii ", "rc "))
        packages = parse_dpkg_list(rows)
        assert parse_driver(text).version == "580.142"
        compute = [p for p in packages if p.package == "libnvidia-compute-580"]
        assert {(p.arch, p.upstream) for p in compute} == {("amd64", "580.159.03"), ("i386", "580.159.03")}
        [removed] = [p for p in packages if p.status == "rc"]
        assert (removed.package, removed.upstream, removed.installed) == (
            "libnvidia-compute-550",
            "550.144.03",
            False,
        )
        # The paste ends inside the version column: the row still parses, to a shorter version.
        assert packages[-1].version == "580.159.0"

    def test_server_branch(self) -> None:
        packages = parse_dpkg_list(output("4.5"))
        assert {nvidia_branch(p.package) for p in packages} == {"550-server", None}
        assert embedded_upstream("nvidia-firmware-550-server-550.127.08") == "550.127.08"
        assert [p.upstream for p in packages if p.package == "libnvidia-compute-550-server"] == ["550.127.08"]

    def test_ppa_with_leftover_535(self) -> None:
        packages = parse_dpkg_list(output("4.6"))
        removed = sorted(p.package for p in packages if p.status == "rc")
        assert removed == [
            "libnvidia-compute-535",
            "linux-modules-nvidia-535-6.8.0-40-generic",
            "nvidia-compute-utils-535",
            "nvidia-kernel-common-535",
        ]
        installed_branches = {nvidia_branch(p.package) for p in packages if p.installed} - {None}
        assert installed_branches == {"550", "535"}  # linux-objects-nvidia-535 is still 'ii'
        assert {
            p.upstream
            for p in packages
            if nvidia_branch(p.package) == "550" and p.package.startswith("libnvidia")
        } == {"550.107.02"}

    def test_full_table_with_header(self) -> None:
        text = (
            "Desired=Unknown/Install/Remove/Purge/Hold\n"
            "| Status=Not/Inst/Conf-files/Unpacked/halF-conf/Half-inst/trig-aWait/Trig-pend\n"
            "|/ Err?=(none)/Reinst-required (Status,Err: uppercase=bad)\n"
            "||/ Name                     Version                     Architecture Description\n"
            "+++-========================-===========================-============-========================\n"
            + output("4.3")
        )
        assert len(parse_dpkg_list(text)) == 6

    def test_garbage_row(self) -> None:
        with pytest.raises(
            ParseError, match=r"^dpkg\.txt line 1: expected a dpkg -l row '<status> <package> <version>"
        ):
            parse_dpkg_list(block("4.4", 1), "dpkg.txt")

    def test_bad_version(self) -> None:
        with pytest.raises(
            ParseError,
            match=r"^dpkg\.txt line 1: libnvidia-compute-580: expected a Debian version, found 'latest'",
        ):
            parse_dpkg_list("ii  libnvidia-compute-580:amd64  latest  amd64  x\n", "dpkg.txt")


class TestDpkgQuery:
    def test_round_trip_of_real_rows(self) -> None:
        rows = parse_dpkg_list(output("4.6"))
        text = "".join(f"{p.package}:{p.arch}\t{p.version}\t{p.status} \n" for p in rows)
        assert [(p.package, p.arch, p.version, p.upstream, p.status) for p in parse_dpkg_query(text)] == [
            (p.package, p.arch, p.version, p.upstream, p.status) for p in rows
        ]

    def test_version_only_and_not_installed(self) -> None:
        text = "libnvidia-compute-580\t580.126.09-0ubuntu0.24.04.1\nnvidia-utils-580\t\tun \n"
        first, second = parse_dpkg_query(text)
        assert (first.upstream, first.status) == ("580.126.09", None)
        assert (second.version, second.upstream, second.status, second.installed) == ("", None, "un", False)

    def test_held(self) -> None:
        [package] = parse_dpkg_query("libnvidia-compute-580\t580.126.09-1ubuntu1\thi \n")
        assert (package.upstream, package.held, package.installed) == ("580.126.09", True, True)

    def test_wrong_shape(self) -> None:
        with pytest.raises(
            ParseError,
            match=r"^q line 1: expected 'package<TAB>version\[<TAB>status\]', found 1 tab-separated",
        ):
            parse_dpkg_query("libnvidia-compute-580 580.126.09\n", "q")
        with pytest.raises(
            ParseError, match=r"^q line 1: expected a dpkg status like 'ii' or 'rc', found 'installed'"
        ):
            parse_dpkg_query("libnvidia-compute-580\t580.126.09-1\tinstalled\n", "q")


class TestVersionsAndBranches:
    @pytest.mark.parametrize(
        ("version", "upstream"),
        [
            ("580.126.09-0ubuntu0.24.04.1", "580.126.09"),
            ("580.126.09-1ubuntu1", "580.126.09"),
            ("580.142-0ubuntu3", "580.142"),
            ("550.107.02-0ubuntu0~gpu22.04.1", "550.107.02"),
            ("1:1.1.13-1ubuntu0.1", "1.1.13"),
            ("2.28.3-1+cuda13.0", "2.28.3"),
            ("6.14.0-37.37~24.04.1", "6.14.0"),
            ("0.8.17.2", "0.8.17.2"),
            ("1.0-rc1-2", "1.0-rc1"),
        ],
    )
    def test_upstream(self, version: str, upstream: str) -> None:
        assert debian_upstream(version) == upstream

    @pytest.mark.parametrize("version", ["", "latest", "x:1.0-1", "1.0-", "-1", "580.126.09-0ubuntu0 24.04"])
    def test_bad_versions(self, version: str) -> None:
        with pytest.raises(ParseError, match=r"^v: expected a Debian version"):
            debian_upstream(version, "v")

    @pytest.mark.parametrize(
        ("package", "branch"),
        [
            ("libnvidia-compute-580", "580"),
            ("libnvidia-compute-580:amd64", "580"),
            ("libnvidia-cfg1-580", "580"),
            ("libnvidia-fbc1-580:i386", "580"),
            ("nvidia-firmware-580-580.126.09", "580"),
            ("nvidia-kernel-common-580", "580"),
            ("nvidia-driver-580-open", "580"),
            ("xserver-xorg-video-nvidia-580", "580"),
            ("libnvidia-compute-550-server:amd64", "550-server"),
            ("linux-modules-nvidia-580-open-6.14.0-37-generic", "580"),
            ("linux-modules-nvidia-390-generic-hwe-22.04", "390"),
            ("linux-signatures-nvidia-6.8.0-40-generic", None),
            ("linux-signatures-nvidia-6.8.0-100-generic", None),  # ABI 100 is not a branch
            ("nvidia-settings", None),
            ("nvidia-prime", None),
            ("libnvidia-container1", None),
            ("libnvidia-egl-wayland1", None),
            ("cuda-nvtx-13-1", None),
            ("libnccl2", None),
        ],
    )
    def test_branch(self, package: str, branch: str | None) -> None:
        assert nvidia_branch(package) == branch

    @pytest.mark.parametrize(
        ("package", "version"),
        [
            ("nvidia-firmware-580-580.126.09", "580.126.09"),
            ("nvidia-kernel-common-580-580.126.09", "580.126.09"),
            ("nvidia-firmware-580", None),
            ("linux-modules-nvidia-390-generic-hwe-22.04", None),
            ("linux-modules-nvidia-580-open-6.14.0-37-generic", None),
            ("nsight-compute-2025.4.0", None),
        ],
    )
    def test_embedded_upstream(self, package: str, version: str | None) -> None:
        assert embedded_upstream(package) == version

    def test_library_path(self) -> None:
        assert library_version_from_path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.142\n") == "580.142"
        with pytest.raises(
            ParseError,
            match=r"expected a resolved library path ending in '\.so\.<driver version>', "
            r"found '/lib/libnvidia-ml\.so\.1'",
        ):
            library_version_from_path("/lib/libnvidia-ml.so.1")


# --------------------------------------------------------------------------- entry points for the CLI


class TestEntryPoints:
    def test_parse_file(self, tmp_path) -> None:
        path = tmp_path / "gpus.csv"
        path.write_text(output("2.10"))
        assert parse_file("gpus", path) == [
            {"index": 0, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140},
            {"index": 1, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140},
        ]
        path.write_text(output("2.1").replace(", 12.0", ", 97887"))
        assert (
            parse_file("gpus", path, fields=["name", "driver_version", "memory.total"])[0]["memory_total_mib"]
            == 97887
        )

    def test_error_names_the_file(self, tmp_path) -> None:
        path = tmp_path / "gpus.csv"
        path.write_text("index, name, memory.total [MiB]\n0, NVIDIA RTX A6000\n")
        with pytest.raises(
            ParseError, match=rf"^{path} line 2: expected 3 fields \(index, name, memory\.total\), found 2"
        ):
            parse_file("gpus", path, fields=None)
        with pytest.raises(
            ParseError,
            match=rf"^{tmp_path / 'missing.csv'}: cannot read the file: No such file or directory$",
        ):
            parse_file("gpus", tmp_path / "missing.csv")

    def test_unknown_kind_and_stray_fields(self) -> None:
        with pytest.raises(
            ParseError, match=r"^x: unknown input kind 'gpu'; expected one of gpus, apps, driver, nvml"
        ):
            parse_text("gpu", "", "x")
        with pytest.raises(
            ParseError, match=r"a field list only applies to CSV input \(gpus, apps\), not to driver"
        ):
            parse_text("driver", block("1.1"), "x", fields=["name"])

    @pytest.mark.parametrize(
        ("kind", "text"),
        [
            ("gpus", lambda: h200("query-gpu-header.csv")),
            ("apps", lambda: h200("query-compute-apps.csv")),
            ("driver", lambda: h200("proc-driver-nvidia-version.txt")),
            ("nvml", lambda: block("3.10")),
            ("smi", lambda: h200("nvidia-smi-with-process.txt")),
            ("smi-version", lambda: h200("nvidia-smi-version.txt")),
            ("devices", lambda: misc_part("+ cat /proc/devices")),
            ("gpu-info", lambda: h200(H200_INFORMATION)),
            ("dpkg-list", lambda: output("4.1")),
            ("dpkg-query", lambda: "libnvidia-compute-580\t580.126.09-0ubuntu0.24.04.1\tii \n"),
        ],
    )
    def test_every_kind_gives_json(self, kind: str, text) -> None:
        assert kind in PARSERS
        data = parse_text(kind, text(), "input")
        assert json.loads(json.dumps(data)) == data

    def test_messages_are_one_line(self) -> None:
        with pytest.raises(ParseError) as caught:
            parse_gpus(block("3.10") + "\n", "gpus.csv")
        assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- properties

_GPU_FIELD_VALUES = {
    "index": st.integers(0, 15).map(str),
    "name": st.from_regex(r"NVIDIA [A-Za-z0-9][A-Za-z0-9 .-]{0,28}[A-Za-z0-9]", fullmatch=True),
    "memory.total": st.integers(1024, 200_000).map(str),
    "memory.used": st.integers(0, 200_000).map(str),
    "compute_cap": st.sampled_from(["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]),
    "driver_version": st.from_regex(r"[5-6][0-9]{2}\.[0-9]{1,3}(\.[0-9]{2})?", fullmatch=True),
    "uuid": st.uuids().map(lambda u: f"GPU-{u}"),
    "pci.bus_id": st.from_regex(r"00000000:[0-9A-F]{2}:00\.0", fullmatch=True),
}
_UNITS = {"memory.total": "MiB", "memory.used": "MiB"}
_KEYS = {"memory.total": "memory_total_mib", "memory.used": "memory_used_mib", "pci.bus_id": "pci_bus_id"}
_INTS = {"index", "memory.total", "memory.used"}


@st.composite
def gpu_csv(draw: st.DrawFn) -> tuple[str, list[str], bool, list[dict[str, object]]]:
    """nvidia-smi --query-gpu output for random GPUs: random field order, header or not, units or not."""
    optional = draw(
        st.lists(st.sampled_from(sorted(set(_GPU_FIELD_VALUES) - {"name", "memory.total"})), unique=True)
    )
    fields = draw(st.permutations(["name", "memory.total", *optional]))
    header, units = draw(st.booleans()), draw(st.booleans())
    rows = draw(
        st.lists(st.fixed_dictionaries({f: _GPU_FIELD_VALUES[f] for f in fields}), min_size=1, max_size=8)
    )
    lines = []
    if header:
        lines.append(", ".join(f"{f} [{_UNITS[f]}]" if f in _UNITS else f for f in fields))
    for row in rows:
        lines.append(", ".join(f"{row[f]} {_UNITS[f]}" if units and f in _UNITS else row[f] for f in fields))
    expected = [{_KEYS.get(f, f): int(row[f]) if f in _INTS else row[f] for f in fields} for row in rows]
    return "\n".join(lines) + "\n", list(fields), header, expected


@PROPERTY
@given(gpu_csv())
def test_gpu_csv_round_trip(case: tuple[str, list[str], bool, list[dict[str, object]]]) -> None:
    text, fields, header, expected = case
    parsed = [g.to_dict() for g in parse_gpus(text, "gpus.csv", fields=None if header else fields)]
    assert parsed == [{k: row[k] for k in parsed_row} for row, parsed_row in zip(expected, parsed, strict=True)]
    assert [set(p) for p in parsed] == [set(e) for e in expected]


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.integers(1, 4_194_304),
            st.from_regex(r"[A-Za-z0-9_./-]{1,40}", fullmatch=True),
            st.one_of(st.none(), st.integers(0, 200_000)),
        ),
        max_size=10,
    ),
    st.booleans(),
)
def test_apps_csv_round_trip(apps: list[tuple[int, str, int | None]], units: bool) -> None:
    lines = ["pid, process_name, used_gpu_memory [MiB]"]
    for pid, name, memory in apps:
        shown = "[N/A]" if memory is None else (f"{memory} MiB" if units else str(memory))
        lines.append(f"{pid}, {name}, {shown}")
    parsed = [(a.pid, a.process_name, a.used_memory_mib) for a in parse_apps("\n".join(lines) + "\n")]
    assert parsed == apps


@PROPERTY
@given(
    st.one_of(st.just(""), st.integers(0, 9).map(lambda e: f"{e}:")),
    st.from_regex(r"[0-9][A-Za-z0-9.+~-]{0,20}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9.+~]{1,20}", fullmatch=True),
)
def test_upstream_of_any_debian_version(epoch: str, upstream: str, revision: str) -> None:
    assert debian_upstream(f"{epoch}{upstream}-{revision}") == upstream


@PROPERTY
@given(
    st.sampled_from(
        [
            "libnvidia-compute",
            "libnvidia-cfg1",
            "libnvidia-decode",
            "libnvidia-encode",
            "libnvidia-gl",
            "libnvidia-common",
            "libnvidia-extra",
            "libnvidia-fbc1",
            "nvidia-utils",
            "nvidia-compute-utils",
            "nvidia-kernel-common",
            "nvidia-firmware",
        ]
    ),
    st.sampled_from(["390", "470", "535", "550", "570", "575", "580", "590", "595", "610"]),
    st.booleans(),
    st.from_regex(r"[0-9]{2,3}(\.[0-9]{2})?", fullmatch=True),
    st.sampled_from(["", ":amd64", ":i386"]),
)
def test_branch_of_ubuntu_package_names(base: str, branch: str, server: bool, minor: str, arch: str) -> None:
    series = f"{branch}-server" if server else branch
    assert nvidia_branch(f"{base}-{series}{arch}") == series
    versioned = f"{base}-{series}-{branch}.{minor}"
    assert nvidia_branch(versioned) == series
    assert embedded_upstream(versioned) == f"{branch}.{minor}"


@PROPERTY
@given(
    st.dictionaries(st.from_regex(r"[a-z][a-z0-9_/-]{0,20}", fullmatch=True), st.integers(1, 511), min_size=1)
)
def test_proc_devices_round_trip(majors: dict[str, int]) -> None:
    text = (
        "Character devices:\n"
        + "".join(f"{major:3d} {name}\n" for name, major in majors.items())
        + "\nBlock devices:\n"
    )
    devices = parse_proc_devices(text)
    assert devices.character == majors and devices.block == {}


@PROPERTY
@given(st.integers(0, 0xFFFF), st.integers(0, 255), st.integers(0, 31), st.integers(0, 7), st.integers(0, 255))
def test_gpu_information_bus_round_trip(domain: int, bus: int, device: int, function: int, minor: int) -> None:
    location = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    info = parse_gpu_information(information(**{"Bus Location": location, "Device Minor": str(minor)}))
    assert (info["bus_location"], info["device_minor"]) == (location, minor)
    assert info["pci_bus_id"] == f"{domain:08X}:{bus:02X}:{device:02X}.{function}"
