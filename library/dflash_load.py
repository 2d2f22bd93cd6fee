#!/usr/bin/python
"""Ansible module dflash_load: a bounded load run against an engine or the gateway, from the host itself."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_load
short_description: Send a bounded number of chat completions at given concurrencies and report what each did
description:
  - Runs on the host that serves (the engine's or the gateway's address as the host reaches it), with the standard
    library only. For each concurrency, I(requests) chat completions (temperature 0, I(max_tokens), the prompts in
    turn) are sent by that many workers at once, each request with its own deadline; nothing else is sent.
  - With I(meta_info) the requests ask for SGLang's speculative figures (C(return_meta_info) and
    C(return_spec_tokens_details): 0.5.23 adds them to C(choices[i].meta_info) and C(sglext.spec_tokens_details));
    the answer's C(spec_*) fields are returned per request, and the controller reads them
    (dflash_infra.loadgate.spec_figures) and computes the figures (dflash_infra.loadgate.figures).
  - The API key is read on the host from I(api_key_file) (the key alone) or I(api_key_env_file) (its
    C(SGLANG_API_KEY=) line), so it appears in no argument, log or result.
  - With I(unit), the unit's C(NRestarts), C(InvocationID) and C(ActiveState) are read before and after the run: an
    engine that crashed under load and was restarted by systemd is reported as such.
  - Sends requests but changes nothing on the host: runs the same under check mode; C(changed) is always false.
options:
  url: {description: Base URL (http://host:port)., type: str, required: true}
  model: {description: The served model name., type: str, required: true}
  workload:
    description:
      - "The load gate's mapping (group_vars dflash_load_gate): its prompts, requests, max_tokens, thinking and
        timeout_s are the defaults of the options of those names (its other keys are not read)."
    type: dict
    default: {}
  prompts:
    description: "Each {name, messages}: the chat messages of one prompt. Required, here or in I(workload)."
    type: list
    elements: dict
  requests: {description: "Requests per concurrency (default: I(workload)'s, else 16).", type: int}
  concurrency: {description: The concurrencies to run, in order., type: list, elements: int, default: [4]}
  max_tokens: {description: "max_tokens of every request (default: I(workload)'s, else 64).", type: int}
  meta_info: {description: Ask for the speculative figures., type: bool, default: true}
  stream:
    description:
      - "Stream every second request (server-sent events, C(stream_options.include_usage)): its first content chunk
        gives the time to first token and the rest the inter-token latency; 0.5.23 refuses C(return_meta_info) with
        streaming, so a streamed request asks for C(return_spec_tokens_details) (its C(sglext) chunk). The others
        are not streamed and carry C(choices[i].meta_info)."
    type: bool
    default: true
  thinking:
    description: "chat_template_kwargs.enable_thinking of every request (Qwen3's thinking mode; default: I(workload)'s,
      else false)."
    type: bool
  timeout_s: {description: "Deadline of one request (default: I(workload)'s, else 120).", type: float}
  api_key_file: {description: A file holding the API key alone., type: path}
  api_key_env_file: {description: An environment file with an SGLANG_API_KEY= line., type: path}
  unit: {description: The systemd unit of the engine to watch for restarts., type: str}
  units:
    description: The systemd units of several engines to watch for restarts (the replicas behind a gateway).
    type: list
    elements: str
    default: []
"""

RETURN = r"""
runs:
  description: Per concurrency, each request as the client saw it (times in seconds on the host's monotonic clock).
  type: list
  returned: always
  sample: [{concurrency: 4, wall_s: 0.4, outcomes: [{prompt: code, started: 1.0, finished: 1.2, ok: true,
            stream: false, completion_tokens: 64,
            answer: {choices: [{meta_info: {spec_accept_length: 4.9, spec_verify_ct: 13}}]}, error: ""},
            {prompt: math, started: 1.0, first_token: 1.05, finished: 1.3, ok: true, stream: true,
             completion_tokens: 64, answer: {sglext: {spec_tokens_details: {spec_accept_length: 4.7,
             spec_verify_ct: 14}}}, error: ""}]}]
unit:
  description: The unit before and after the run (NRestarts, InvocationID, ActiveState) and whether it restarted.
  type: dict
  returned: when unit is given
units:
  description: The same as I(unit) for each of I(units), by name.
  type: dict
  returned: when units are given
"""

import http.client
import json
import subprocess
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule

