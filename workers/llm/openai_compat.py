"""An `llm` for any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, LiteLLM, ...).

`OpenAICompatible()` is a callable an app uses as its `llm` (README, "Using a real model"): it
turns Parley's request into a `POST {base_url}/chat/completions` and the server's reply into
Parley's response shape. Configuration comes from the constructor or the environment:

- `PARLEY_LLM_BASE_URL` (default `https://api.openai.com/v1`),
- `PARLEY_LLM_MODEL` (a request's `model`, from an `llm.call` action, overrides it),
- `PARLEY_LLM_API_KEY` (falling back to `OPENAI_API_KEY`; none: no Authorization header).

With `stream=True` the reply is asked for as server-sent events, and each piece of its text is
handed to `parley.stream_delta` as it arrives (watchers of the session see it at once; the
transcript records the whole reply when the call ends). A request retried after some text
was streamed first streams a reset, so watchers start that reply again.

HTTP 429, 5xx, connection errors and timeouts are retried with full-jitter exponential
backoff (a `Retry-After` in seconds is honoured, capped); other errors raise `LLMError`
at once. Retries stop in time to end the call inside its time limit: `total_timeout`, and in
a worker the job's (`--llm-timeout`). Any exception becomes `llm.failed` in Parley's LLM job.
The API key is never logged, shown in `repr` or echoed in an error.
"""

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from parley.runtime.logs import kv
from parley.runtime.retry import backoff
from parley.workers.llm.limits import TimeLimit, current_time_limit, earliest
from parley.workers.llm.sse import ChatStream, StreamError
from parley.workers.streaming import stream_delta, stream_reset

log = logging.getLogger("parley.llm")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))
EXCERPT_CHARS = 300
# the least time worth starting another attempt in (or `timeout`, when that is shorter)
MIN_ATTEMPT_S = 1.0
# what the model reads for a tool call whose result the transcript does not hold (yet): a
# chat-completions server refuses an assistant tool call without a tool message answering it
NO_RESULT = "(no result: the call has not completed)"


