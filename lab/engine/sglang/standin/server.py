"""LAB STAND-IN: the HTTP surface of an SGLang 0.5.23 server, served with the standard library.

Routes and JSON shapes follow sglang/srt/entrypoints/http_server.py and openai/protocol.py of 0.5.23:
/health, /health_generate and /ready (503 while starting, 200 with an empty body once ready),
/v1/models, /model_info, /server_info (and the deprecated /get_* spellings), /metrics with --enable-metrics
(standin/metrics.py; 404 without, as SGLang mounts it only then), /generate with the
speculative `meta_info` fields of tokenizer_manager.py, /v1/chat/completions and /v1/completions (with
`return_meta_info` the chat choice's `meta_info`, with `return_spec_tokens_details` the response's
`sglext.spec_tokens_details`, as openai/serving_chat.py and serving_completions.py of 0.5.23 add them).
Nothing is inferred: the text is a deterministic function of the prompt, and the speculative
figures are a deterministic function of prompt and block size. Never use this in production.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang.standin import loads
from sglang.standin.metrics import Metrics

WORDS = ("the", "draft", "model", "proposes", "a", "block", "of", "tokens", "and", "target", "verifies",
         "them", "in", "one", "pass", "so", "decoding", "runs", "faster", "while", "output", "stays", "exact")
DEFAULT_MAX_NEW_TOKENS = 128
# prometheus_client's CONTENT_TYPE_PLAIN_0_0_4: what SGLang's /metrics (make_asgi_app) answers a plain GET with.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class EngineState:
    """What the handlers read: the served model, resolved settings, readiness and failure switches."""

    served_model_name: str
    model_path: str
    context_length: int
    server_info: dict[str, Any]
    model_info: dict[str, Any]
    num_draft_tokens: int | None
    eos_token_id: int | None
    fail_generate: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    log: Any = None
    # --api-key / --admin-api-key as the engine parsed them (sglang-launch puts them on sys.argv in memory).
    api_key: str | None = None
    admin_api_key: str | None = None
    # Decode time: one forward step (a verify step when speculative, else one token) takes step_s seconds, so
    # throughput follows the acceptance length as on a GPU. Failure injection for the load gate: acceptance
    # collapsing to 1.0 while two or more requests run (the verify-logits fault of full CUDA graphs at
    # concurrency >= 2), a crash once `crash_under_load` requests run at once (an illegal memory access under load).
    step_s: float = 0.002
    accept_collapse: bool = False
    crash_under_load: int = 0
    crash: Any = None  # called with the number of requests in flight when crash_under_load is reached
    in_flight: int = 0
    metrics: Metrics | None = None  # with --enable-metrics: what /metrics reports
    lock: threading.Lock = field(default_factory=threading.Lock)
    tree_budget: int | None = None  # DDTREE (the variant build): tree nodes verified per step
    accelerator: str | None = None  # /v1/loads' accelerator: the GPU model's name (None outside the lab)

    @property
    def step_time(self) -> float:
        """Seconds of one decode step: step_s, times the wider verify of a DDTree wider than the chain
        (ddtree_verify_cost)."""
        if self.tree_budget is None or not self.num_draft_tokens:
            return self.step_s
        return self.step_s * ddtree_verify_cost(self.tree_budget, self.num_draft_tokens)


def authorized(method: str, path: str, authorization: str | None, api_key: str | None) -> bool:
    """SGLang 0.5.23's decision for its NORMAL endpoints (srt/utils/auth.py decide_request_auth; every route the
    stand-in serves is one): OPTIONS and /health*, /ready*, /metrics* always; otherwise, when an API key is set,
    only `Authorization: Bearer <key>` (compared in constant time; the scheme in any case)."""
    if method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")) or not api_key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(token, api_key)


def count_tokens(text: str) -> int:
    """A deterministic token count for a prompt (words and punctuation; at least 1)."""
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


def _digest(*parts: Any) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()


def completion(prompt: str, max_new_tokens: int) -> tuple[str, list[int]]:
    """Deterministic text and token ids for a prompt: same prompt, same answer."""
    seed = _digest(prompt)
    words, ids = [], []
    for i in range(max_new_tokens):
        b = seed[i % len(seed)] ^ (i * 131 % 256)
        words.append(WORDS[b % len(WORDS)])
        ids.append(1000 + (b * 97 + i) % 240000)
    return " " + " ".join(words), ids


def ddtree_tree_bonus(budget: int, block: int) -> int:
    """THE STAND-IN'S OWN MODEL of DDTree (no measurement): drafts a tree of `budget` nodes accepts beyond the
    chain's, one per doubling of the nodes over the chain's block - 1 (budget 31 at block 16: 1; 63: 2)."""
    nodes, bonus = budget + 1, 0
    while nodes >= 2 * block:
        nodes //= 2
        bonus += 1
    return bonus


def ddtree_verify_cost(budget: int, block: int) -> float:
    """THE STAND-IN'S OWN MODEL of DDTree: a step verifying budget + 1 tokens per request costs the chain's step
    times 1 + half the widening (memory-bound verify); a tree no wider than the chain costs the same. With
    ddtree_tree_bonus it keeps DDTree in the 0.6-1.0x of the linear chain an independent study measured on 2x RTX
    A6000, so a canary has something to measure; it says nothing about a real GPU."""
    return 1.0 + 0.5 * max(0.0, (budget + 1) / block - 1.0)


def spec_metrics(prompt: str, completion_tokens: int, block: int, collapsed: bool = False,
                 tree_budget: int | None = None) -> dict[str, Any]:
    """meta_info speculative fields as tokenizer_manager._calculate_spec_decoding_metrics computes them.

    Each verify step accepts k drafts (0..block-1) plus one bonus token; k is drawn from the prompt
    hash so the figures are stable, with an average acceptance length around 4-7 for block 16.
    `collapsed`: no draft is ever accepted (acceptance length 1.0: every step yields only the bonus token).
    `tree_budget` (DDTREE): k is at most the budget (a tree of that many nodes is at most that deep) and a tree
    wider than the chain accepts ddtree_tree_bonus more.
    """
    if completion_tokens <= 0 or block <= 1:
        return {}
    seed = _digest(prompt, block)
    histogram = [0] * block
    produced, verify_ct, correct = 0, 0, 0
    depth = block - 1 if tree_budget is None else min(block - 1, tree_budget)
    bonus = 0 if tree_budget is None else ddtree_tree_bonus(tree_budget, block)
    while produced < completion_tokens:
        b = seed[verify_ct % len(seed)]
        k = 0 if collapsed else min(depth, (b % 7) + (b >> 5) % 3 + 1 + bonus)
        k = min(k, completion_tokens - produced - 1)
        histogram[k] += 1
        correct += k
        produced += k + 1
        verify_ct += 1
    proposed = verify_ct * (block - 1)
    return {
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
        "spec_correct_drafts_histogram": histogram,
    }


def generate_one(state: EngineState, prompt: str, sampling: dict[str, Any], started: float) -> dict[str, Any]:
    """One /generate result: text, output_ids and meta_info."""
    result, steps = decoded(state, prompt, sampling)
    time.sleep(steps * state.step_time)  # decoding: one step per verify (speculative) or per token
    return finished(state, result, started)


def decoded(state: EngineState, prompt: str, sampling: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A result before its time is spent (text, output_ids, meta_info) and its decode steps: one per verify when
    speculative, else one per token."""
    max_new = sampling.get("max_new_tokens")
    limit = DEFAULT_MAX_NEW_TOKENS if max_new is None else int(max_new)
    text, ids = completion(prompt, limit)
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "finish_reason": {"type": "length", "length": limit},
        "prompt_tokens": count_tokens(prompt),
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
    }
    steps = len(ids)
    if state.num_draft_tokens:
        collapsed = state.accept_collapse and state.in_flight >= 2
        meta.update(spec_metrics(prompt, len(ids), state.num_draft_tokens, collapsed, state.tree_budget))
        steps = int(meta.get("spec_verify_ct") or steps)
    return {"text": text, "output_ids": ids, "meta_info": meta}, max(1, steps)


