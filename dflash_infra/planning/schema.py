"""The planner's request, checked once against one schema before anything is planned.

Types, ranges and allowed characters of every key a request (examples/*.yml, the serving_plan role's inputs, the
CLI's file) may hold. Each mistake becomes one error naming the field, the value given and what is allowed, so the
later steps read values of the right type and range and never raise on them. Types are strict: a float is not an
integer and a string of digits is not a number (give `-e` values as JSON: `-e '{"dflash_service_port": 30001}'`).

Names and paths that reach a systemd unit or the engine's command line are held to documented sets:
served model names `SERVED_NAME`, model paths absolute and normalised (no `.`, `..` or `//`) and, when the request
names its `model_root`, under it; free-form words (engine flag values, GPU names) without control characters.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# What a served model name may hold: it is the OpenAI `model` field clients send, the unit's Description and the
# gateway's model id. Letters, digits and . _ : / @ + - ; 1 to 128 characters, starting with a letter or digit.
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
SERVED_NAME_TEXT = "1-128 of letters, digits and . _ : / @ + - (starting with a letter or digit)"
# A host the engine or gateway listens on: an IP address or a DNS name.
HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.:-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]{0,63}")
KERNEL = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")
# The largest figures a plan is made for: beyond them a request is a typo, not a machine.
MAX_GPU_MIB = 16 * 1024 * 1024  # 16 TiB per GPU
MAX_GPUS = 1024
MAX_TP = 64
MAX_TOKENS = 1 << 24  # context length, draft tokens, chunk sizes
MAX_BYTES = 1 << 50  # weight bytes (1 PiB)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Check = Callable[[str, Any, list[str]], Any]  # (field, value, errors) -> the normalised value


def shown(value: Any) -> str:
    """A value as an error quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(errors: list[str], field: str, what: str, value: Any) -> None:
    errors.append(f"{field}: expected {what}, found {shown(value)}")


def integer(low: int, high: int) -> Check:
    """An integer in [low, high]: not a float (7.9 is not silently 7), a bool or a string of digits."""
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            _fail(errors, field, f"an integer from {low} to {high}", value)
        return value
    return check


def fraction() -> Check:
    """A number strictly between 0 and 1."""
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
                or not 0 < value < 1):
            _fail(errors, field, "a number between 0 and 1 (exclusive)", value)
        return value
    return check


def boolean() -> Check:
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if not isinstance(value, bool):
            _fail(errors, field, "true or false", value)
        return value
    return check


def text(pattern: re.Pattern[str] | None, what: str, max_len: int = 256) -> Check:
    """A one-line string (no control characters) matching `pattern` when given."""
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if (not isinstance(value, str) or not value or len(value) > max_len or _CONTROL.search(value)
                or (pattern is not None and not pattern.fullmatch(value))):
            _fail(errors, field, what, value)
        return value
    return check


def choice(*allowed: str) -> Check:
    """One of `allowed`, in any case (returned as written)."""
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if not isinstance(value, str) or value.lower() not in allowed:
            _fail(errors, field, f"one of {', '.join(allowed)}", value)
        return value
    return check


def absolute_path(root_field: str | None = None) -> Check:
    """An absolute, normalised POSIX path without `..` (a model folder: it reaches the engine's argv, the unit's
    BindReadOnlyPaths and the sync's destination)."""
    pattern = re.compile(r"/[A-Za-z0-9._@+/-]{0,1023}")

    def check(field: str, value: Any, errors: list[str]) -> Any:
        if (not isinstance(value, str) or not pattern.fullmatch(value) or posixpath.normpath(value) != value
                or ".." in value.split("/") or value == "/"):
            _fail(errors, field, "an absolute, normalised path of letters, digits and . _ @ + - / (no '..', no "
                                 "'//', no trailing '/')", value)
        return value
    return check


def nullable(inner: Check) -> Check:
    def check(field: str, value: Any, errors: list[str]) -> Any:
        return None if value is None else inner(field, value, errors)
    return check


def anything() -> Check:
    def check(field: str, value: Any, errors: list[str]) -> Any:
        return value
    return check


def any_mapping() -> Check:
    """An object whose keys are not this schema's (a config.json, checked by the model reader)."""
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if not isinstance(value, Mapping):
            _fail(errors, field, "an object", value)
        return value
    return check


@dataclass(frozen=True)
class Obj:
    """An object with known keys; `extra` lets other keys through unchecked (records carry more than the planner
    reads)."""

    fields: Mapping[str, Check]
    required: tuple[str, ...] = ()
    extra: bool = False
    noun: str = "key"  # what an unknown key is called in the error ("unknown override")

    def __call__(self, field: str, value: Any, errors: list[str]) -> Any:
        if not isinstance(value, Mapping):
            _fail(errors, field, f"an object with {', '.join(self.fields)}", value)
            return value
        out = dict(value)
        for key in self.required:
            if value.get(key) is None:
                errors.append(f"{_join(field, key)}: required, found nothing")
        for key, item in value.items():
            check = self.fields.get(key) if isinstance(key, str) else None
            if check is None:
                if not self.extra:
                    errors.append(f"{_join(field, str(key))}: unknown {self.noun}; known: {', '.join(self.fields)}")
                continue
            if item is None:
                out.pop(key)  # null is unset: the planner's default applies
                continue
            out[key] = check(_join(field, key), item, errors)
        return out


