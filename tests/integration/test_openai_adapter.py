"""OpenAICompatible against a real local HTTP server that speaks chat completions.

The server (a ThreadingHTTPServer on 127.0.0.1, port 0) records every request it gets —
path, headers, JSON body — and answers from a script the test sets: no mocked client.
"""

import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from parley.dispatcher.core import Cancel, Enqueue
from parley.dispatcher.enqueue import Outbox
from parley.runtime.metrics import REGISTRY
from parley.schemas.deltas import TTL_S as DELTAS_TTL_S
from parley.schemas.deltas import Delta, delta_of
from parley.schemas.jobs import JobKind, job_id
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.workers import jobs
from parley.workers.app import App
from parley.workers.jobs import check_response
from parley.workers.llm import LLMError, LLMTimeoutError, OpenAICompatible
from parley.workers.llm.openai_compat import NO_RESULT
from parley.workers.streaming import DeltaSink, streaming
from parley.workers.worker import make_worker
from tests.integration.conftest import RESULTS
from tests.sse_server import Stream, StreamServer, stream_server

API_KEY = "sk-test-secret-123"


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # a dict is sent as JSON, a str as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class FakeServer:
    """Replies pop from `script` in order; the last one repeats when the script runs out."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.received: list[Received] = []
        # when each client closed its connection while its answer was being "generated"
        self.disconnects: list[float] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def generate(self, seconds: float) -> bool:
                """Take `seconds` to answer, watching the connection like a provider does:
                False (and the time noted in `disconnects`) as soon as the client closes it."""
                until = time.monotonic() + seconds
                while not fake.stopping.is_set() and time.monotonic() < until:
                    readable, _, _ = select.select([self.connection], [], [], 0.01)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        with fake.lock:
                            fake.disconnects.append(time.monotonic())
                        return False
                return True

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                with fake.lock:
                    fake.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                  body))
                    reply = fake.script.pop(0) if len(fake.script) > 1 else fake.script[0]
                if self.path != "/v1/chat/completions":
                    reply = Reply(404, {"error": {"message": f"no route {self.path}"}})
                if reply.delay and not self.generate(reply.delay):
                    return  # the client left: a provider stops generating here
                payload = (reply.body if isinstance(reply.body, str)
                           else json.dumps(reply.body)).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up (a timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    def reply(self, *replies: Reply) -> None:
        self.script = list(replies)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.received]


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.thread.start()
    yield fake
    fake.stopping.set()
    fake.httpd.shutdown()
    fake.httpd.server_close()


def model(server: FakeServer, **kwargs: Any) -> OpenAICompatible:
    kwargs.setdefault("model", "test-model")
    kwargs.setdefault("api_key", API_KEY)
    kwargs.setdefault("backoff_base", 0.001)
    kwargs.setdefault("max_backoff", 0.01)
    kwargs.setdefault("timeout", 5)
    return OpenAICompatible(base_url=server.base_url, **kwargs)


def completion(content: str | None = "ok", tool_calls: list[dict[str, Any]] | None = None,
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": usage if usage is not None else {"prompt_tokens": 10, "completion_tokens": 2,
                                                      "total_tokens": 12}}


def fn_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SEND_EMAIL = {"name": "send_email", "description": "Send an email.",
              "parameters": {"type": "object", "properties": {"to": {"type": "string"},
                                                              "body": {"type": "string"}},
                             "required": ["to", "body"]}}
LOOKUP = {"name": "lookup", "description": "",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}

# A branch as Parley sends it: the decision of call-1's tool.execute appended an assistant
# `message` before the tool results came back, and call-2's result landed before call-1's.
BRANCH: list[dict[str, Any]] = [
    {"id": "msg-1", "parent_id": None, "role": "user", "content": "Email bob and look up Friday."},
    {"id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "",
     "tool_calls": [{"id": "call-1", "name": "send_email", "arguments": {"to": "bob", "body": "hi"}},
                    {"id": "call-2", "name": "lookup", "arguments": {"q": "Friday"}}]},
    {"id": "msg-3", "parent_id": "msg-2", "role": "assistant", "content": "Asking for confirmation."},
    {"id": "msg-4", "parent_id": "msg-3", "role": "tool", "tool_call_id": "call-2",
     "content": "{\"date\":\"2024-05-03\"}"},
    {"id": "msg-5", "parent_id": "msg-4", "role": "tool", "tool_call_id": "call-1",
     "content": "declined", "error": True},
    {"id": "msg-6", "parent_id": "msg-5", "role": "assistant", "content": "Not sent. Friday is May 3."},
    {"id": "msg-7", "parent_id": "msg-6", "role": "user", "content": "Thanks"},
]


def test_request_body_and_headers(server: FakeServer) -> None:
    server.reply(Reply(body=completion("You're welcome.")))
    llm = model(server)
    llm({"messages": BRANCH, "tools": [SEND_EMAIL, LOOKUP], "model": "override-model",
         "params": {"temperature": 0.2, "max_tokens": 50}})

    [got] = server.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == f"Bearer {API_KEY}"
    assert got.headers["content-type"] == "application/json"
    body = got.body
    assert body["model"] == "override-model"
    assert body["temperature"] == 0.2 and body["max_tokens"] == 50
    assert "stream" not in body
    assert body["messages"] == [
        {"role": "user", "content": "Email bob and look up Friday."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function",
             "function": {"name": "send_email", "arguments": "{\"to\": \"bob\", \"body\": \"hi\"}"}},
            {"id": "call-2", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"q\": \"Friday\"}"}}]},
        # the tool messages directly after their assistant message, in the order of its calls
        {"role": "tool", "tool_call_id": "call-1", "content": "Error: declined"},
        {"role": "tool", "tool_call_id": "call-2", "content": "{\"date\":\"2024-05-03\"}"},
        # then what sat between, in its order
        {"role": "assistant", "content": "Asking for confirmation."},
        {"role": "assistant", "content": "Not sent. Friday is May 3."},
        {"role": "user", "content": "Thanks"},
    ]
    for call in body["messages"][1]["tool_calls"]:
        json.loads(call["function"]["arguments"])
    assert body["tools"] == [
        {"type": "function", "function": SEND_EMAIL},
        {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP["parameters"]}},
    ]


def test_defaults_no_tools_key_and_model_from_constructor(server: FakeServer) -> None:
    server.reply(Reply(body=completion()))
    model(server)({"messages": [{"id": "msg-1", "parent_id": None, "role": "user", "content": "hi"}],
                   "tools": []})
    body = server.received[0].body
    assert body == {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


def test_instructions_are_the_system_message_the_requests_own_first(server: FakeServer) -> None:
    """Issue 32: no system prompt anywhere. The constructor's `instructions`, or the request's
    (an app's `instructions`, which a worker adds to each request), go first as `system`."""
    hi = [{"id": "msg-1", "parent_id": None, "role": "user", "content": "hi"}]
    for _ in range(3):
        server.reply(Reply(body=completion()))
    model(server, instructions="Be terse.")({"messages": hi, "tools": []})
    model(server, instructions="Be terse.")({"messages": hi, "tools": [], "instructions": "Be kind."})
    model(server)({"messages": hi, "tools": []})
    assert [r.body["messages"] for r in server.received] == [
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "hi"}]]