def finished(state: EngineState, result: dict[str, Any], started: float) -> dict[str, Any]:
    """The result once decoded: its latency, counted in the metrics."""
    result["meta_info"]["e2e_latency"] = time.monotonic() - started
    if state.metrics is not None:
        state.metrics.finished(result["meta_info"])
    return result


def step_deltas(text: str, steps: int) -> list[str]:
    """The text in `steps` pieces, one per decode step, whose concatenation is the text (a streamed answer sends one
    piece per step: several tokens per verify when speculative)."""
    words = text.split()
    cuts = [round(i * len(words) / steps) for i in range(steps + 1)]
    return ["".join(" " + w for w in words[a:b]) for a, b in itertools.pairwise(cuts)]


def _sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event as 0.5.23 writes it: compact JSON (msgspec / pydantic's model_dump_json)."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(chunk_id: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               matched_stop: Any = None) -> dict[str, Any]:
    """sse_utils.build_sse_content of 0.5.23: StreamChunk (usage left out when unset) of one StreamChoice (every
    field) whose StreamDelta always has reasoning_content and has role and content only when set."""
    return {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                         "finish_reason": finish_reason, "matched_stop": matched_stop}]}


def response_chunk(chunk_id: str, created: int, model: str, **fields: Any) -> dict[str, Any]:
    """ChatCompletionStreamResponse(choices=[]).model_dump_json() of 0.5.23: the sglext chunk (usage null) and the
    usage chunk (no sglext key)."""
    return {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
            "usage": fields.get("usage"), **({"sglext": fields["sglext"]} if "sglext" in fields else {})}


