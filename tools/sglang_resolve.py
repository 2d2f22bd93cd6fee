#!/usr/bin/env python3
"""Resolve engine command lines with SGLang's own resolution rules for a given card, on a CPU machine.

After parsing, SGLang decides most of a server's settings in `ServerArgs.resolve_once()` (the hooks of
`sglang/srt/arg_groups/pipeline.py`: attention and linear-attention backends, mamba radix cache, memory, CUDA
graphs, speculative decoding, serving) and then refuses what cannot run in `check_server_args()`. Those rules read
the machine: this tool fakes the platform from a GPU profile (compute capability, memory, CUDA version) at the
patch points named in PATCH_POINTS, and runs the pinned release's own pipeline on the argv.

Runs inside the parser environment (tools/sglang_parser_env.sh), with the wanted version importable:
  echo '{"version": "0.5.23", "checks": [{"argv": [...], "gpu": {"compute_cap": "12.0", "memory_total_mib": 97887},
         "models": {"/root/models/Qwen3.6-27B": {<config.json>}, ...}}]}' \
    | .cache/sglang-parser/bin/python-0.5.23 tools/sglang_resolve.py
Prints a JSON list, one result per check, in order:
  {"ok": bool, "stage": "parse"|"resolve"|"check"|null, "error": str|null, "warnings": [str],
   "given": {dest: value}, "changed": {dest: {"argv": value, "resolved": value}}, "picked": {dest: value},
   "platform": {fact: value}, "patched": {patch point: count}}
`changed` lists every option the argv gave whose resolved value differs; `picked` is what SGLang chose for the
settings in PICKED that the argv left unset. Each check runs in a forked child of the process that imported SGLang
(resolution writes os.environ and module state), so checks never see each other. `models` maps a model path of the
argv to the config.json written there for the check (a temporary folder stands in for the path; results name the
original path). `"fake": false` runs on the real CPU platform, which SGLang refuses ("No accelerator ...").
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_sglang_flags import build_real_parser, imported_sglang_version, scrub_sglang_environment
from sglang_argcheck import _Collect, error_message, given_only, to_json

# The CUDA build of the torch the pinned release installs (sglang 0.5.23 pins torch 2.14.1, a CUDA 13.0 build):
# what torch.version.cuda says on the host, whatever the driver.
DEFAULT_CUDA_VERSION = "13.0"


@dataclass(frozen=True)
class PatchPoints:
    """Where SGLang reads the machine during resolution, as found in one release: the fewest places that make its
    own rules see the profile's card."""

    release: str
    # sglang.srt.runtime_context.override_platform: SGLang's own scoped platform facts (the attention, kernel and
    # graph hooks read the machine through get_platform()).
    platform: bool
    # Functions of sglang.srt.utils.common that answer outside get_platform(); replaced there and in every sglang
    # module that imported them by name (`from sglang.srt.utils.common import get_device`).
    common: tuple[str, ...]
    # torch attributes the probes above read: the card's capability, the CUDA build.
    torch: tuple[str, ...]


PATCH_POINTS = {
    "0.5.23": PatchPoints(
        release="0.5.23",
        platform=True,
        common=("is_cuda", "get_device", "get_device_memory_capacity", "get_device_sm"),
        torch=("torch.cuda.get_device_capability", "torch.version.cuda"),
    ),
}

# Settings SGLang picks when the argv leaves them unset, reported so a plan can be compared with the engine's own
# choice for the same card.
PICKED = (
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "linear_attn_backend",
    "page_size", "mem_fraction_static", "max_running_requests", "chunked_prefill_size", "context_length",
    "mamba_radix_cache_strategy", "disable_overlap_schedule", "speculative_num_draft_tokens",
    "speculative_draft_window_size", "speculative_draft_attention_backend", "cuda_graph_config",
)


