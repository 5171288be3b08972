"""A local OpenAI-compatible chat server for LLM tests (127.0.0.1, ephemeral port, started and
stopped by the test). Replies in DSPy's chat-adapter format, chosen by what the request asks for."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def chat_reply(**fields: Any) -> str:
    """A DSPy ChatAdapter completion with the given output fields."""
    parts = []
    for k, v in fields.items():
        parts.append(f"[[ ## {k} ## ]]\n{v if isinstance(v, str) else json.dumps(v)}")
    return "\n\n".join(parts) + "\n\n[[ ## completed ## ]]"


def kind_of(body: dict[str, Any]) -> str:
    system = " ".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system")
    if "next_tool_name" in system:
        return "step"
    if "polish_plan" in system:
        return "plan"
    if "best_config" in system:
        return "extract"
    return "other"


def replay(answers: list[dict[str, Any]]) -> Callable[[str, dict], str]:
    """A script answering each request kind with the next recorded answer of that kind (cycling).

    ``answers``: ``[{"kind": "plan" | "step" | "extract", "content": "..."}]`` in recorded order."""
    by_kind: dict[str, list[str]] = {}
    for a in answers:
        by_kind.setdefault(a["kind"], []).append(a["content"])
    served: dict[str, int] = {}

    def script(kind: str, body: dict) -> str:
        pool = by_kind.get(kind) or by_kind.get("step") or [chat_reply()]
        i = served.get(kind, 0)
        served[kind] = i + 1
        return pool[i % len(pool)]
    return script


class FakeOpenAI:
    """``with FakeOpenAI(script) as srv:`` -> ``srv.url``; ``script(kind, body) -> reply text``.

    ``delay_s`` makes every reply late (timeouts); ``status``/``error`` make it an HTTP error.
    Every request (path, headers, body) is kept in ``requests``.
    """

    def __init__(self, script: Callable[[str, dict], str] | None = None, *, delay_s: float = 0.0,
                 status: int = 200, error: str = "") -> None:
        self.script = script or (lambda kind, body: chat_reply())
        self.delay_s, self.status, self.error = delay_s, status, error
        self.requests: list[tuple[str, dict[str, str], dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                outer.requests.append((self.path, dict(self.headers), body))
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if outer.status != 200:
                    data = json.dumps({"error": {"message": outer.error, "type": "invalid_request_error"}}).encode()
                else:
                    text = outer.script(kind_of(body), body)
                    data = json.dumps({
                        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body.get("model"),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                try:
                    self.send_response(outer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
