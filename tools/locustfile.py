"""The load client of the gateway's lab tests and `make bench-serve` (Locust, headless): OpenAI chat completions at
the endpoint under test, each answer checked (HTTP 200 and a completion with tokens). Bounded by the caller
(users, run time, a SIGTERM when its deploy ends) and pointed at loopback or the lab's own addresses only.
    locust -f tools/locustfile.py --headless -u 8 -r 8 -t 60s --host http://127.0.200.1:30000 --json
"""

from __future__ import annotations

import os

from locust import FastHttpUser, constant, task

MODEL = os.environ.get("LOAD_MODEL", "Qwen3.6-27B")
MAX_TOKENS = int(os.environ.get("LOAD_MAX_TOKENS", "16"))


class ChatUser(FastHttpUser):
    wait_time = constant(0)
    # One request at a time per user, each with its own deadline: a stalled request is a failure, never a hang.
    network_timeout = 60.0
    connection_timeout = 10.0

    @task
    def chat(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Write one line about GPUs."}],
                "max_tokens": MAX_TOKENS, "temperature": 0}
        with self.client.post("/v1/chat/completions", json=body, name="chat", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            try:
                answer = response.json()
                tokens = int(answer["usage"]["completion_tokens"])
            except (ValueError, KeyError, TypeError) as exc:
                response.failure(f"not a chat completion: {exc}")
                return
            if tokens < 1 or not answer["choices"][0]["message"]["content"]:
                response.failure("an empty completion")