@dataclass(frozen=True)
class GpuProfile:
    """The card a command line is resolved for."""

    compute_cap: str  # "12.0"
    memory_total_mib: int
    cuda_version: str = DEFAULT_CUDA_VERSION

    @classmethod
    def from_json(cls, raw: Any) -> GpuProfile:
        if not isinstance(raw, dict) or "compute_cap" not in raw or "memory_total_mib" not in raw:
            raise SystemExit(f"expected gpu {{compute_cap, memory_total_mib, cuda_version?}}, found {raw!r}")
        return cls(str(raw["compute_cap"]), int(raw["memory_total_mib"]),
                   str(raw.get("cuda_version") or DEFAULT_CUDA_VERSION))

    @property
    def capability(self) -> tuple[int, int]:
        major, _, minor = self.compute_cap.partition(".")
        return int(major), int(minor or 0)

    def platform_facts(self) -> dict[str, Any]:
        """The facts sglang.srt.utils.common's probes would report on this card (their rules, 0.5.23)."""
        major, minor = self.capability
        cuda = tuple(int(p) for p in self.cuda_version.split(".")[:2])
        at_least_12_8 = cuda >= (12, 8)
        return {
            "is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
            "is_sm90": major == 9 and cuda >= (12, 3),
            "is_hopper_with_cuda_12_3": major == 9 and cuda >= (12, 3),
            "is_sm100": major == 10 and at_least_12_8,
            "is_sm100_or_sm110": major in (10, 11) and at_least_12_8,
            "is_sm110": major == 11 and at_least_12_8,
            "is_sm120": major == 12 and at_least_12_8,
            "is_blackwell": major in (10, 11, 12) and at_least_12_8,
            # The release installs flashinfer-python on CUDA hosts; this venv does not carry it.
            "has_flashinfer": True,
            "has_amx": False,
            "device_sm": major * 10 + minor,
            "device_capability": (major, minor),
        }


@dataclass
class Result:
    """What SGLang's resolution made of one argv on one card."""

    ok: bool
    stage: str | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    given: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)
    picked: dict[str, Any] = field(default_factory=dict)
    platform: dict[str, Any] = field(default_factory=dict)
    patched: dict[str, int] = field(default_factory=dict)


def import_resolution_modules() -> None:
    """Import every hook module on the real (CPU) platform first: faking is_cuda before they are imported breaks
    their imports, and the by-name copies of the patched functions only exist once they are."""
    import importlib
    import pkgutil

    import sglang.srt.arg_groups as groups
    from sglang.srt.server_args import ServerArgs  # noqa: F401

    for module in pkgutil.iter_modules(groups.__path__):
        with contextlib.suppress(Exception):  # a hook for other hardware may not import here; it does not run
            importlib.import_module(f"{groups.__name__}.{module.name}")


def fake_platform(points: PatchPoints, gpu: GpuProfile) -> dict[str, int]:
    """Make SGLang see `gpu` at every patch point; returns how many places each replacement took."""
    import torch
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.utils import common

    major, minor = gpu.capability
    replacements = {
        "is_cuda": lambda: True,
        "get_device": lambda device_id=None: "cuda",
        "get_device_memory_capacity": lambda device=None: float(gpu.memory_total_mib),
        "get_device_sm": lambda: major * 10 + minor,
    }
    patched: dict[str, int] = {}
    for name in points.common:
        original, fake = getattr(common, name), replacements[name]
        places = [m for n, m in list(sys.modules.items())
                  if n.startswith("sglang") and m is not None and getattr(m, name, None) is original]
        for module in places:
            setattr(module, name, fake)
        patched[f"sglang.srt.utils.common.{name}"] = len(places)
    # The probes are lru_cache'd: forget anything the importing process cached on the CPU.
    for value in vars(common).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()
    for name in points.torch:
        if name == "torch.cuda.get_device_capability":
            torch.cuda.get_device_capability = lambda device=None: (major, minor)
        elif name == "torch.version.cuda":
            torch.version.cuda = gpu.cuda_version
        patched[name] = 1
    if points.platform:
        override_platform(**gpu.platform_facts()).install()
        patched["sglang.srt.runtime_context.override_platform"] = len(gpu.platform_facts())
    return patched