class LLMError(RuntimeError):
    """The model call failed; `status` is the HTTP status when the server answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LLMTimeoutError(LLMError, TimeoutError):
    """The server did not answer within the timeout (on every attempt)."""


@dataclass(frozen=True)
class _Retryable:
    """An attempt that failed in a way worth retrying (429, 5xx, no connection, no answer in
    time): `why` for the log, the response for its Retry-After, and `fail(tried)`, the error to
    raise when no attempt is left (`tried` says how many were made and why they stopped)."""

    why: str
    response: httpx.Response | None
    fail: Callable[[str], LLMError]


class OpenAICompatible:
    """`llm = OpenAICompatible()` or `OpenAICompatible(model="gpt-4o-mini")` in an app module.

    Args:
        base_url: the API root, up to and including `/v1`.
        model: the model name when a request does not name one.
        api_key: sent as `Authorization: Bearer ...`.
        timeout: seconds for each attempt (connect, read, write, pool, each).
        max_retries: retries after the first attempt, for 429, 5xx, connection errors, timeouts.
        total_timeout: seconds for the whole call, retries and waits included (default: none of
            its own). In a worker the job's time limit (`--llm-timeout`) bounds it as well: no
            retry starts that could not end before it, and an attempt gets at most the time left.
        backoff_base: seconds; attempt n waits uniform(0, min(max_backoff, backoff_base * 2**n)).
        max_backoff: seconds; also caps a server's `Retry-After`.
        headers: extra headers for every request (e.g. an org or project header).
        instructions: the system prompt, sent as the first message, when the request has none
            of its own (an app's `instructions` come with each request as `instructions`).
        stream: ask for the reply as a stream and hand its text to `parley.stream_delta` piece
            by piece (with `stream_options.include_usage`, so the tokens are still counted).
    """

    def __init__(self, model: str | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, timeout: float = 60.0, max_retries: int = 4,
                 total_timeout: float | None = None, backoff_base: float = 0.5, max_backoff: float = 10.0,
                 headers: Mapping[str, str] | None = None, instructions: str | None = None,
                 stream: bool = False) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if total_timeout is not None and total_timeout <= 0:
            raise ValueError("total_timeout must be > 0 (or None)")
        if timeout <= 0 or backoff_base < 0 or max_backoff < 0:
            raise ValueError("timeout must be > 0, backoff_base and max_backoff >= 0")
        self.base_url = (base_url or os.environ.get("PARLEY_LLM_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.model = model or os.environ.get("PARLEY_LLM_MODEL") or None
        self._api_key = api_key or os.environ.get("PARLEY_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self.max_retries = max_retries
        self.total_timeout = total_timeout
        self.backoff_base = backoff_base
        self.max_backoff = max_backoff
        self.headers = dict(headers or {})
        self.instructions = instructions
        self.stream = bool(stream)
        self._client: httpx.Client | None = None
        self._client_pid: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"OpenAICompatible(model={self.model!r}, base_url={self.base_url!r}, "
                f"api_key={'set' if self._api_key else 'unset'}, stream={self.stream})")

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    # ---- the app's `llm` ----------------------------------------------------------------------

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        body = self.build_body(request)
        return parse_response(self._post(body))

    def build_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The chat-completions request body for Parley's `request` (README, "An app")."""
        model = request.get("model") or self.model
        if not model:
            raise LLMError("no model: pass OpenAICompatible(model=...), set PARLEY_LLM_MODEL, "
                           "or give the llm.call action a `model`")
        params = request.get("params") or {}
        if not isinstance(params, Mapping):
            raise LLMError(f"llm.call `params` must be an object, got {type(params).__name__}")
        if "stream" in params or "stream_options" in params:
            raise LLMError("llm.call `params`: `stream` is the adapter's to set: "
                           "use OpenAICompatible(stream=True)")
        messages = to_chat_messages(request.get("messages") or [])
        system = request.get("instructions") or self.instructions
        if system:
            messages = [{"role": "system", "content": str(system)}, *messages]
        body: dict[str, Any] = {**params, "model": model, "messages": messages}
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        tools = to_chat_tools(request.get("tools") or [])
        if tools:
            body["tools"] = tools
        else:
            body.pop("tools", None)
        return body

    # ---- HTTP --------------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        """One pooled client per process (a client made before a fork is not reused after it)."""
        with self._lock:
            if self._client is None or self._client_pid != os.getpid():
                self._client = httpx.Client(timeout=httpx.Timeout(self.timeout))
                self._client_pid = os.getpid()
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None and self._client_pid == os.getpid():
                self._client.close()
            self._client = None

    def __enter__(self) -> "OpenAICompatible":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        accept = "text/event-stream" if self.stream else "application/json"
        headers = {"Content-Type": "application/json", "Accept": accept, **self.headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def time_limit(self) -> TimeLimit | None:
        """The limit this call must end within: `total_timeout` from now, or the time left of the
        worker's job (`--llm-timeout`), whichever comes first."""
        own = TimeLimit.starting_now(self.total_timeout) if self.total_timeout is not None else None
        return earliest(own, current_time_limit())

    def _post(self, body: dict[str, Any]) -> Any:
        content = json.dumps(body, ensure_ascii=False).encode()
        limit = self.time_limit()
        attempts = 0
        while True:
            timeout = self.timeout if limit is None else max(min(self.timeout, limit.left()), 0.001)
            outcome = self._attempt(content, timeout)
            attempts += 1
            if not isinstance(outcome, _Retryable):
                return outcome
            if attempts > self.max_retries:
                raise outcome.fail(f"{attempts} attempt(s)")
            delay = self.delay(attempts - 1, outcome.response)
            # another attempt only when, after its wait, it has a useful time left to run in
            if limit is not None and limit.left() - delay < min(self.timeout, MIN_ATTEMPT_S):
                raise outcome.fail(f"{attempts} attempt(s), stopped by the time limit of {limit.seconds:g} s")
            log.warning("llm call retried", extra=kv(url=self.url, why=outcome.why, attempt=attempts,
                                                     delay_s=round(delay, 3)))
            if self.stream:
                stream_reset()  # the retry's reply streams from its start
            time.sleep(delay)

    def _attempt(self, content: bytes, timeout: float) -> "Any | _Retryable":
        """One POST: the reply's JSON, a failure worth retrying, or LLMError for one that is not."""
        try:
            if self.stream:
                return self._streamed(content, timeout)
            response = self._http().post(self.url, content=content, headers=self._headers(),
                                         timeout=httpx.Timeout(timeout))
        except httpx.TimeoutException as exc:
            kind = type(exc).__name__
            return _Retryable(f"timeout ({kind})", None, lambda tried: LLMTimeoutError(
                f"{self.url}: no answer within {round(timeout, 2):g} s ({kind}, {tried})"))
        except httpx.TransportError as exc:
            kind, text = type(exc).__name__, self._redact(str(exc))
            return _Retryable(f"connection error ({kind})", None, lambda tried: LLMError(
                f"{self.url}: connection failed ({kind}: {text}; {tried})"))
        return self._answer(response)

    def _streamed(self, content: bytes, timeout: float) -> "Any | _Retryable":
        """One streamed POST: its text handed to `stream_delta` as it comes, then the reply as
        a non-streamed completion's JSON. A server that answers with an error, or with plain
        JSON (it ignored `stream`), is read as a non-streamed answer."""
        with self._http().stream("POST", self.url, content=content, headers=self._headers(),
                                 timeout=httpx.Timeout(timeout)) as response:
            events = "text/event-stream" in response.headers.get("content-type", "")
            if response.status_code >= 400 or not events:
                response.read()
                return self._answer(response)
            chat = ChatStream()
            try:
                for line in response.iter_lines():
                    for piece in chat.feed(line):
                        stream_delta(piece)
                for piece in chat.end():
                    stream_delta(piece)
            except StreamError as exc:
                raise LLMError(f"{self.url}: {self._redact(str(exc))}", status=response.status_code) from None
            return chat.completion()

    def _answer(self, response: httpx.Response) -> "Any | _Retryable":
        """A whole answer read: its JSON, a failure worth retrying, or LLMError for one that is not."""
        status = response.status_code
        if status in RETRY_STATUSES:
            excerpt = self._excerpt(response.text)
            return _Retryable(f"HTTP {status}", response, lambda tried: LLMError(
                f"{self.url}: HTTP {status} after {tried}: {excerpt}", status=status))
        if status >= 400:
            raise LLMError(f"{self.url}: HTTP {status}: {self._excerpt(response.text)}", status=status)
        try:
            return response.json()
        except ValueError:
            raise LLMError(f"{self.url}: HTTP {status} with a body that is not JSON: "
                           f"{self._excerpt(response.text)}", status=status) from None

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        """Seconds to wait before retry `attempt + 1`: the server's Retry-After, else full jitter."""
        if response is not None:
            hinted = _retry_after(response)
            if hinted is not None:
                return min(hinted, self.max_backoff)
        return backoff(attempt, base=self.backoff_base, cap=self.max_backoff, jitter=True)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _excerpt(self, text: str) -> str:
        text = " ".join(self._redact(text).split())
        if not text:
            return "(empty body)"
        return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def _retry_after(response: httpx.Response) -> float | None:
    """`retry-after-ms` or `Retry-After` in seconds (an HTTP date is ignored: jitter instead)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = response.headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


# ---- mapping --------------------------------------------------------------------------------


def to_chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parley's `{name, description, parameters}` as chat-completions function tools."""
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    if role == "assistant":
        calls = message.get("tool_calls") or []
        if not calls:
            return {"role": "assistant", "content": content or ""}
        return {"role": "assistant", "content": content or None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": call["name"],
                          "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False)}}
            for call in calls]}
    if role == "tool":
        text = content or ""
        if message.get("error"):
            text = f"Error: {text}"
        return {"role": "tool", "tool_call_id": message.get("tool_call_id"), "content": text}
    return {"role": role, "content": content or ""}


def to_chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parley's branch (root to head) as chat messages, in an order such servers accept.

    Every assistant message with tool calls is followed at once by the tool messages that
    answer it, in the order of its calls, wherever they sit in the branch (Parley may append
    an assistant `message` between, from a decision); the messages they skipped follow.
    A call with no tool message gets a placeholder result; nothing is dropped.
    """
    by_call: dict[str, list[int]] = {}
    for i, m in enumerate(messages):
        if m.get("role") == "tool" and m.get("tool_call_id") is not None:
            by_call.setdefault(str(m["tool_call_id"]), []).append(i)
    out: list[dict[str, Any]] = []
    placed: set[int] = set()
    for i, m in enumerate(messages):
        if i in placed:
            continue
        placed.add(i)
        out.append(_chat_message(m))
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            answers = [j for j in by_call.get(str(call["id"]), []) if j > i and j not in placed]
            if not answers:
                out.append({"role": "tool", "tool_call_id": call["id"], "content": NO_RESULT})
            for j in answers:
                placed.add(j)
                out.append(_chat_message(messages[j]))
    return out


def parse_response(data: Any) -> dict[str, Any]:
    """choices[0].message as Parley's `{content, tool_calls, usage?}`."""
    if not isinstance(data, dict):
        raise LLMError(f"chat completion is not a JSON object: {str(data)[:EXCERPT_CHARS]}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        detail = data.get("error") or data
        raise LLMError(f"chat completion has no choices: {json.dumps(detail)[:EXCERPT_CHARS]}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise LLMError("chat completion choices[0] has no message")
    content = message.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        raise LLMError(f"chat completion message content is not a string: {type(content).__name__}")
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise LLMError(f"chat completion has a malformed tool call: {json.dumps(call)[:EXCERPT_CHARS]}")
        calls.append({"id": call.get("id"), "name": function["name"],
                      "arguments": _arguments(function["name"], function.get("arguments"))})
    out: dict[str, Any] = {"content": content, "tool_calls": calls}
    usage = data.get("usage")
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if not isinstance(total, int):
            parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
            total = sum(p for p in parts if isinstance(p, int)) or None
        if isinstance(total, int):
            out["usage"] = {"tokens": total}
            # the split, when the server gives it: the worker's span reports it (docs/tracing.md)
            for ours, theirs in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
                if isinstance(usage.get(theirs), int):
                    out["usage"][ours] = usage[theirs]
    return out


def _arguments(name: str, raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if not isinstance(raw, str):
        raise LLMError(f"tool call {name!r}: arguments are neither JSON text nor an object")
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LLMError(f"tool call {name!r}: arguments are not valid JSON ({exc.msg} at char {exc.pos}): "
                       f"{raw[:EXCERPT_CHARS]}") from None
    if not isinstance(parsed, dict):
        raise LLMError(f"tool call {name!r}: arguments must be a JSON object, got {type(parsed).__name__}")
    return parsed
