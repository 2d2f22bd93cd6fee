"""Deploy-time checks and records of the serving engine: what the INSTALLED engine accepts, whether the
driver can run its CUDA build, where the readiness gates knock, and the deployment record.

The sglang_engine and sglang_service roles call these through filter_plugins/serving.py; templates and
tasks only render what comes back.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dflash_infra import engine
from dflash_infra.parsers import engine_log

# Oldest kernel module major that runs a CUDA major's user-space runtime (NVIDIA's CUDA release notes,
# "minimum required driver version": CUDA 13 wheels need >= 580).
MIN_DRIVER_FOR_CUDA: dict[int, int] = {11: 450, 12: 525, 13: 580}

# An option's invocation line in argparse's help: two spaces, then the option strings ("-h, --help",
# "--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE"), then (after two spaces) maybe the description.
_HELP_OPTION_LINE = re.compile(r"^ {2}(-[^ ].*)$")
_LONG_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][\w-]*)")


class ServingError(ValueError):
    """Input the serving checks cannot interpret; the message says what was expected and found."""


def flags_from_help(text: str) -> list[str]:
    """Every long option an argparse --help lists in its option sections (suppressed ones are absent).

    Only invocation lines count (indented two spaces, before the description column), so a flag that a
    description merely mentions is never taken for an accepted one.
    """
    flags: list[str] = []
    seen: set[str] = set()
    in_usage = True
    for line in text.splitlines():
        if in_usage:
            if line and not line.startswith(" ") and not line.startswith("usage:"):
                in_usage = False
            else:
                continue
        match = _HELP_OPTION_LINE.match(line)
        if not match:
            continue
        invocation = re.split(r" {2,}", match.group(1), maxsplit=1)[0]
        for flag in _LONG_FLAG.findall(invocation):
            if flag not in seen:
                seen.add(flag)
                flags.append(flag)
    if "--help" not in seen:
        raise ServingError("engine --help: expected argparse help listing --help and the engine's options, "
                           f"found {len(flags)} options and no --help; run the engine with --help by hand")
    return flags


def argv_flags(argv: Iterable[str]) -> list[str]:
    """The long options of an argv (the planner's), without their values; `--flag=value` counts as --flag."""
    return [a.split("=", 1)[0] for a in argv if str(a).startswith("--")]


def missing_flags(argv: Iterable[str], accepted: Iterable[str]) -> list[str]:
    """Flags of argv the installed engine does not accept (argparse prefix matching is not relied on)."""
    table = engine.FlagTable.from_options("installed", accepted)
    return [f for f in argv_flags(argv) if not table.accepts(f)]


def capability_problems(argv: Iterable[str], accepted: Iterable[str], name: str, version: str) -> list[str]:
    """One sentence per planner flag the installed engine rejects, naming the flag and the installed version."""
    return [f"the plan's argv uses {flag}, which the installed {name} {version} does not accept (not in its "
            f"--help); install an engine that has it or re-plan for {version} (dflash_engine.version)"
            for flag in missing_flags(argv, accepted)]


def _major(version: str, what: str) -> int:
    match = re.match(r"\s*(\d+)", str(version or ""))
    if not match:
        raise ServingError(f"{what}: expected a version such as 580.126.09 or 13.0, found {version!r}")
    return int(match.group(1))


def driver_problems(kernel_module: str | None, cuda_version: str | None) -> list[str]:
    """Why this kernel module cannot run the engine's CUDA build (empty when it can)."""
    if not cuda_version:
        return []
    if not kernel_module:
        return [f"no NVIDIA kernel module version was found on the host; the engine's CUDA {cuda_version} build "
                f"needs one >= {MIN_DRIVER_FOR_CUDA.get(_major(cuda_version, 'CUDA version'), '?')}"]
    cuda = _major(cuda_version, "CUDA version")
    driver = _major(kernel_module, "kernel module version")
    need = MIN_DRIVER_FOR_CUDA.get(cuda)
    if need is None:
        return [f"CUDA {cuda_version}: no known minimum driver (known: "
                f"{', '.join(f'CUDA {c} >= {d}' for c, d in sorted(MIN_DRIVER_FOR_CUDA.items()))}); add it to "
                "MIN_DRIVER_FOR_CUDA in dflash_infra/serving.py"]
    if driver < need:
        return [f"the engine's CUDA {cuda_version} build needs an NVIDIA kernel module >= {need}, the host runs "
                f"{kernel_module}; upgrade the Proxmox node's driver or pin an engine built for an older CUDA"]
    return []


def driver_ready_problems(driver_state: Mapping[str, Any] | None) -> list[str]:
    """Why the engine cannot be served on this driver yet: the user space must equal the kernel module, or be
    provided by a container runtime (not package managed)."""
    state = driver_state or {}
    if state.get("status") in ("aligned", "not_package_managed"):
        return []
    return [f"the NVIDIA user space is not ready to serve ({state.get('status') or 'not probed'}: "
            f"{state.get('reason') or 'no driver summary'}); align it first (playbooks/align_driver.yml, or the whole "
            "deploy_dflash.yml, which aligns before it serves)"]


def probe_host(listen: str) -> str:
    """Where the gates on the host itself reach the engine: its own address, or loopback for a wildcard."""
    listen = str(listen or "").strip()
    if listen in ("", "0.0.0.0", "::", "[::]", "*"):
        return "127.0.0.1"
    return f"[{listen}]" if ":" in listen and not listen.startswith("[") else listen


UNIT_DIR = "/etc/systemd/system"
HELPERS = ("sglang-launch", "sglang-ready", "verify-unit")


def service_paths(name: str, env_dir: str, state_dir: str, libexec_dir: str) -> dict[str, Any]:
    """Every path of one engine service on the host, derived once: the unit, its secrets file, the record,
    the unit snapshots and last-good pointer, and the helpers (launcher, readiness probe, unit validator;
    `helpers`: their names, as the role's files/ holds them)."""
    if not re.fullmatch(r"[A-Za-z0-9@_.:-]+\.service", str(name)):
        raise ServingError(f"service name: expected a systemd unit name ending in .service, found {name!r}")
    stem = str(name)[: -len(".service")]
    return {"unit": f"{UNIT_DIR}/{name}", "env_file": f"{env_dir}/{stem}.env", "env_dir": env_dir,
            **{f"tls_{part}": path for part, path in engine_tls_paths(f"{env_dir}/{stem}.env").items()},
            "stem": stem, "state_dir": state_dir, "record": f"{state_dir}/deployment.json",
            "units_dir": f"{state_dir}/units", "last_good": f"{state_dir}/units/last-good",
            "libexec_dir": libexec_dir, "helpers": list(HELPERS),
            **{h.replace("-", "_"): f"{libexec_dir}/{h}" for h in HELPERS}}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def engine_status(state: Mapping[str, Any], venv: str, name: str, version: str) -> dict[str, Any]:
    """Whether the engine must be installed, and the capabilities the engine role cached for the installed
    release (None when the cache is missing or for another release), from host_state's venvs section."""
    seen = (state.get("venvs") or {}).get(venv) or {}
    installed = (seen.get("distributions") or {}).get(_canonical(name)) if seen.get("python") else None
    cache = seen.get("capabilities") or {}
    caps = cache.get("json") if cache.get("exists") else None
    valid = isinstance(caps, Mapping) and caps.get("name") == name and caps.get("version") == installed
    if installed is None:
        reason = f"{name} is not installed in {venv}" if seen.get("python") else f"{venv} has no Python"
    elif installed != version:
        reason = f"{venv} holds {name} {installed}, the pin is {version}"
    else:
        reason = f"{name} {version} is installed in {venv}"
    return {"installed_version": installed, "needs_install": installed != version, "reason": reason,
            "capabilities": dict(caps) if valid and isinstance(caps, Mapping) else None}


def engine_problems(state: Mapping[str, Any], installed: Mapping[str, Any], argv: Iterable[str],
                    check_mode: bool = False) -> list[str]:
    """Everything that keeps the installed engine from serving the plan here: a driver that is not ready (not
    judged under check mode, where an alignment would have happened first), a kernel module too old for its
    CUDA build, and the plan's flags it does not accept (once it has been asked)."""
    problems = [] if check_mode else driver_ready_problems(state.get("driver"))
    problems += driver_problems((state.get("kernel_module") or {}).get("version") or "", installed.get("cuda"))
    if installed.get("probed"):
        problems += capability_problems(argv, installed.get("flags") or [], str(installed.get("name")),
                                        str(installed.get("version")))
    return problems


SERVICE_DIRS = (("libexec_dir", "0755"), ("state_dir", "0755"), ("units_dir", "0700"), ("env_dir", "0700"))


def service_todo(state: Mapping[str, Any], paths: Mapping[str, str], unit: str, account: Mapping[str, str],
                 helper_sha256: Mapping[str, str], done: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the service role must do besides the unit and its secrets, from host_state: create the group or the
    account (user, group, home; shell nologin), the folders (mode, root-owned), install helpers whose content
    differs, enable the unit at boot, start it; `launcher`: the launcher on the host is not this one, so the running
    engine restarts (its ExecStart runs it; the other helpers are not part of the running engine). `any` says
    whether anything at all is to be done. `done` (`service_done`) is what an earlier turn of the role in the same
    run already made: behind the gateway the role takes one turn per replica, and the account, the shared folders
    and the helpers are made once (each replica still restarts for a new launcher)."""
    from dflash_infra import host_state  # the state's readers; imported here to keep serving free of a cycle

    done = done or {}
    accounts = state.get("accounts") or {}
    group = (accounts.get("groups") or {}).get(account["group"])
    user = (accounts.get("users") or {}).get(account["user"])
    props = (state.get("units") or {}).get(unit) or {}
    todo: dict[str, Any] = {
        "group": group is None and not done.get("group"),
        "user": (user is None or user.get("home") != account["home"] or user.get("shell") != "/usr/sbin/nologin"
                 or group is None or user.get("gid") != group.get("gid")) and not done.get("user"),
        "dirs": [{"path": paths[key], "mode": mode} for key, mode in SERVICE_DIRS
                 if not host_state.dir_matches(state, paths[key], mode, "root", "root")
                 and paths[key] not in (done.get("dirs") or [])],
        "helpers": [name for name, sha in helper_sha256.items() if not host_state.file_matches(
            state, f"{paths['libexec_dir']}/{name}", sha, "0755", "root", "root")
            and f"{paths['libexec_dir']}/{name}" not in (done.get("helpers") or [])],
        "launcher": not host_state.file_matches(state, f"{paths['libexec_dir']}/{HELPERS[0]}",
                                                helper_sha256.get(HELPERS[0], ""), "0755", "root", "root"),
        "enable": props.get("UnitFileState") != "enabled",
        "start": props.get("ActiveState") != "active",
    }
    todo["any"] = any(bool(v) for v in todo.values())
    return todo


def service_done(done: Mapping[str, Any] | None, todo: Mapping[str, Any], paths: Mapping[str, str]) -> dict[str, Any]:
    """`done` with what a turn that carried out `todo` made (its account, folders and helpers by path), for the
    next turn's `service_todo`."""
    done = done or {}
    return {"group": bool(done.get("group") or todo.get("group")), "user": bool(done.get("user") or todo.get("user")),
            "dirs": [*(done.get("dirs") or []), *(d["path"] for d in todo.get("dirs") or [])],
            "helpers": [*(done.get("helpers") or []),
                        *(f"{paths['libexec_dir']}/{name}" for name in todo.get("helpers") or [])]}


def serves_as_recorded(state: Mapping[str, Any], record: Mapping[str, Any] | None, unit: str, url: str) -> bool:
    """Whether the engine that runs now is the very process that passed the gates: the unit's InvocationID is the
    one in the deployment record, and its /health answered 200 when host_state read it (`url`: the engine's base
    URL). Such an engine is not gated again."""
    return not not_as_recorded(state, record, unit, url)


def not_as_recorded(state: Mapping[str, Any], record: Mapping[str, Any] | None, unit: str, url: str) -> str:
    """Why the engine that runs now is not the one the record names ('' when it is), said where a run gates an
    engine it did not restart: after an automatic rollback, the engine the rollback started is a process no record
    names, so the next run gates and records it (a change nobody asked for, unless said)."""
    invocation = (((record or {}).get("gates") or {}).get("unit") or {}).get("InvocationID") or ""
    running = ((state.get("units") or {}).get(unit) or {}).get("InvocationID") or ""
    health = ((state.get("health") or {}).get(f"{url}/health") or {}).get("status")
    if not invocation:
        return "no deployment record names the running engine"
    if invocation != running:
        return (f"the running engine is invocation {running[:12] or 'none'}, the record names {invocation[:12]} (a "
                "rollback or systemd started it since)")
    if health != 200:
        return f"its /health answered {health or 'nothing'} when the host was read"
    return ""


def service_converged(state: Mapping[str, Any], paths: Mapping[str, str], unit: str, account: Mapping[str, str],
                      helper_sha256: Mapping[str, str], unit_sha256: str, url: str, tls: bool = False) -> bool:
    """Whether a turn of the service role would do nothing at all: no account, folder, helper, boot or start to
    make (`service_todo`), the unit and its secrets file as the role renders them, and the engine serving as
    recorded (`serves_as_recorded`, with the record naming this unit's content). Behind the gateway such a replica
    takes no turn of the rollout; any doubt (a file host_state did not read, a record of another unit) means a full
    turn, which decides the same thing task by task."""
    from dflash_infra import host_state  # as in service_todo

    if service_todo(state, paths, unit, account, helper_sha256)["any"]:
        return False
    if not (host_state.file_matches(state, paths["unit"], unit_sha256, "0644", "root", "root")
            and host_state.secret_matches(state, paths["env_file"], "0600", "root", "root")
            and engine_tls_todo(state, paths, tls) != "write"):  # files left over: the serve stage's, after its gates
        return False
    record = host_state.path_entry(state, paths["record"]).get("json") or {}
    return record.get("unit_sha256") == unit_sha256 and serves_as_recorded(state, record, unit, url)


def base_url(serve: Mapping[str, Any]) -> str:
    """http(s)://<where the host reaches it>:<port> of an endpoint listening as `serve` says ({host, port, tls?})."""
    scheme = "https" if serve.get("tls") is True else "http"
    return f"{scheme}://{probe_host(str(serve.get('host') or ''))}:{int(serve['port'])}"


def unit_argv(python: str, launcher: str, module: str, argv: Iterable[str]) -> list[list[str]]:
    """ExecStart as lines of words: interpreter + launcher + module, then one flag (with its values) per line."""
    return command_lines([python, launcher, module], argv)


def command_lines(head: Iterable[str], argv: Iterable[str]) -> list[list[str]]:
    """A command as lines of words: `head` on the first, then one flag (with its values) per line."""
    lines: list[list[str]] = [[str(w) for w in head]]
    for word in argv:
        word = str(word)
        if word.startswith("--") or not lines[1:]:
            lines.append([word])
        else:
            lines[-1].append(word)
    return lines


_SYSTEMD_SPECIAL = re.compile(r"""[\s"'\\$%;]""")


def systemd_quote(word: str) -> str:
    """One ExecStart word, quoted for systemd: specifiers (%) and variables ($) are escaped, never expanded."""
    word = str(word)
    escaped = word.replace("%", "%%").replace("$", "$$")
    if word and not _SYSTEMD_SPECIAL.search(word):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def exec_start_lines(python: str, launcher: str, module: str, argv: Iterable[str]) -> list[str]:
    """The ExecStart value, one quoted line per flag (the template joins them with ` \\` continuations)."""
    return quoted_lines(unit_argv(python, launcher, module, argv))


def quoted_lines(lines: Iterable[Iterable[str]]) -> list[str]:
    """Lines of words quoted for systemd, one ExecStart line each."""
    return [" ".join(systemd_quote(w) for w in words) for words in lines]


def gateway_exec_start_lines(python: str, launcher: str, argv: Iterable[str]) -> list[str]:
    """The gateway's ExecStart: the venv's Python runs the launcher with smg's arguments, one flag per line."""
    return quoted_lines(command_lines([python, launcher], argv))


GATEWAY_HELPERS = ("smg-launch", "smg-ctl")
# The endpoint's TLS files in the gateway's credentials folder (systemd credentials tls-cert, tls-key, tls-ca):
# dflash_endpoint_tls's certificate, key and the team's CA.
TLS_PARTS = ("cert", "key", "ca")
_TLS_TEXT = {"cert": "certificate", "key": "key", "ca": "ca"}


def gateway_paths(name: str, secrets_dir: str, libexec_dir: str) -> dict[str, Any]:
    """Every path of the gateway's service on the host: the unit, its credentials folder (the two key files,
    root only) and its helpers (the launcher, the control-plane client; `helpers`: their names)."""
    if not re.fullmatch(r"[A-Za-z0-9@_.:-]+\.service", str(name)):
        raise ServingError(f"gateway service name: expected a systemd unit name ending in .service, found {name!r}")
    stem = str(name)[: -len(".service")]
    credentials = f"{secrets_dir}/{stem}"
    return {"unit": f"{UNIT_DIR}/{name}", "stem": stem, "credentials": credentials,
            "api_key": f"{credentials}/api-key", "control_plane_key": f"{credentials}/control-plane-key",
            **{f"tls_{part}": f"{credentials}/tls-{part}" for part in TLS_PARTS},
            "libexec_dir": libexec_dir, "helpers": list(GATEWAY_HELPERS),
            "launcher": f"{libexec_dir}/{GATEWAY_HELPERS[0]}", "ctl": f"{libexec_dir}/{GATEWAY_HELPERS[1]}"}


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Environment the deploy owns, refused in every environment input a team sets (sglang_service_extra_environment, a
# canary's candidate): the engine's and the gateway's keys and credentials, the GPUs the plan gives a replica, the
# gateway's drain setting from the plan, and what changes which code the interpreter or the loader runs.
RESERVED_ENVIRONMENT = ("SGLANG_API_KEY", "SGLANG_ADMIN_API_KEY", "CREDENTIALS_DIRECTORY", "CUDA_VISIBLE_DEVICES",
                        "SMG_DRAIN_SETTLE_SECS")
RESERVED_ENVIRONMENT_PREFIXES = ("LD_", "PYTHON")


def environment_problems(env: Any, where: str) -> list[str]:
    """Why an environment input (`where` names it) cannot be used: not a mapping, a name that is not a variable
    name or that the deploy owns, a value that is not one line of text. Empty when it can."""
    if env is None:
        return []
    if not isinstance(env, Mapping):
        return [f"{where}: expected a mapping of variable -> value, found {type(env).__name__}"]
    problems = []
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            problems.append(f"{where}: expected a variable name such as NCCL_DEBUG, found {name!r}")
        elif name in RESERVED_ENVIRONMENT or name.startswith(RESERVED_ENVIRONMENT_PREFIXES):
            problems.append(f"{where}.{name}: the deploy owns this variable (keys and credentials come from the "
                            "vault, the GPUs from the plan; LD_* and PYTHON* change the code that runs); remove it")
        elif not isinstance(value, str | int | float) or isinstance(value, bool) or _CONTROL.search(str(value)):
            problems.append(f"{where}.{name}: expected one line of text (a string or a number), found {value!r}")
    return problems


def environment_inputs_problems(inputs: Mapping[str, Any]) -> list[str]:
    """environment_problems of each input, by the name it is set under ({"sglang_service_extra_environment": {...}})."""
    return [problem for where, env in inputs.items() for problem in environment_problems(env, where)]


def systemd_text(value: Any) -> str:
    """Text for a unit line where systemd expands specifiers (Description=): `%` doubled; one line only."""
    text = str(value)
    if _CONTROL.search(text):
        raise ServingError(f"unit text: expected one line without control characters, found {text!r}")
    return text.replace("%", "%%")


def systemd_environment(env: Mapping[str, Any]) -> list[str]:
    """Environment= words ("NAME=value", quoted for systemd) in a stable order; bad names are refused.
    systemd.exec(5): specifiers (%) are expanded there, variables ($) are not, so only `%` is doubled; quotes and
    backslashes are escaped inside the quoted word."""
    words = []
    for name in sorted(env):
        if not _ENV_NAME.match(str(name)):
            raise ServingError(f"environment: expected a variable name such as NCCL_DEBUG, found {name!r}")
        value = "" if env[name] is None else str(env[name])
        if _CONTROL.search(value):
            raise ServingError(f"environment {name}: expected a one-line value, found a control character")
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        words.append(f'"{name}={escaped}"')
    return words


def record(*, plan: Mapping[str, Any], engine_info: Mapping[str, Any], models: Mapping[str, Any],
           driver: Mapping[str, Any], unit: Mapping[str, Any], deployed_at: str, journal: str,
           previous: Mapping[str, Any] | None, gates: Mapping[str, Any] | None = None,
           tolerance: float = engine_log.DEFAULT_TOLERANCE, load: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The deployment record (its contract: docs/architecture.md) with the engine's measured memory next to the plan.

    `previous` keeps the record this one replaces, without its own `previous`, so the file stays bounded; `load` the
    load gate's inputs and figures per concurrency (dflash_infra.loadgate.verdict), None when it did not run.
    """
    previous_record = {k: v for k, v in (previous or {}).items() if k != "previous"} or None
    return {
        "schema": 1,
        "engine": {"name": engine_info.get("name"), "version": engine_info.get("version"),
                   "venv": engine_info.get("venv"), "lock": dict(engine_info.get("lock") or {}) or None,
                   "packages": dict(engine_info.get("packages") or {})},
        "plan": dict(plan),
        "args": list(plan.get("args") or []),
        "models": {role: {"path": (m or {}).get("path"), "manifest_sha256": (m or {}).get("manifest_sha256")}
                   for role, m in models.items()},
        "driver": {"kernel_module": driver.get("kernel_module"), "user_space": driver.get("user_space")},
        "service": unit.get("name"),
        "unit_sha256": unit.get("sha256"),
        "unit_backup": unit.get("backup"),
        "gpu_ids": list(plan.get("gpu_ids") or []),
        "engine_memory": engine_log.measure(journal, plan, tolerance),
        "gates": dict(gates or {}),
        "load": dict(load) if load else None,
        "deployed_at": deployed_at,
        "previous": previous_record,
    }


def snapshot_unit_problem(stat: Mapping[str, Any], sha256: str | None) -> str:
    """Why a unit snapshot cannot be put back ('' when it can), from Ansible's stat of it (checksum_algorithm
    sha256): it must be a regular file, and hold the unit its record names (`unit_sha256`; not compared for a record
    without one). Said after "found"."""
    if not stat.get("exists"):
        return "no such file"
    if not stat.get("isreg"):
        return "something that is not a file"
    found = str(stat.get("checksum") or "")
    if sha256 and found != sha256:
        return (f"a unit with sha256 {found[:16]}, where the record names {str(sha256)[:16]} (it changed after the "
                "snapshot was taken)")
    return ""


def rolled_back_record(current: Mapping[str, Any], rolled_back_at: str) -> dict[str, Any]:
    """The record after an on-demand rollback: the previous deployment made current again, with the time of the
    rollback, and the replaced record (without its own `previous`) kept under `previous`."""
    previous = current.get("previous")
    if not isinstance(previous, Mapping) or not previous.get("unit_backup"):
        raise ServingError("rollback: expected the deployment record to name a previous deployment with a unit "
                           f"snapshot (previous.unit_backup), found {previous!r}")
    replaced = {k: v for k, v in current.items() if k != "previous"}
    return {**previous, "rolled_back_at": rolled_back_at, "previous": replaced}


def comparison_line(row: Mapping[str, Any]) -> str:
    """One planned-vs-measured row for people: 'kv_cache_tokens: planned 626530, engine 601234 (-4.0%)'."""
    diff = row.get("difference")
    pct = f"{diff:+.1%}" if diff is not None else "n/a"
    flag = "" if row.get("within_tolerance") else "  <-- outside tolerance"
    return f"{row['figure']}: planned {row['planned']:g}, engine {row['measured']:g} ({pct}){flag}"


# API keys: what they may hold (they go into an environment file and a systemd credential) and how long they must be
# at least, so that nothing derived from one (a log line, a guess against a service) makes it guessable.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]*")
MIN_KEY_LENGTH = 32


def key_problems(value: Any, name: str) -> list[str]:
    """Why an API key input cannot be used (empty: it can, or it is empty, which means no key). Written once: the
    preflight, the engine's and the gateway's roles all ask here."""
    key = "" if value is None else str(value)
    if not key:
        return []
    if not KEY_PATTERN.fullmatch(key):
        return [f"{name}: expected letters, digits and ._~+/=- only (it goes into an environment file), found "
                f"other characters ({len(key)} characters; the key itself is not shown)"]
    if len(key) < MIN_KEY_LENGTH:
        return [f"{name}: expected at least {MIN_KEY_LENGTH} characters, found {len(key)}; make one with "
                "`openssl rand -base64 33` and put it in ansible-vault"]
    return []


def keys_problems(keys: Mapping[str, Any]) -> list[str]:
    """key_problems of each key input, by the name it is set under."""
    return [problem for name, value in keys.items() for problem in key_problems(value, name)]


def engine_env_text(api_key: str, admin_key: str = "") -> str:
    """The engine's environment file, byte for byte: what the role writes and what host_state compares on the host
    (one function for both sides)."""
    lines = ["# Managed by dflash-infra (roles/sglang_service). Secrets of the engine: read by systemd (root), handed",
             "# to the engine by its launcher, never on its command line."]
    lines += [f"SGLANG_API_KEY={api_key}"] if api_key else []
    lines += [f"SGLANG_ADMIN_API_KEY={admin_key}"] if admin_key else []
    return "\n".join(lines) + "\n"


def key_file_text(key: str) -> str:
    """A gateway key file (a systemd credential), byte for byte: the key and a newline; empty without a key. The
    endpoint's key file exists with a key or without one (the gateway's unit loads it either way), so adding or
    removing the key changes the file alone, and a unit put back by a restore keeps this run's key in force."""
    return f"{key}\n" if key else ""


def secret_files(env_files: Sequence[str], api_key: str, admin_key: str, gateway: Mapping[str, str],
                 control_key: str, tls: Mapping[str, Any] | None = None,
                 worker_tls: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
    """{path, content} of every secret file the deploy would write: what host_state compares on the host (its
    `secrets` option, never logged) instead of hashing key material into its output. The endpoint's TLS
    certificate and CA are public and read as plain files (tls_files)."""
    out = [{"path": str(path), "content": engine_env_text(api_key, admin_key)} for path in env_files]
    out.append({"path": gateway["api_key"], "content": key_file_text(api_key)})
    if control_key:
        out.append({"path": gateway["control_plane_key"], "content": key_file_text(control_key)})
    if tls_enabled(tls):
        out.append({"path": gateway["tls_key"], "content": tls_text(tls, "key")})
    if tls_enabled(worker_tls):  # the replicas another host's gateway reaches over TLS: certificate and key each
        out += [{"path": engine_tls_paths(str(path))[part], "content": tls_text(worker_tls, part)}
                for path in env_files for part in ("cert", "key")]
    return out


def tls_enabled(tls: Mapping[str, Any] | None) -> bool:
    return isinstance(tls, Mapping) and tls.get("enabled") is True


def tls_text(tls: Mapping[str, Any] | None, part: str) -> str:
    """The text of one TLS file as the roles write it (PEM, ending in one newline)."""
    text = str((tls or {}).get(_TLS_TEXT[part]) or "")
    return text.rstrip("\n") + "\n" if text else ""


def gateway_tls_parts(tls: Mapping[str, Any] | None) -> list[str]:
    """The gateway's TLS credentials a setting asks for: the listener's certificate and key when TLS is on, the
    team's CA whenever one is given (smg verifies HTTPS workers, other hosts' replicas, against it)."""
    parts = ["cert", "key"] if tls_enabled(tls) else []
    return parts + (["ca"] if tls_text(tls, "ca") else [])


def engine_tls_todo(state: Mapping[str, Any], paths: Mapping[str, str], tls: bool) -> str:
    """The engine's TLS files against its replica's plan: 'write' when it serves HTTPS and they do not hold what the
    deploy would write (compared on the host), 'remove' when it does not and they are left, else ''."""
    from dflash_infra import host_state

    if tls:
        ok = all(host_state.secret_matches(state, paths[f"tls_{part}"], "0600", "root", "root")
                 for part in ("cert", "key"))
        return "" if ok else "write"
    left = any(host_state.path_entry(state, paths[f"tls_{part}"]).get("exists") for part in ("cert", "key"))
    return "remove" if left else ""


def engine_tls_problem(state: Mapping[str, Any], paths: Mapping[str, str], tls: Any) -> str:
    """Why an engine unit cannot be put back for its TLS files ('' when it can): a unit that serves HTTPS (`tls`, its
    record's plan.serve.tls) loads the certificate and key as credentials, which must still be on the host; they are
    removed once a deployment without HTTPS passed its gates. Said after "expected the TLS certificate and key that
    <the unit> loads, found"."""
    from dflash_infra import host_state

    if tls is not True:
        return ""
    gone = [paths[f"tls_{part}"] for part in ("cert", "key")
            if not host_state.path_entry(state, paths[f"tls_{part}"]).get("exists")]
    return (f"{', '.join(gone)} gone (removed when a deployment without HTTPS passed its gates; to serve HTTPS "
            "again, deploy with dflash_worker_tls enabled)") if gone else ""


def engine_tls_paths(env_file: str) -> dict[str, str]:
    """Where a replica's certificate and key live beside its environment file (root 0600, credentials of its unit)."""
    stem = str(env_file)[: -len(".env")] if str(env_file).endswith(".env") else str(env_file)
    return {"cert": f"{stem}.tls-cert", "key": f"{stem}.tls-key"}


def gateway_todo(state: Mapping[str, Any], paths: Mapping[str, str], unit: str, unit_sha256: str,
                 api_key: str, control_key: str, helper_sha256: Mapping[str, str],
                 tls: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the gateway role must do, from host_state: the folders (root-owned; credentials 0700), the helpers
    whose content differs, the key files (no api_key: the endpoint has none, a file left from before is removed;
    no control_key: one is made on the host when none is there), the unit, enable, start; and whether the running
    gateway must restart (its unit, launcher or a key changed). `any`: anything at all. The key files are compared
    on the host (host_state's secrets); they leave this function only as booleans."""
    from dflash_infra import host_state

    def matches(path: str, sha: str, mode: str) -> bool:
        return host_state.file_matches(state, path, sha, mode, "root", "root")

    def holds(path: str) -> bool:  # a key file: compared on the host (secret_files), never by hash
        return host_state.secret_matches(state, path, "0600", "root", "root")

    props = (state.get("units") or {}).get(unit) or {}
    control_file = host_state.path_entry(state, paths["control_plane_key"])
    todo: dict[str, Any] = {
        "dirs": [{"path": paths[key], "mode": mode} for key, mode in (("credentials", "0700"), ("libexec_dir", "0755"))
                 if not host_state.dir_matches(state, paths[key], mode, "root", "root")],
        "helpers": [name for name, sha in helper_sha256.items()
                    if not matches(f"{paths['libexec_dir']}/{name}", sha, "0755")],
        "api_key": not holds(paths["api_key"]),  # written with the key, or empty without one (key_file_text)
        "control_key": ("write" if control_key and not holds(paths["control_plane_key"])
                        else "make" if not control_key and not control_file.get("exists") else ""),
        "tls": _tls_todo(state, paths, tls, holds),
        "unit": not matches(paths["unit"], unit_sha256, "0644"),
        "enable": props.get("UnitFileState") != "enabled",
        "start": props.get("ActiveState") != "active",
    }
    # TLS files left over ('remove') need no restart: the running unit does not load them (smg_gateway tidy.yml
    # removes them once every gate of the run passed).
    todo["restart"] = not todo["start"] and bool(
        todo["unit"] or GATEWAY_HELPERS[0] in todo["helpers"] or todo["api_key"]
        or todo["control_key"] or todo["tls"] == "write")
    todo["any"] = any(bool(v) for v in todo.values())
    return todo


def _tls_todo(state: Mapping[str, Any], paths: Mapping[str, str], tls: Mapping[str, Any] | None,
              holds: Any) -> str:
    """'write' when a TLS file the setting asks for differs (the certificate and CA by their sha256, public; the key
    on the host) or one it does not ask for is left ('remove' when only that), else ''."""
    from dflash_infra import host_state

    wanted = gateway_tls_parts(tls)

    def same(part: str) -> bool:
        if part == "key":
            return bool(holds(paths["tls_key"]))
        return host_state.file_matches(state, paths[f"tls_{part}"],
                                       hashlib.sha256(tls_text(tls, part).encode()).hexdigest(), "0600", "root", "root")

    left = [p for p in TLS_PARTS if p not in wanted and host_state.path_entry(state, paths[f"tls_{p}"]).get("exists")]
    if not all(same(part) for part in wanted):
        return "write"
    return "remove" if left else ""


def gateway_restore_url(recorded: Mapping[str, Any] | None, section: Mapping[str, Any],
                        tls: Mapping[str, Any] | None) -> str:
    """Where the gateway's previous unit serves once put back (smg_gateway restore.yml gates it there): its record's
    endpoint and scheme, since the run that failed may have moved the port or turned TLS on or off. A record from
    before `tls` was recorded, or none, gives the plan's endpoint with the settings' scheme."""
    if isinstance(recorded, Mapping) and ":" in str(recorded.get("endpoint") or ""):
        host, _, port = str(recorded["endpoint"]).rpartition(":")
        return base_url({"host": host, "port": int(port), "tls": recorded.get("tls", tls_enabled(tls)) is True})
    return base_url({"host": section.get("host"), "port": section["port"], "tls": tls_enabled(tls)})


def gateway_restore_workers(recorded: Mapping[str, Any] | None, section: Mapping[str, Any]) -> list[str]:
    """The workers the gateway's previous unit is gated for once put back (smg_gateway restore.yml): those of its
    record that the plan still has at the same URL. A worker this run moved (a replica on another host that turned TLS
    on or off, or changed port) serves at its new URL until its own rollback, which follows the gateway's; one it
    retired is stopped. Waiting for either would fail a gateway that is up. No record: the plan's workers."""
    planned = [str(w) for w in section.get("workers") or []]
    if not isinstance(recorded, Mapping) or not isinstance(recorded.get("workers"), list):
        return planned
    return [str(w) for w in recorded["workers"] if str(w) in planned]


def gateway_key_first(state: Mapping[str, Any], paths: Mapping[str, str], unit: str, api_key: str) -> bool:
    """Whether the gateway takes the endpoint's API key before the replicas roll: the key is new (the running
    gateway has no key file) and the gateway runs. A keyless engine accepts requests that carry a key, so the gateway
    restarted first with the key serves every replica, and each replica then takes the key in its turn. The other
    order fails the first keyed replica a gateway without the key reaches: after a power-off mid-rollout the old
    gateway's startup registration of that replica is refused (401) and retried without end, and every add of it is
    refused as already in progress (409). A keyless gateway's key file is absent or empty (key_file_text). The key
    itself leaves this function only as a boolean."""
    from dflash_infra import host_state

    running = ((state.get("units") or {}).get(unit) or {}).get("ActiveState") == "active"
    key_file = host_state.path_entry(state, paths["api_key"])
    return bool(api_key) and running and not (key_file.get("exists") and key_file.get("size"))


def gateway_record(previous: Mapping[str, Any] | None, venv: Mapping[str, Any], lock_file: str, version: str,
                   unit_sha256: str, section: Mapping[str, Any], now: str,
                   tls: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the gateway's record (smg-gateway.json) says: the smg release, the lock it was installed from (file,
    sha256, packages, the notable pins), its unit's sha256, the endpoint, whether it serves HTTPS (`tls`, the
    settings' dflash_endpoint_tls) and its workers. `deployed_at` is kept from `previous` when nothing else differs,
    so a converged host's record is not rewritten."""
    record: dict[str, Any] = {
        "smg": version, "venv": venv.get("venv"),
        "lock": {"file": lock_file, "sha256": venv.get("lock_sha256"), "packages": venv.get("packages"),
                 "notable": dict(venv.get("notable") or {})},
        "unit_sha256": unit_sha256, "endpoint": f"{section.get('host')}:{section.get('port')}",
        "tls": tls_enabled(tls), "workers": list(section.get("workers") or [])}
    same = isinstance(previous, Mapping) and {k: v for k, v in previous.items() if k != "deployed_at"} == record
    return {"deployed_at": previous["deployed_at"] if same and previous else now, **record}


__all__ = [
    "GATEWAY_HELPERS",
    "HELPERS",
    "MIN_DRIVER_FOR_CUDA",
    "SERVICE_DIRS",
    "UNIT_DIR",
    "ServingError",
    "argv_flags",
    "base_url",
    "capability_problems",
    "command_lines",
    "comparison_line",
    "driver_problems",
    "driver_ready_problems",
    "engine_env_text",
    "engine_problems",
    "engine_status",
    "engine_tls_paths",
    "engine_tls_problem",
    "engine_tls_todo",
    "environment_inputs_problems",
    "environment_problems",
    "exec_start_lines",
    "flags_from_help",
    "gateway_exec_start_lines",
    "gateway_paths",
    "gateway_record",
    "gateway_restore_url",
    "gateway_restore_workers",
    "gateway_tls_parts",
    "gateway_todo",
    "key_file_text",
    "key_problems",
    "keys_problems",
    "missing_flags",
    "probe_host",
    "quoted_lines",
    "record",
    "rolled_back_record",
    "secret_files",
    "service_done",
    "service_paths",
    "service_todo",
    "systemd_environment",
    "systemd_quote",
    "systemd_text",
    "tls_enabled",
    "tls_text",
    "unit_argv",
]
