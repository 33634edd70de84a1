"""A local OTLP/HTTP traces receiver for the tracing tests: what the processes export arrives
here, is decoded with the OpenTelemetry protocol's own messages (opentelemetry-proto), and is
appended to a JSON-lines file outside the system under test."""

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def spans_of(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(Span(str(resource.get("service.name")), s.name, s.trace_id.hex(), s.span_id.hex(),
                                s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano,
                                {a.key: _value(a.value) for a in s.attributes}))
    return out


class Receiver:
    def __init__(self, log: Path):
        self.log = log
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                spans = spans_of(body)
                with receiver.lock, receiver.log.open("a") as out:
                    receiver.requests += 1
                    for span in spans:
                        out.write(json.dumps(span.__dict__) + "\n")
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"

    def spans(self) -> list[Span]:
        if not self.log.exists():
            return []
        return [Span(**json.loads(line)) for line in self.log.read_text().splitlines()]

    def wait(self, done: Callable[[list[Span]], bool], timeout: float = 20) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(spans := self.spans()):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"spans received: {[(s.service, s.name) for s in self.spans()]}")


@contextmanager
def otlp_receiver(log: Path) -> Iterator[Receiver]:
    receiver = Receiver(log)
    thread = threading.Thread(target=receiver.httpd.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.httpd.shutdown()
        receiver.httpd.server_close()
