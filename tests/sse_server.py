"""A local OpenAI-compatible chat-completions server that streams (server-sent events), for the
streaming tests: a ThreadingHTTPServer on 127.0.0.1 (port 0), its replies scripted by the test.

Each request is answered with the next `Stream` of the script (the last one repeats): its
`pieces` as `chat.completion.chunk` events, `delay_s` apart, then a chunk with `usage` and
`data: [DONE]`. `cut_after` closes the connection after that many pieces, mid-reply, as a
server or a proxy dropping it would. Every request body is kept in `received`.
"""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Stream:
    pieces: list[str]
    delay_s: float = 0.0
    cut_after: int | None = None
    #: tool calls, each streamed as fragments: its id and name first, then its arguments in halves
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 7, "completion_tokens": 5,
                                                           "total_tokens": 12})


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "stream-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class StreamServer:
    def __init__(self) -> None:
        self.script: list[Stream] = [Stream(["ok"])]
        self.received: list[Any] = []
        #: pieces written so far, per request (a test waits on them)
        self.written: list[int] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def event(self, data: Any) -> None:
                text = data if isinstance(data, str) else json.dumps(data)
                payload = f"data: {text}\n\n".encode()
                # chunked transfer encoding: one chunk per event
                self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
                self.wfile.flush()

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server.lock:
                    server.received.append(json.loads(raw))
                    stream = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                    server.written.append(0)
                    mine = len(server.written) - 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    self.event(chunk({"role": "assistant", "content": ""}))
                    for n, piece in enumerate(stream.pieces):
                        if stream.cut_after is not None and n >= stream.cut_after:
                            self.close_connection = True
                            self.connection.shutdown(2)  # mid-reply: no terminating chunk
                            return
                        if stream.delay_s:
                            time.sleep(stream.delay_s)
                        self.event(chunk({"content": piece}))
                        with server.lock:
                            server.written[mine] += 1
                    for i, call in enumerate(stream.tool_calls):
                        arguments = json.dumps(call["arguments"])
                        half = len(arguments) // 2
                        opening = {"index": i, "id": call["id"], "type": "function",
                                   "function": {"name": call["name"], "arguments": ""}}
                        self.event(chunk({"tool_calls": [opening]}))
                        for part in (arguments[:half], arguments[half:]):
                            self.event(chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
                    self.event(chunk({}, "tool_calls" if stream.tool_calls else "stop"))
                    self.event({**chunk({}), "choices": [], "usage": stream.usage})
                    self.event("[DONE]")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass  # the client left (a killed worker)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def reply(self, *streams: Stream) -> None:
        with self.lock:
            self.script = list(streams)


@contextmanager
def stream_server() -> Iterator[StreamServer]:
    server = StreamServer()
    thread = threading.Thread(target=server.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