def test_an_apps_instructions_come_with_each_model_request_in_a_worker(llm_worker: "LlmWorker") -> None:
    seen: list[dict[str, Any]] = []

    def llm(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return {"content": "ok"}

    llm_worker.enqueue()
    llm_worker.run(llm, instructions="You approve expenses.")
    assert [r.get("instructions") for r in seen] == ["You approve expenses."]
    assert llm_worker.outcomes()[0].ok


def test_config_from_environment(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_LLM_BASE_URL", server.base_url + "/")
    monkeypatch.setenv("PARLEY_LLM_MODEL", "env-model")
    monkeypatch.delenv("PARLEY_LLM_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    server.reply(Reply(body=completion()))
    llm = OpenAICompatible()
    assert llm.timeout == 60 and llm.max_retries == 4
    llm({"messages": [], "tools": []})
    assert server.received[0].body["model"] == "env-model"
    assert server.received[0].headers["authorization"] == "Bearer sk-fallback"
    assert "sk-fallback" not in repr(llm)

    monkeypatch.setenv("PARLEY_LLM_API_KEY", "sk-parley")
    OpenAICompatible()({"messages": [], "tools": []})
    assert server.received[1].headers["authorization"] == "Bearer sk-parley"


def test_no_model_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_LLM_MODEL", raising=False)
    with pytest.raises(LLMError, match="no model"):
        OpenAICompatible(base_url="http://127.0.0.1:9/v1")({"messages": [], "tools": []})


def test_missing_tool_result_gets_a_placeholder(server: FakeServer) -> None:
    server.reply(Reply(body=completion()))
    messages = [BRANCH[0], BRANCH[1], BRANCH[4]]  # call-2's result is not in the branch
    model(server)({"messages": messages, "tools": []})
    sent = server.received[0].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert sent[2] == {"role": "tool", "tool_call_id": "call-1", "content": "Error: declined"}
    assert sent[3] == {"role": "tool", "tool_call_id": "call-2", "content": NO_RESULT}


def test_response_mapping(server: FakeServer) -> None:
    server.reply(Reply(body=completion(None, [fn_call("call_abc", "send_email",
                                                      "{\"to\": \"bob@example.com\", \"body\": \"hi\"}"),
                                              fn_call("call_def", "lookup", "")],
                                       usage={"prompt_tokens": 30, "completion_tokens": 7,
                                              "total_tokens": 37})))
    response = model(server)({"messages": BRANCH[:1], "tools": [SEND_EMAIL, LOOKUP]})
    assert response == {
        "content": "",
        "tool_calls": [{"id": "call_abc", "name": "send_email",
                        "arguments": {"to": "bob@example.com", "body": "hi"}},
                       {"id": "call_def", "name": "lookup", "arguments": {}}],
        # the total (what budgets count) and the split, when the server gives it (traces)
        "usage": {"tokens": 37, "input_tokens": 30, "output_tokens": 7},
    }
    assert check_response(response) == response  # what Parley's LLM job accepts


def test_plain_reply_and_usage_without_total(server: FakeServer) -> None:
    server.reply(Reply(body=completion("Hello there.", usage={"prompt_tokens": 4, "completion_tokens": 3})))
    assert model(server)({"messages": BRANCH[:1], "tools": []}) == {
        "content": "Hello there.", "tool_calls": [],
        "usage": {"tokens": 7, "input_tokens": 4, "output_tokens": 3}}


def test_invalid_tool_call_arguments_raise(server: FakeServer) -> None:
    server.reply(Reply(body=completion(None, [fn_call("c1", "send_email", "{\"to\": \"bob\", ")])))
    with pytest.raises(LLMError, match=r"tool call 'send_email': arguments are not valid JSON"):
        model(server)({"messages": BRANCH[:1], "tools": [SEND_EMAIL]})
    server.reply(Reply(body=completion(None, [fn_call("c1", "send_email", "[1, 2]")])))
    with pytest.raises(LLMError, match="must be a JSON object"):
        model(server)({"messages": BRANCH[:1], "tools": [SEND_EMAIL]})


def test_retries_500_then_succeeds(server: FakeServer) -> None:
    server.reply(Reply(500, {"error": {"message": "boom"}}), Reply(503, "unavailable"),
                 Reply(body=completion("finally")))
    assert model(server, max_retries=4)({"messages": BRANCH[:1], "tools": []})["content"] == "finally"
    assert len(server.received) == 3
    assert server.bodies()[0] == server.bodies()[2]  # the same request each time


def test_retries_429_with_retry_after(server: FakeServer) -> None:
    server.reply(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0"}),
                 Reply(body=completion("ok")))
    assert model(server)({"messages": BRANCH[:1], "tools": []})["content"] == "ok"
    assert len(server.received) == 2


def test_retry_after_is_capped(server: FakeServer) -> None:
    server.reply(Reply(429, "{}", headers={"Retry-After": "120"}), Reply(body=completion("ok")))
    started = time.monotonic()
    assert model(server, max_backoff=0.05)({"messages": BRANCH[:1], "tools": []})["content"] == "ok"
    assert time.monotonic() - started < 2


def test_backoff_is_full_jitter_and_capped() -> None:
    llm = OpenAICompatible(model="m", base_url="http://127.0.0.1:9/v1", backoff_base=0.5, max_backoff=3)
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 3.0), (10, 3.0)]:
        delays = [llm.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2  # spread over the range, not a fixed step


def test_gives_up_after_max_retries(server: FakeServer) -> None:
    server.reply(Reply(502, "<html>Bad gateway</html>"))
    with pytest.raises(LLMError, match=r"HTTP 502 after 3 attempt\(s\): <html>Bad gateway</html>") as info:
        model(server, max_retries=2)({"messages": BRANCH[:1], "tools": []})
    assert info.value.status == 502
    assert len(server.received) == 3


def test_400_is_not_retried_and_the_key_is_not_echoed(server: FakeServer) -> None:
    server.reply(Reply(400, {"error": {"message": f"bad request from key {API_KEY}: messages invalid"}}))
    with pytest.raises(LLMError, match="HTTP 400") as info:
        model(server)({"messages": BRANCH[:1], "tools": []})
    assert len(server.received) == 1
    assert "messages invalid" in str(info.value)
    assert API_KEY not in str(info.value) and API_KEY not in repr(model(server))


def test_timeout_raises_after_retries(server: FakeServer) -> None:
    server.reply(Reply(body=completion(), delay=2))
    started = time.monotonic()
    with pytest.raises(LLMTimeoutError, match=r"no answer within 0.2 s .*2 attempt\(s\)"):
        model(server, timeout=0.2, max_retries=1)({"messages": BRANCH[:1], "tools": []})
    assert time.monotonic() - started < 1.5
    assert len(server.received) == 2


def test_connection_refused_is_retried_then_raises() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = OpenAICompatible(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2,
                           backoff_base=0.001, max_backoff=0.01)
    with pytest.raises(LLMError, match=r"connection failed .*3 attempt\(s\)"):
        llm({"messages": [], "tools": []})


def test_a_body_that_is_not_a_completion_raises(server: FakeServer) -> None:
    server.reply(Reply(200, "not json"))
    with pytest.raises(LLMError, match="not JSON"):
        model(server)({"messages": BRANCH[:1], "tools": []})
    server.reply(Reply(200, {"error": {"message": "quota"}}))
    with pytest.raises(LLMError, match=r"no choices.*quota"):
        model(server)({"messages": BRANCH[:1], "tools": []})


# ---- the time limit covers the retries ---------------------------------------------------------


def test_retries_stop_at_the_total_time_limit(server: FakeServer) -> None:
    """Retries and their waits stay inside `total_timeout`: the last error is raised when no
    time is left for another attempt, instead of running on past the limit."""
    server.reply(Reply(503, "overloaded", headers={"Retry-After": "0.4"}))
    # 3 s leave room for several 0.4 s waits even when a loaded box slows each attempt (with
    # 1.5 s, a whole `make test` on 2 cores once left time for one attempt only)
    llm = model(server, timeout=5, max_retries=50, max_backoff=1, total_timeout=3)
    started = time.monotonic()
    with pytest.raises(LLMError, match=r"HTTP 503 after \d attempt\(s\), stopped by the time limit of "
                                       r"3 s: overloaded") as info:
        llm({"messages": BRANCH[:1], "tools": []})
    assert time.monotonic() - started <= 3
    assert 2 <= len(server.received) <= 8 and info.value.status == 503


def test_an_attempt_is_cut_to_the_time_left(server: FakeServer) -> None:
    server.reply(Reply(body=completion(), delay=5))
    llm = model(server, timeout=30, max_retries=3, total_timeout=0.8)
    started = time.monotonic()
    with pytest.raises(LLMTimeoutError, match=r"no answer within 0.8 s .*1 attempt\(s\), stopped by the "
                                              r"time limit of 0.8 s"):
        llm({"messages": BRANCH[:1], "tools": []})
    assert time.monotonic() - started < 1.5
    assert len(server.received) == 1


def test_total_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="total_timeout"):
        OpenAICompatible(model="m", total_timeout=0)


@pytest.fixture
def llm_worker(r: redis.Redis, monkeypatch: pytest.MonkeyPatch, restore_signals: None) -> "LlmWorker":
    monkeypatch.setattr(jobs, "_worker_id", "w-llm")
    monkeypatch.setattr(jobs, "_app", None)
    return LlmWorker(r, monkeypatch)


@dataclass
class LlmWorker:
    """LLM jobs enqueued exactly as a dispatcher's outbox does, run by an in-process ParleyWorker
    (its lean path) whose app's model is the one given."""

    r: redis.Redis
    monkeypatch: pytest.MonkeyPatch

    def enqueue(self, work: str = "llm-1", timeout: int = 30) -> str:
        job = Enqueue(seq=1, job=JobKind.LLM, work=work, attempt=1, timeout=timeout, reply_to=RESULTS,
                      app=None, args={"request": {"messages": BRANCH[:1]}})
        Outbox(self.r, Keys()).flush_many([("s-llm", [job])])
        return job_id("s-llm", work, 1)

    def run(self, llm: Any, instructions: str | None = None) -> None:
        self.monkeypatch.setattr(jobs, "_app", App(spec="adapter", llm=llm, instructions=instructions))
        make_worker(["llm"], self.r).work(burst=True)

    def outcomes(self) -> list[WorkOutcome]:
        return [WorkOutcome.model_validate_json(f[b"outcome"]) for _id, f in self.r.xrange(RESULTS)]


def test_in_a_worker_retries_stop_inside_the_jobs_time_limit(server: FakeServer,
                                                             llm_worker: LlmWorker) -> None:
    """The model time limit (`--llm-timeout`, the job's RQ timeout) bounds the call with its retries:
    the adapter stops retrying in time to report its own error, rather than being cut off as a
    bare `timeout` with far more attempts than the limit allows."""
    server.reply(Reply(503, "overloaded", headers={"Retry-After": "0.5"}))
    llm_worker.enqueue(timeout=3)
    llm_worker.run(model(server, timeout=60, max_retries=100, max_backoff=1))
    [outcome] = llm_worker.outcomes()
    assert outcome.ok is False and outcome.error is not None
    assert outcome.error.startswith(f"LLMError: {server.base_url}/chat/completions: HTTP 503 after ")
    assert "stopped by the time limit" in outcome.error
    assert len(server.received) <= 6


# ---- a voided call is stopped ------------------------------------------------------------------


def void(r: redis.Redis, work: str = "llm-1") -> float:
    """What a dispatcher does when a park voids the call (the outbox's Cancel effect); when."""
    Outbox(r, Keys()).flush_many([("s-llm", [Cancel(seq=2, job=JobKind.LLM, work=work, attempt=1)])])
    return time.monotonic()


def void_when(r: redis.Redis, ready: Callable[[], bool]) -> list[float]:
    """Void llm-1 from another thread (the worker runs in this one) once `ready()`; returns a list
    that gets the time of the void."""
    voided: list[float] = []

    def run() -> None:
        deadline = time.monotonic() + 10
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        voided.append(void(r))

    threading.Thread(target=run, daemon=True).start()
    return voided


def stopped_jobs() -> float:
    return REGISTRY.get_sample_value("parley_jobs_total", {"kind": "llm", "outcome": "stopped"}) or 0.0


def test_in_a_worker_a_voided_call_is_stopped_and_its_connection_closed(
        server: FakeServer, llm_worker: LlmWorker, r: redis.Redis) -> None:
    """The park that voids a call reaches the worker running it: the worker stops the call, the
    server sees the connection closed (a provider stops generating, and billing, there), and the
    worker posts nothing and is free for its next job."""
    server.reply(Reply(body=completion("too late"), delay=20))
    jid = llm_worker.enqueue()
    before = stopped_jobs()
    voided = void_when(r, lambda: len(server.received) == 1)
    llm_worker.run(model(server, timeout=30))
    returned = time.monotonic()
    assert len(voided) == 1 and len(server.disconnects) == 1
    assert server.disconnects[0] - voided[0] < 1.0  # closed within a second of the park
    assert returned - voided[0] < 2.0  # not after the 20 s the answer would have taken
    assert llm_worker.outcomes() == [] and len(server.received) == 1
    assert r.hlen("parley:running") == 0 and r.hlen("parley:inflight") == 0 and r.exists(f"rq:job:{jid}") == 0
    assert stopped_jobs() == before + 1


def test_in_a_worker_a_call_voided_while_it_waits_to_retry_is_not_retried(
        server: FakeServer, llm_worker: LlmWorker, r: redis.Redis) -> None:
    server.reply(Reply(503, "overloaded", headers={"Retry-After": "5"}))
    llm_worker.enqueue()
    voided = void_when(r, lambda: len(server.received) == 1)
    llm_worker.run(model(server, timeout=30, max_retries=3, max_backoff=5))
    assert len(voided) == 1 and time.monotonic() - voided[0] < 2.0  # not after the 5 s wait
    assert len(server.received) == 1 and llm_worker.outcomes() == []


def test_in_a_worker_an_app_llm_that_is_plain_python_is_stopped_too(
        llm_worker: LlmWorker, r: redis.Redis) -> None:
    """Any `llm`, not only OpenAICompatible: the call is interrupted where it is."""
    ran_to_the_end: list[bool] = []

    def slow_llm(request: dict[str, Any]) -> dict[str, Any]:
        time.sleep(20)
        ran_to_the_end.append(True)
        return {"content": "too late", "tool_calls": []}

    llm_worker.enqueue()
    voided = void_when(r, lambda: r.hlen("parley:running") == 1)
    llm_worker.run(slow_llm)
    assert len(voided) == 1 and time.monotonic() - voided[0] < 2.0
    assert ran_to_the_end == [] and llm_worker.outcomes() == [] and r.hlen("parley:running") == 0


def test_in_a_worker_a_call_not_voided_is_left_alone(server: FakeServer, llm_worker: LlmWorker,
                                                     r: redis.Redis) -> None:
    server.reply(Reply(body=completion("in time"), delay=1.0))
    llm_worker.enqueue()
    llm_worker.run(model(server, timeout=30))
    assert [(o.ok, o.value["content"]) for o in llm_worker.outcomes()] == [(True, "in time")]
    assert server.disconnects == []


# ---- streaming (stream=True) -------------------------------------------------------------------


@pytest.fixture
def streamer() -> Iterator[StreamServer]:
    with stream_server() as s:
        yield s


def stream_model(s: StreamServer, **kwargs: Any) -> OpenAICompatible:
    return OpenAICompatible(base_url=s.base_url, model="stream-model", stream=True, backoff_base=0.001,
                            max_backoff=0.01, timeout=5, **kwargs)


def collected(llm: OpenAICompatible, request: dict[str, Any]) -> tuple[dict[str, Any], list[Delta]]:
    writes: list[Delta] = []
    every_piece = itertools.count(0.0, 1.0).__next__  # a clock that flushes each piece
    with streaming(DeltaSink(call_id="llm-1", attempt=1, write=writes.extend, clock=every_piece)):
        reply = check_response(llm(request))
    return reply, writes


def test_streamed_text_is_handed_on_piece_by_piece_and_the_reply_is_whole(streamer: StreamServer) -> None:
    streamer.reply(Stream(["The launch ", "moved to ", "Friday."]))
    reply, deltas = collected(stream_model(streamer), {"messages": BRANCH[:1], "instructions": "Be brief."})
    assert [d.text for d in deltas] == ["The launch ", "moved to ", "Friday."]
    assert [d.seq for d in deltas] == [1, 2, 3]
    assert reply == {"content": "The launch moved to Friday.", "tool_calls": [],
                     "usage": {"tokens": 12, "input_tokens": 7, "output_tokens": 5}}
    [body] = streamer.received
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}