if TYPE_CHECKING:
    from dflash_gateway.ctl import tls_context
else:
    from ansible.module_utils.dflash_gateway.ctl import tls_context

UNIT_PROPS = ("NRestarts", "InvocationID", "ActiveState")
# The options a workload (the load gate's mapping) gives defaults for, each with its type and its own default.
WORKLOAD = {"prompts": (list, None), "requests": (int, 16), "max_tokens": (int, 64), "thinking": (bool, False),
            "timeout_s": (float, 120.0)}


def read_key(key_file: str | None, env_file: str | None) -> str:
    """The API key from a key file or an environment file's SGLANG_API_KEY line; empty when neither has one."""
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return ""
    if env_file:
        try:
            with open(env_file, encoding="utf-8") as handle:
                for line in handle:
                    name, sep, value = line.strip().partition("=")
                    if sep and name.strip() == "SGLANG_API_KEY":
                        return value.strip().strip('"')
        except FileNotFoundError:
            return ""
    return ""


def with_workload(module: AnsibleModule) -> dict[str, Any]:
    """The module's parameters, each option left out taken from the workload (else its own default), typed."""
    params, workload = dict(module.params), module.params["workload"] or {}
    for name, (kind, default) in WORKLOAD.items():
        if params[name] is None:
            value = workload.get(name, default)
            try:
                params[name] = module.boolean(value) if kind is bool else value if value is None else kind(value)
            except (TypeError, ValueError):
                module.fail_json(msg=f"dflash_load: expected the workload's {name} of type {kind.__name__}, found "
                                 f"{value!r}")
    return params


def unit_props(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "--property=" + ",".join(UNIT_PROPS)],
                         capture_output=True, text=True, check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def restarts(before: dict[str, str], after: dict[str, str]) -> dict[str, Any]:
    """A unit before and after the load run, and whether it restarted (or is no longer active) meanwhile."""
    return {"before": before, "after": after,
            "restarted": after.get("InvocationID") != before.get("InvocationID")
            or after.get("NRestarts") != before.get("NRestarts") or after.get("ActiveState") != "active"}


def spec_only(value: Any) -> dict[str, Any] | None:
    """The spec_* fields of a meta_info-like mapping (the rest of an answer stays on the host)."""
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if k.startswith("spec_") and not k.endswith("_histogram")}


def trimmed(answer: dict[str, Any]) -> dict[str, Any]:
    """Where 0.5.23 puts the speculative figures, with only those fields kept."""
    out: dict[str, Any] = {}
    if isinstance(answer.get("meta_info"), dict):
        out["meta_info"] = spec_only(answer["meta_info"])
    choices = [{"meta_info": spec_only(c.get("meta_info"))} for c in answer.get("choices") or []
               if isinstance(c, dict) and isinstance(c.get("meta_info"), dict)]
    if choices:
        out["choices"] = choices
    sglext = answer.get("sglext")
    if isinstance(sglext, dict) and isinstance(sglext.get("spec_tokens_details"), dict):
        out["sglext"] = {"spec_tokens_details": spec_only(sglext["spec_tokens_details"])}
    return out