def usage_info(meta: dict[str, Any]) -> dict[str, Any]:
    """UsageInfo of 0.5.23's openai/protocol.py for one answer."""
    return {"prompt_tokens": meta["prompt_tokens"], "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
            "completion_tokens": meta["completion_tokens"], "prompt_tokens_details": None, "reasoning_tokens": 0,
            "completion_tokens_details": None}


# SpecTokensDetails of 0.5.23's openai/protocol.py: every field with its default (utils.py fills them in).
SPEC_TOKENS_DETAILS = (("spec_accept_rate", 0.0), ("spec_accept_length", 0.0), ("spec_cap_length", 0.0),
                       ("spec_block_accept_length", 0.0), ("spec_num_correct_drafts", 0),
                       ("spec_num_proposed_drafts", 0), ("spec_verify_ct", 0), ("spec_correct_drafts_histogram", []),
                       ("spec_cap_lens_histogram", []))


def spec_tokens_details(meta: dict[str, Any]) -> dict[str, Any] | None:
    """`sglext.spec_tokens_details` from a result's meta_info as 0.5.23 builds it: None unless the meta_info has a
    speculative figure, else every field (a missing or empty one at its default)."""
    if not any(key in meta for key, _ in SPEC_TOKENS_DETAILS):
        return None
    return {key: meta.get(key) or default for key, default in SPEC_TOKENS_DETAILS}