def test_streamed_tool_calls_arrive_whole(streamer: StreamServer) -> None:
    streamer.reply(Stream([], tool_calls=[{"id": "c1", "name": "send_email",
                                           "arguments": {"to": "bob", "body": "hi"}}]))
    reply, deltas = collected(stream_model(streamer), {"messages": BRANCH[:1], "tools": [SEND_EMAIL]})
    assert deltas == []
    assert reply["tool_calls"] == [{"id": "c1", "name": "send_email",
                                    "arguments": {"to": "bob", "body": "hi"}}]


def test_a_stream_cut_mid_reply_is_retried_and_watchers_are_told_to_start_again(
        streamer: StreamServer) -> None:
    streamer.reply(Stream(["Half ", "a reply", " never ends"], cut_after=2), Stream(["A whole ", "reply."]))
    reply, deltas = collected(stream_model(streamer), {"messages": BRANCH[:1]})
    assert reply["content"] == "A whole reply."
    assert [(d.text, d.reset) for d in deltas] == [("Half ", False), ("a reply", False), ("", True),
                                                   ("A whole ", False), ("reply.", False)]
    assert len(streamer.received) == 2


def test_a_stream_param_of_the_call_is_refused_with_the_way_to_stream() -> None:
    with pytest.raises(LLMError, match=r"OpenAICompatible\(stream=True\)"):
        OpenAICompatible(model="m").build_body({"messages": [], "params": {"stream": True}})


def test_in_a_worker_the_pieces_go_to_the_sessions_deltas_stream_capped_and_expiring(
        streamer: StreamServer, llm_worker: LlmWorker, r: redis.Redis) -> None:
    streamer.reply(Stream(["one ", "two ", "three"], delay_s=0.1))
    llm_worker.enqueue()
    llm_worker.run(stream_model(streamer))
    [outcome] = llm_worker.outcomes()
    assert outcome.ok and outcome.value["content"] == "one two three"
    key = Keys().deltas("s-llm")
    entries = [delta_of(fields) for _id, fields in r.xrange(key)]
    assert "".join(d["text"] for d in entries if d) == "one two three"
    assert {(d["call_id"], d["attempt"]) for d in entries if d} == {("llm-1", 1)}
    assert 0 < r.ttl(key) <= DELTAS_TTL_S