class Client:
    """One keep-alive connection per worker; a failed request closes it."""

    def __init__(self, url: str, key: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        self.tls = tls_context(url)  # the gateway's endpoint over TLS (docs/serving.md, "TLS")
        self.host, self.port = str(parts.hostname), parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = "Bearer " + key
        self.conn: http.client.HTTPConnection | None = None

    def open(self, path: str, body: dict[str, Any]) -> http.client.HTTPResponse:
        """The response, its body not read yet (a stream is read event by event)."""
        if self.conn is None:
            self.conn = (http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.tls)
                         if self.tls is not None else
                         http.client.HTTPConnection(self.host, self.port, timeout=self.timeout))
        try:
            self.conn.request("POST", self.prefix + path, body=json.dumps(body), headers=self.headers)
            return self.conn.getresponse()
        except Exception:
            self.drop()
            raise

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def streamed(response: http.client.HTTPResponse, out: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    """Read a chat completion stream: the first content chunk's time into out['first_token']; the completion tokens
    (the usage chunk), the content and the answer's speculative figures (the sglext chunk)."""
    tokens, content, answer = 0, [], {}
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk or chunk.get("object") == "error":
            raise RuntimeError(f"an error in the stream: {str(chunk)[:200]}")
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                out.setdefault("first_token", time.monotonic())
                content.append(text)
        tokens = int((chunk.get("usage") or {}).get("completion_tokens") or tokens)
        if isinstance(chunk.get("sglext"), dict):
            answer["sglext"] = chunk["sglext"]
    response.read()  # the rest of the body (a chunked body's last chunk): the connection is reused
    return tokens, "".join(content), answer


def one(client: Client, prompt: dict[str, Any], params: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": params["model"], "messages": prompt["messages"],
                            "max_tokens": params["max_tokens"], "temperature": 0, "stream": stream,
                            "chat_template_kwargs": {"enable_thinking": params["thinking"]}}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if params["meta_info"]:
        body.update(return_spec_tokens_details=True, **({} if stream else {"return_meta_info": True}))
    started = time.monotonic()
    out: dict[str, Any] = {"prompt": prompt.get("name", ""), "started": started, "ok": False, "stream": stream,
                           "completion_tokens": 0, "answer": {}, "error": ""}
    try:
        response = client.open("/v1/chat/completions", body)
        if response.status != 200:
            out["error"] = f"HTTP {response.status}: {response.read()[:200].decode('utf-8', 'replace')}"
        else:
            if stream:
                tokens, content, answer = streamed(response, out)
            else:
                answer = json.loads(response.read() or b"{}")
                tokens = int(((answer.get("usage") or {}).get("completion_tokens")) or 0)
                content = str(((answer.get("choices") or [{}])[0].get("message") or {}).get("content") or "")
            out.update(ok=tokens > 0 and bool(content), completion_tokens=tokens, answer=trimmed(answer))
            if not out["ok"]:
                out["error"] = "an empty completion"
    except Exception as exc:  # a refused connection, a deadline, a broken answer: the request failed
        client.drop()
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["finished"] = time.monotonic()
    return out


def run_at(concurrency: int, params: dict[str, Any], key: str) -> dict[str, Any]:
    prompts, total = params["prompts"], params["requests"]
    results: list[dict[str, Any] | None] = [None] * total
    counter = {"next": 0}
    lock = threading.Lock()

    def worker() -> None:
        client = Client(params["url"], key, params["timeout_s"])
        while True:
            with lock:
                index = counter["next"]
                counter["next"] += 1
            if index >= total:
                return
            results[index] = one(client, prompts[index % len(prompts)], params,
                                 stream=params["stream"] and index % 2 == 1)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, total))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"concurrency": concurrency, "wall_s": round(time.monotonic() - start, 3), "outcomes": results}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "workload": {"type": "dict", "default": {}},
            "prompts": {"type": "list", "elements": "dict"},
            "requests": {"type": "int"},
            "concurrency": {"type": "list", "elements": "int", "default": [4]},
            "max_tokens": {"type": "int"},
            "meta_info": {"type": "bool", "default": True},
            "stream": {"type": "bool", "default": True},
            "thinking": {"type": "bool"},
            "timeout_s": {"type": "float"},
            "api_key_file": {"type": "path"},
            "api_key_env_file": {"type": "path"},
            "unit": {"type": "str"},
            "units": {"type": "list", "elements": "str", "default": []},
        },
        mutually_exclusive=[["api_key_file", "api_key_env_file"]],
        supports_check_mode=True,
    )
    params = with_workload(module)
    prompts = params["prompts"]
    if not isinstance(prompts, list) or not prompts or any(not isinstance((p or {}).get("messages"), list)
                                                           for p in prompts):
        module.fail_json(msg=f"dflash_load: expected prompts, each with a list of chat messages, found "
                         f"{(params['prompts'] or [])[:1]!r}")
    if params["requests"] < 1 or any(c < 1 for c in params["concurrency"]):
        module.fail_json(msg=f"dflash_load: expected at least one request and concurrencies of at least 1, found "
                         f"requests {params['requests']}, concurrency {params['concurrency']}")
    key = read_key(params["api_key_file"], params["api_key_env_file"])
    watched = ([params["unit"]] if params["unit"] else []) + list(params["units"])
    before = {name: unit_props(name) for name in watched}
    runs = [run_at(c, params, key) for c in params["concurrency"]]
    result: dict[str, Any] = {"changed": False, "runs": runs}
    seen = {name: restarts(before[name], unit_props(name)) for name in watched}
    if params["unit"]:
        result["unit"] = seen[params["unit"]]
    if params["units"]:
        result["units"] = {name: seen[name] for name in params["units"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