def _prompt_of_messages(messages: list[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(f"{m.get('role', 'user')}: {content}")
    return "\n".join(parts)


class Handler(BaseHTTPRequestHandler):
    """Routes of the SGLang HTTP server that deployments and readiness gates use."""

    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    state: EngineState  # set on the subclass by make_server

    def setup(self) -> None:
        super().setup()
        # uvicorn (asyncio) sends with TCP_NODELAY: a streamed chunk leaves at once, not after the peer's delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- plumbing ---------------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # BaseHTTPRequestHandler's name
        return

    def _access(self, code: int) -> None:
        phrase = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error",
                  503: "Service Unavailable"}.get(code, "")
        if self.state.log:
            self.state.log(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - '
                           f'"{self.command} {self.path} HTTP/1.1" {code} {phrase}')

    def _send(self, code: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self._access(code)

    def _json(self, code: int, payload: Any) -> None:
        self._send(code, json.dumps(payload).encode())

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            self._json(400, {"object": "error", "message": f"expected a JSON body, found invalid JSON: {e}",
                             "type": "BadRequestError", "param": None, "code": 400})
            return None
        if not isinstance(data, dict):
            self._json(400, {"object": "error", "message": "expected a JSON object body",
                             "type": "BadRequestError", "param": None, "code": 400})
            return None
        return data

    # -- routes -------------------------------------------------------------------------------------
    def _refused(self, path: str) -> bool:
        """Answer 401 as SGLang's API-key middleware does (before routing, so unknown paths too) when the request
        lacks the key; the request's body is read first, so the connection stays usable."""
        if authorized(self.command, path, self.headers.get("Authorization"), self.state.api_key):
            return False
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self._send(401, b'{"error":"Unauthorized"}')
        return True

    def do_GET(self) -> None:  # http.server's naming
        path = self.path.split("?", 1)[0]
        if self._refused(path):
            return
        ready = self.state.ready.is_set()
        if path in ("/health", "/health_generate", "/ready"):
            self._send(200 if ready else 503, content_type="text/plain")
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [self._card(self.state.served_model_name)]})
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name != self.state.served_model_name:
                self._json(404, {"error": {"message": f"The model '{name}' does not exist",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}})
            else:
                self._json(200, self._card(name))
        elif path in ("/server_info", "/get_server_info"):
            self._json(200, self.state.server_info)
        elif path in ("/model_info", "/get_model_info"):
            self._json(200, self.state.model_info)
        elif path == "/metrics" and self.state.metrics is not None:
            with self.state.lock:
                in_flight = self.state.in_flight
            self._send(200, self.state.metrics.exposition(in_flight).encode(), content_type=METRICS_CONTENT_TYPE)
        elif path == "/v1/loads":
            self._loads(urllib.parse.parse_qs(self.path.partition("?")[2]))
        else:
            self._json(404, {"detail": "Not Found"})

    def _loads(self, query: dict[str, list[str]]) -> None:
        info, metrics = self.state.server_info, self.state.metrics
        scheduler = (info.get("internal_states") or [{}])[0]
        with self.state.lock:
            in_flight = self.state.in_flight
        spec = None
        if self.state.num_draft_tokens:
            spec = (metrics.spec_accept_length, metrics.spec_accept_rate) if metrics is not None else (0.0, 0.0)
        queue = loads.Queue(in_flight=in_flight, max_running_requests=int(scheduler.get("max_running_requests") or 0),
                            max_total_num_tokens=int(scheduler.get("max_total_num_tokens") or 0),
                            gen_throughput=metrics.gen_throughput if metrics is not None else 0.0, spec=spec)
        status, body, content_type = loads.answer(query, queue, str(info.get("version", "")),
                                                  int(info.get("tp_size") or 1) * int(info.get("pp_size") or 1),
                                                  self.state.accelerator)
        if isinstance(body, str):
            self._send(status, body.encode(), content_type=content_type)
        else:
            self._json(status, body)

    def do_POST(self) -> None:  # http.server's naming
        path = self.path.split("?", 1)[0]
        if self._refused(path):
            return
        if path not in ("/generate", "/v1/chat/completions", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        body = self._body()
        if body is None:
            return
        if self.state.fail_generate:
            self._json(500, {"error": {"message": "lab stand-in: generation fails because "
                                                  "SGLANG_STANDIN_FAIL_GENERATE is set", "code": 500}})
            return
        started = time.monotonic()
        with self.state.lock:
            self.state.in_flight += 1
            running = self.state.in_flight
        try:
            if self.state.crash_under_load and running >= self.state.crash_under_load and self.state.crash:
                self.state.crash(running)
            if path == "/generate":
                self._generate(body, started)
            elif path == "/v1/chat/completions":
                prompt = _prompt_of_messages(body.get("messages") or [])
                self._openai(body, prompt, started, chat=True)
            else:
                self._openai(body, str(body.get("prompt", "")), started, chat=False)
        finally:
            with self.state.lock:
                self.state.in_flight -= 1

    def _chat_stream(self, body: dict[str, Any], prompt: str, started: float, sampling: dict[str, Any],
                     finish: tuple[str, Any]) -> None:
        """serving_chat.py _generate_chat_stream of 0.5.23, as uvicorn sends it (chunked): the role chunk, one
        content chunk per decode step, the finish chunk, the sglext chunk (return_spec_tokens_details), the usage
        chunk (stream_options.include_usage) and [DONE]."""
        result, steps = decoded(self.state, prompt, sampling)
        meta, created = result["meta_info"], int(time.time())
        model = body.get("model") or self.state.served_model_name
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def send(event: bytes) -> None:
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()

        send(_sse(chat_chunk(meta["id"], created, model, {"role": "assistant", "content": ""})))
        for delta in step_deltas(result["text"], steps):
            time.sleep(self.state.step_time)
            send(_sse(chat_chunk(meta["id"], created, model, {"content": delta})))
        finished(self.state, result, started)
        send(_sse(chat_chunk(meta["id"], created, model, {}, finish_reason=finish[0], matched_stop=finish[1])))
        details = spec_tokens_details(meta) if body.get("return_spec_tokens_details") else None
        if details:
            send(_sse(response_chunk(meta["id"], created, model, sglext={"spec_tokens_details": details})))
        if (body.get("stream_options") or {}).get("include_usage"):
            send(_sse(response_chunk(meta["id"], created, model, usage=usage_info(meta))))
        send(b"data: [DONE]\n\n")
        send(b"")  # the last chunk of a chunked body
        self._access(200)

    def _card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": name, "parent": None, "max_model_len": self.state.context_length}

    def _generate(self, body: dict[str, Any], started: float) -> None:
        text = body.get("text")
        if text is None and body.get("input_ids") is not None:
            text = json.dumps(body["input_ids"])
        if text is None:
            self._json(400, {"error": {"message": "Either text, input_ids or input_embeds should be provided."}})
            return
        sampling = body.get("sampling_params") or {}
        if isinstance(text, list):
            out: Any = [generate_one(self.state, str(t), sampling, started) for t in text]
        else:
            out = generate_one(self.state, str(text), sampling, started)
        if body.get("stream"):
            chunks = out if isinstance(out, list) else [out]
            payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            self._send(200, payload.encode(), content_type="text/event-stream")
        else:
            self._json(200, out)

    def _openai(self, body: dict[str, Any], prompt: str, started: float, chat: bool) -> None:
        if chat and body.get("return_meta_info") and body.get("stream"):  # serving_chat.py, as a BadRequest
            self._json(400, {"object": "error", "message": "return_meta_info is not supported with streaming. "
                             "Please set stream=false when using return_meta_info=true.", "type": "BadRequest",
                             "param": None, "code": 400})
            return
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        finish = "length" if limit else "stop"
        matched = None if limit else self.state.eos_token_id
        if chat and body.get("stream"):
            self._chat_stream(body, prompt, started, {"max_new_tokens": limit or 32}, (finish, matched))
            return
        result = generate_one(self.state, prompt, {"max_new_tokens": limit or 32}, started)
        meta = result["meta_info"]
        usage = usage_info(meta)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result["text"].strip(),
                                              "reasoning_content": None},  # ChatMessage drops tool_calls: None
                      "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            if body.get("return_meta_info"):  # chat only: CompletionResponseChoice has no meta_info
                choice["meta_info"] = meta
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": result["text"], "logprobs": None, "finish_reason": finish,
                      "matched_stop": matched}
            obj = "text_completion"
        response: dict[str, Any] = {"id": meta["id"], "object": obj, "created": int(time.time()),
                                    "model": body.get("model") or self.state.served_model_name,
                                    "choices": [choice], "usage": usage, "metadata": {"weight_version": "default"}}
        details = spec_tokens_details(meta) if body.get("return_spec_tokens_details") else None
        if details:
            response["sglext"] = {"spec_tokens_details": details}
        self._json(200, response)


def make_server(host: str, port: int, state: EngineState) -> ThreadingHTTPServer:
    """A threading HTTP server bound to host:port with handlers reading `state`."""
    handler = type("StandinHandler", (Handler,), {"state": state})
    return StandinHTTPServer((host, port), handler)


class StandinHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that re-binds a port in TIME_WAIT (as uvicorn does) and never blocks exit."""

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 2048  # uvicorn's backlog (http.server's 5 resets concurrent connects)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line for a client that does not speak TLS to an HTTPS stand-in (as uvicorn logs it), else a trace."""
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError | ConnectionError):
            print(f"WARNING:  Invalid HTTP request received from {client_address[0]}: {error}", flush=True)
            return
        super().handle_error(request, client_address)