def same(given: Any, resolved: Any) -> bool:
    """Equal as the argv meant it (floats within rounding)."""
    if isinstance(given, float) or isinstance(resolved, float):
        try:
            return math.isclose(float(given), float(resolved), rel_tol=0, abs_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return bool(to_json(given) == to_json(resolved))


def stand_in_models(argv: list[str], models: dict[str, Any], root: Path) -> tuple[list[str], dict[str, str]]:
    """The argv with each path of `models` replaced by a folder holding that config.json; {stand-in: original}."""
    out, names = list(argv), {}
    for i, (original, config) in enumerate(sorted(models.items())):
        folder = root / f"model-{i}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        names[str(folder)] = original
        out = [str(folder) if word == original else word for word in out]
    return out, names


def original_names(value: Any, names: dict[str, str]) -> Any:
    """A resolved value with the stand-in folders named by the argv's paths again."""
    if isinstance(value, str):
        for stand_in, original in names.items():
            value = value.replace(stand_in, original)
        return value
    if isinstance(value, list):
        return [original_names(v, names) for v in value]
    if isinstance(value, dict):
        return {k: original_names(v, names) for k, v in value.items()}
    return value


def resolve(version: str, check: dict[str, Any]) -> Result:
    """One check, in the calling process (run it in a forked child): parse, fake, resolve, check, compare."""
    from sglang.srt.server_args import ServerArgs

    argv = check.get("argv")
    if not isinstance(argv, list) or not all(isinstance(w, str) for w in argv):
        return Result(ok=False, stage="parse", error=f"expected argv as a list of strings, found {argv!r}")
    gpu = GpuProfile.from_json(check.get("gpu"))
    result = Result(ok=False, platform={k: to_json(v) for k, v in gpu.platform_facts().items()})
    with tempfile.TemporaryDirectory(prefix="sglang-resolve-") as tmp:
        argv, names = stand_in_models(argv, dict(check.get("models") or {}), Path(tmp))
        parser = build_real_parser()
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stderr):
            try:
                namespace = parser.parse_args(argv)
                given = vars(given_only(parser).parse_args(argv))
            except SystemExit:
                result.stage, result.error = "parse", error_message(stderr.getvalue())
                return result
        result.given = {dest: original_names(to_json(getattr(namespace, dest)), names) for dest in sorted(given)}
        if check.get("fake", True):
            result.patched = fake_platform(PATCH_POINTS[version], gpu)
        collect = _Collect()
        logging.getLogger().addHandler(collect)
        server_args = ServerArgs.from_cli_args(namespace)
        stage = "resolve"
        try:
            with contextlib.redirect_stdout(sys.stderr):
                server_args.resolve_once()
                stage = "check"
                server_args.check_server_args()
        except Exception as exc:  # SGLang refuses with ValueError, AssertionError, RuntimeError, ...
            result.stage, result.error = stage, original_names(f"{type(exc).__name__}: {exc}", names)
            result.warnings = collect.messages
            return result
        finally:
            logging.getLogger().removeHandler(collect)
        resolved = {k: original_names(to_json(v), names) for k, v in server_args.resolved_dict().items()}
    result.ok, result.warnings = True, collect.messages
    result.changed = {dest: {"argv": value, "resolved": resolved.get(dest)}
                      for dest, value in result.given.items() if dest in resolved and not same(value, resolved[dest])}
    result.picked = {dest: resolved.get(dest) for dest in PICKED if dest not in result.given}
    return result


def in_child(version: str, check: dict[str, Any]) -> dict[str, Any]:
    """resolve() in a forked child, its answer read back through a pipe; a crash becomes a failed result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: resolve, write, leave without running the parent's cleanup
        os.close(read_end)
        try:
            answer = json.dumps(resolve(version, check).__dict__, default=repr)
        except BaseException as exc:  # anything: reported to the parent, never raised past fork
            answer = json.dumps(Result(ok=False, stage="resolve", error=f"{type(exc).__name__}: {exc}").__dict__)
        with os.fdopen(write_end, "w") as out:
            out.write(answer)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return Result(ok=False, stage="resolve", error=f"the resolving child died (wait status {status})").__dict__
    answer: dict[str, Any] = json.loads(text)
    return answer


def check_request(request: Any) -> tuple[str, list[dict[str, Any]]]:
    """{"version": str, "checks": [{"argv": [...], "gpu": {...}, "models"?: {...}, "fake"?: bool}, ...]}."""
    version, checks = (request.get("version"), request.get("checks")) if isinstance(request, dict) else (None, None)
    if version not in PATCH_POINTS or not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
        raise SystemExit(f'expected {{"version": one of {sorted(PATCH_POINTS)}, "checks": [{{"argv": [...], "gpu": '
                         f'{{...}}}}, ...]}} on stdin; found {json.dumps(request)[:200]}')
    return str(version), checks


def main() -> int:
    version, checks = check_request(json.load(sys.stdin))
    scrub_sglang_environment()
    with contextlib.redirect_stdout(sys.stderr):
        imported_sglang_version(version)
        import_resolution_modules()
    results = [in_child(version, check) for check in checks]
    json.dump(results, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