def items(inner: Check, min_len: int, max_len: int) -> Check:
    """A list of `min_len`..`max_len` items, each checked by `inner`."""
    def check(field: str, value: Any, errors: list[str]) -> Any:
        if not isinstance(value, list) or not min_len <= len(value) <= max_len:
            _fail(errors, field, f"a list of {min_len} to {max_len} items", value)
            return value
        return [inner(f"{field}[{i}]", v, errors) for i, v in enumerate(value)]
    return check


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _model() -> Obj:
    return Obj({"name": text(MODEL_NAME, "a model name of letters, digits and . _ - (as in the catalogue)"),
                "path": absolute_path(), "config": any_mapping(),
                "config_path": text(None, "a path to a config.json", 1024),
                "weights_bytes": integer(1, MAX_BYTES)}, extra=True)


GPU = Obj({"index": integer(0, MAX_GPUS - 1),
           "name": text(None, "a GPU name as nvidia-smi prints it (one line, no control characters)", 128),
           "memory_total_mib": integer(1, MAX_GPU_MIB),
           "compute_cap": nullable(text(re.compile(r"[0-9]{1,2}\.[0-9]{1,2}"), "a compute capability such as '12.0'"))},
          required=("name", "memory_total_mib"), extra=True)
SPECULATIVE = Obj({"algorithm": choice("dflash", "ddtree", "none"),
                   "block_size": integer(1, 64), "draft_window": integer(1, MAX_TOKENS),
                   "max_draft_tokens": integer(1, 64), "tree_budget": integer(1, 1024)})
SERVE = Obj({"host": text(HOST, "an IP address or a DNS name", 255), "port": integer(1, 65535),
             "served_model_name": text(SERVED_NAME, SERVED_NAME_TEXT, 128)})
CAPACITY = Obj({"min_running_requests": integer(1, 65536), "min_kv_cache_tokens": integer(0, 1 << 31)})
OVERRIDES = Obj({
    "tp_size": integer(1, MAX_TP), "dp_size": integer(1, MAX_GPUS), "mem_fraction_static": fraction(),
    "max_running_requests": integer(1, 65536), "context_length": integer(1, MAX_TOKENS),
    "attention_backend": text(KERNEL, "a backend name such as flashinfer or triton"),
    "prefill_attention_backend": text(KERNEL, "a backend name such as flashinfer or triton"),
    "decode_attention_backend": text(KERNEL, "a backend name such as flashinfer or triton"),
    "draft_attention_backend": text(KERNEL, "a backend name such as flashinfer or triton"),
    "mamba_ssm_dtype": text(KERNEL, "a dtype such as bfloat16 or float32"),
    "chunked_prefill_size": integer(1, MAX_TOKENS), "page_size": integer(1, 4096),
    "speculative_use_rejection_sampling": boolean(),
    # Its flags and values are checked against the release's table (engine_flags.py); here only its words.
    "engine_flags": anything(),
}, noun="override")
REQUEST = Obj({
    "gpus": items(GPU, 1, MAX_GPUS),
    "target": _model(), "draft": _model(),
    "speculative": SPECULATIVE,
    "sglang_version": text(VERSION, "a release such as 0.5.23 (or 0.5.23+lab, 0.5.23+ddtree)", 64),
    # The installed engine's own option strings (its --help), when the request plans for it.
    "engine_options": items(text(re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"), "an option string such as "
                                 "--tp-size"), 0, 8192),
    "serve": SERVE, "capacity": CAPACITY, "overrides": OVERRIDES,
    "gateway": anything(),  # its settings are checked by planning/gateway.py, names and all
    "context_length": integer(1, MAX_TOKENS),
    "model_root": absolute_path(),
}, required=("gpus", "target", "sglang_version"))


def under_root(request: Mapping[str, Any], errors: list[str]) -> None:
    """Model and draft paths under the request's `model_root`, when it names one."""
    root = request.get("model_root")
    if not isinstance(root, str):
        return
    for key in ("target", "draft"):
        path = (request.get(key) or {}).get("path") if isinstance(request.get(key), Mapping) else None
        if isinstance(path, str) and not path.startswith(root.rstrip("/") + "/"):
            errors.append(f"{key}.path: expected a folder under the model root {root}, found {shown(path)}")


def check_request(request: Any) -> tuple[dict[str, Any], list[str]]:
    """The request as a plain dict, and every way it breaks the schema (empty when it does not)."""
    errors: list[str] = []
    if not isinstance(request, Mapping):
        return {}, [f"request: expected a JSON/YAML object, found {type(request).__name__}"]
    normalised = REQUEST("", request, errors)
    if not errors:
        under_root(normalised, errors)
    return normalised, errors
