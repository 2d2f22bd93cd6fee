"""The training job's stop and resume as the dflash_training module runs them: each returns the module's result
(changed, msg lines, diff) and, under check mode, says what it would do and changes nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import gpus, systemd
from .commands import run
from .errors import TrainingError
from .record import describe_line, keep_resumed, read_record, resumed_path, stop_record, write_record
from .resume import resume_argv, transient_unit_name
from .selection import DEFAULT_ENV_KEEP, find
from .stop import StopResult, stop


@dataclass
class StopOptions:
    """How to find the job, stop it, record it, and which GPUs must be free afterwards."""

    host: str
    record_path: Path
    unit: str = ""
    match: list[str] = field(default_factory=list)
    pidfile: str = ""
    protect_match: list[str] = field(default_factory=list)
    protect_units: list[str] = field(default_factory=list)
    env_keep: list[str] = field(default_factory=lambda: list(DEFAULT_ENV_KEEP))
    term_timeout_s: float = 60.0
    kill_timeout_s: float = 15.0
    boot_units: list[str] = field(default_factory=list)
    disable_unit: bool = True
    env_file: str = ""
    resume_command: list[str] = field(default_factory=list)
    gpu_ids: list[int] = field(default_factory=list)
    nvidia_smi: str = "nvidia-smi"
    gpu_free_retries: int = 15
    gpu_free_delay_s: float = 2.0
    # False where nvidia-smi cannot run (a driver/library mismatch): stop the job, check its GPUs later.
    verify_gpus: bool = True


def _stop_lines(opt: StopOptions, found: dict[str, Any], record: dict[str, Any], check_mode: bool) -> list[str]:
    if not found["roots"]:
        return [f"Nothing to stop: no training job found on {opt.host}.", *found["notes"]]
    return [f"{'Would stop' if check_mode else 'Stopping'} the training job ({found['mode']}), GPUs "
            f"{','.join(str(g) for g in record['gpus']) or 'none'}:", *(describe_line(p) for p in record["processes"]),
            f"plus {len(found['descendants'])} child processes; record: {opt.record_path}", *found["notes"]]


def _ended_line(host: str, res: StopResult, term_timeout_s: float) -> str:
    ignored = f" (the job ignored SIGTERM for {term_timeout_s:g} s)" if res.killed else ""
    return (f"{host}: {len(res.terminated)} processes ended on SIGTERM, {len(res.killed)} needed SIGKILL{ignored}, "
            f"{len(res.survivors)} survived, in {res.seconds} s.")


def _stop_processes(opt: StopOptions, found: dict[str, Any]) -> StopResult:
    """SIGTERM, deadline, SIGKILL of the found processes; a survivor of SIGKILL is an error."""
    res = stop({int(p["pid"]): int(p["start_ticks"]) for p in found["roots"]},
               {int(p["pid"]): int(p["start_ticks"]) for p in found["descendants"]},
               opt.term_timeout_s, opt.kill_timeout_s)
    if res.survivors:
        raise TrainingError(f"{opt.host}: expected the training processes to be gone after SIGKILL, found "
                            f"{res.survivors} still running (uninterruptible I/O?). Check `ps -o pid,stat,wchan,args "
                            "-p <pid>`; the GPUs are not free")
    return res


def _stop_unit(unit: str, disable: bool) -> list[str]:
    """systemctl stop (systemd sends SIGTERM, then SIGKILL after the unit's stop timeout) and disable."""
    done = []
    if systemd.show(unit).get("ActiveState") in ("active", "activating", "reloading", "deactivating"):
        systemd.systemctl("stop", "--", unit)
        done.append(f"stopped {unit}")
    if disable and systemd.is_enabled(unit):
        systemd.systemctl("disable", "--", unit)
        done.append(f"disabled {unit}")
    return done


def _gpus_free_line(opt: StopOptions, protected: list[int]) -> str:
    engine = f" (serving engine pids {','.join(str(p) for p in protected)} left alone)" if protected else ""
    gpus_named = f"GPUs {','.join(str(g) for g in opt.gpu_ids)} are" if opt.gpu_ids else "all GPUs are"
    return f"{opt.host}: {gpus_named} free{engine}."


def stop_job(opt: StopOptions, check_mode: bool, now: datetime) -> dict[str, Any]:
    """Find the job, record it, stop it (unit or signals), keep it from starting at boot, and prove the needed
    GPUs are free. A no-op when nothing runs; under check mode only says what it would stop."""
    found = find(opt.unit, opt.match, opt.pidfile, opt.protect_match, opt.protect_units, opt.env_keep)
    before = gpus.read(opt.nvidia_smi) if opt.verify_gpus else gpus.Reading([], [])
    unit = systemd.unit_record(opt.unit) if found["mode"] == "unit" else {}
    record = stop_record(opt.host, found, gpus.gpus_held(before.apps, before.gpus), unit, opt.env_file,
                         opt.resume_command, now.strftime("%Y-%m-%dT%H:%M:%SZ"), opt.boot_units)
    protected = [int(p["pid"]) for p in found["protected"]]
    result: dict[str, Any] = {"found": found, "record": record if found["roots"] else None, "changed": False,
                              "msg": _stop_lines(opt, found, record, check_mode), "boot_units_disabled": [],
                              "unit_actions": [], "stop": None, "backup_file": None}
    if found["roots"]:
        boot = [u for u in opt.boot_units if systemd.is_enabled(u)]
        result.update(changed=True, boot_units_disabled=boot,
                      diff={"before": "".join(f"running: {describe_line(p)}\n" for p in record["processes"])
                            + "".join(f"{u}: enabled\n" for u in boot),
                            "after": f"stopped, recorded in {opt.record_path}\n"
                            + "".join(f"{u}: disabled\n" for u in boot)})
        if not check_mode:
            result["backup_file"] = write_record(opt.record_path, record)
            if found["mode"] == "unit":
                result["unit_actions"] = _stop_unit(opt.unit, opt.disable_unit)
            else:
                res = _stop_processes(opt, found)
                result["stop"] = asdict(res)
                result["msg"].append(_ended_line(opt.host, res, opt.term_timeout_s))
            for u in boot:
                systemd.systemctl("disable", "--", u)
    job = {int(p["pid"]) for p in found["roots"] + found["descendants"]}
    if not opt.verify_gpus:
        result["holders"] = []
        result["msg"].append(f"{opt.host}: nvidia-smi cannot run here; the GPUs are checked once the driver is "
                             "aligned.")
        return result
    if check_mode:
        holders = [h for h in gpus.gpu_holders(before.apps, before.gpus, opt.gpu_ids, protected) if h["pid"] not in job]
    else:
        _, holders = gpus.wait_free(opt.nvidia_smi, opt.gpu_ids, protected, opt.gpu_free_retries,
                                    opt.gpu_free_delay_s)
    result["holders"] = holders
    if holders and not check_mode:
        raise TrainingError(gpus.holders_message(opt.host, holders))
    result["msg"].append(f"Would fail after the stop: {gpus.holders_message(opt.host, holders)}" if holders
                         else _gpus_free_line(opt, protected))
    return result


@dataclass
class ResumeOptions:
    """Where the record is, how to read the GPUs, and whether to start while others hold them."""

    host: str
    record_path: Path
    nvidia_smi: str = "nvidia-smi"
    force: bool = False
    stop_hints: dict[str, str] = field(default_factory=dict)


def _start(record: dict[str, Any], now: datetime) -> tuple[list[list[str]], str]:
    """The commands that start the job again and the unit it then runs in."""
    unit = record.get("unit")
    if unit:
        return [["systemctl", "start", "--", unit["name"]]] + (
            [["systemctl", "enable", "--", unit["name"]]] if unit.get("enabled") else []), unit["name"]
    name = transient_unit_name(now)
    return [resume_argv(record["resume"], name)], name


def resume_job(opt: ResumeOptions, check_mode: bool, now: datetime) -> dict[str, Any]:
    """Start the stopped job again from its record, unless others hold its GPUs; re-enable its boot units; keep the
    record as resumed. Without a record (nothing stopped, or resumed already) a no-op."""
    record = read_record(opt.record_path)
    if record is None:
        return {"changed": False, "record": None, "msg": [f"{opt.host}: no record at {opt.record_path}; nothing was "
                                                          "stopped, nothing to resume."]}
    reading = gpus.read(opt.nvidia_smi)
    holders = gpus.gpu_holders(reading.apps, reading.gpus, record["gpus"])
    if holders and not opt.force:
        raise TrainingError(gpus.resume_refusal(opt.host, record["gpus"],
                                                gpus.holders_by_owner(holders, gpus.unit_of_pid), opt.stop_hints))
    commands, unit = _start(record, now)
    boot = [u for u in record.get("boot_units") or [] if not systemd.is_enabled(u)]
    kept = resumed_path(opt.record_path, now)
    result = {"changed": True, "record": record, "commands": commands, "unit": unit, "boot_units_enabled": boot,
              "kept_record": str(kept), "holders": holders,
              "msg": [f"{opt.host}: {'would start' if check_mode else 'started'} the training job in {unit}"
                      f" ({' '.join(record['resume']['command']) if not record.get('unit') else 'its unit'}); "
                      f"record kept as {kept}."],
              "diff": {"before": f"stopped, recorded in {opt.record_path}\n"
                                 + "".join(f"{u}: disabled\n" for u in boot),
                       "after": f"running in {unit}\n" + "".join(f"{u}: enabled\n" for u in boot)}}
    if not check_mode:
        for argv in commands:
            out = run(argv)
            if out.rc != 0:
                raise TrainingError(f"{opt.host}: expected {out.describe()} to start the job; the record stays at "
                                    f"{opt.record_path}. Check `journalctl -u {unit}` and run again")
        for u in boot:
            systemd.systemctl("enable", "--", u)
        keep_resumed(opt.record_path, kept)
    return result
