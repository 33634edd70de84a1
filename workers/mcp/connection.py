"""Talking to an MCP server with the official SDK: one connection to list its tools (when an
app loads) and one per tool call (on a tool worker; docs/mcp.md, "What runs where").

A connection lives inside one call, so nothing of it outlives a job: a time limit that cancels
the call closes it, and a stdio server is stopped with it (the SDK closes its stdin, then
terminates it). What fails is said as one line naming the server, never a traceback of the
SDK's task groups.
"""

import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO, cast

import anyio
import anyio.abc
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext, ElicitationFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from parley.workers.mcp.servers import Http, McpServer

#: at most this many pages of a server's tool list (a paginator that never ends cannot hang a load)
MAX_PAGES = 100
#: how much of a stdio server's stderr an error quotes (its last lines)
STDERR_TAIL_CHARS = 600


class McpServerError(Exception):
    """The server could not be reached, or failed the request (not a tool's own error): the
    message names the server and what happened."""


#: what answers a server's form elicitation: returns the server's reply, or raises to stop the
#: call (a person must answer first: parley.interrupt()'s ToolAsked)
Answer = Callable[[types.ElicitRequestFormParams], types.ElicitResult]


async def list_tools(server: McpServer) -> list[types.Tool]:
    """Every tool the server lists, within the server's `list_timeout_s`."""
    with _errlog() as errlog:
        try:
            with anyio.fail_after(server.list_timeout_s):
                async with _connected(server, None, errlog) as client:
                    tools: list[types.Tool] = []
                    cursor: str | None = None
                    for _ in range(MAX_PAGES):
                        page = await client.list_tools(cursor=cursor)
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if cursor is None:
                            break
                    return tools
        except TimeoutError:
            raise McpServerError(f"{server.describe()}: cannot list its tools: no answer within "
                                 f"{server.list_timeout_s:g} s{_tail(errlog)}") from None
        except Exception as exc:
            raise McpServerError(f"{server.describe()}: cannot list its tools: {failure(exc)}"
                                 f"{_tail(errlog)}") from None


@dataclass
class _Stop:
    """What stopped a call from inside its elicitation: the exception to raise once the
    connection is closed, and the scope cancelled to abandon the call."""

    scope: anyio.CancelScope | None = None
    raised: BaseException | None = None


async def call_tool(server: McpServer, remote: str, arguments: dict[str, Any], answer: Answer
                    ) -> types.CallToolResult:
    """The server's tool `remote` called with `arguments`; each form elicitation it sends
    meanwhile is answered by `answer`.

    When `answer` raises (a question a person must answer first), the call is abandoned: the
    server gets no reply to that elicitation, the connection is closed, and only then is the
    exception raised here. Raised in the SDK's callback, it would cross the SDK's task groups
    (wrapped in an exception group, or taken for the callback's failure and sent to the
    server as an error, on which the server's tool would go on as if declined)."""
    stop = _Stop()

    async def on_elicit(context: ClientRequestContext, params: types.ElicitRequestParams
                        ) -> types.ElicitResult | types.ErrorData:
        if not isinstance(params, types.ElicitRequestFormParams):
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message="this client (Parley) answers form elicitations only, not URLs")
        try:
            return answer(params)
        except BaseException as exc:  # ToolAsked is a BaseException: keep it whole, raise it later
            stop.raised = exc
            assert stop.scope is not None
            stop.scope.cancel()
            await anyio.sleep_forever()  # cancelled with the call, or with the connection
            raise  # not reached: sleep_forever ends only by cancellation

    result: types.CallToolResult | None = None
    with _errlog() as errlog:
        try:
            async with _connected(server, on_elicit, errlog) as client:
                with anyio.CancelScope() as scope:
                    stop.scope = scope
                    try:
                        result = await client.call_tool(remote, arguments)
                    except Exception:
                        if stop.raised is None:
                            raise
        except Exception as exc:
            if stop.raised is None:
                raise McpServerError(f"{server.describe()}: tool {remote!r}: {failure(exc)}"
                                     f"{_tail(errlog)}") from None
    if stop.raised is not None:
        raise stop.raised
    assert result is not None
    return result


@asynccontextmanager
async def _connected(server: McpServer, on_elicit: ElicitationFnT | None, errlog: TextIO
                     ) -> AsyncIterator[Client]:
    """A connected, initialized client of `server` (its stdio child's stderr to `errlog`)."""
    async with AsyncExitStack() as stack:
        if isinstance(server.transport, Http):
            import httpx2  # the SDK's HTTP client (a dependency of `mcp`)

            # the SDK's own default timeouts: 30 s to connect or write, 300 s to read a stream
            http_client = await stack.enter_async_context(httpx2.AsyncClient(
                headers=dict(server.transport.headers), timeout=httpx2.Timeout(30.0, read=300.0)))
            transport: Any = streamable_http_client(server.transport.url, http_client=http_client)
        else:
            stdio = server.transport
            transport = stdio_client(StdioServerParameters(
                command=stdio.command, args=list(stdio.args), env=dict(stdio.env) or None, cwd=stdio.cwd),
                errlog=errlog)
        # no response cache: a connection serves one listing or one call
        client = Client(transport, mode=server.mode, elicitation_callback=on_elicit, cache=None)
        yield await stack.enter_async_context(client)


def failure(exc: BaseException) -> str:
    """What went wrong, in one line: the exceptions inside the SDK's (nested) exception groups."""
    leaves = list(_leaves(exc))
    return "; ".join(dict.fromkeys(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                                   for e in leaves))


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: a file of the call's own, quoted when the call fails
    (a server's log is not mixed into the worker's, nor lost when it explains a failure)."""
    return cast(TextIO, tempfile.TemporaryFile("w+"))


def _tail(errlog: TextIO) -> str:
    """The end of what a stdio server wrote to its stderr, for an error to quote."""
    try:
        errlog.flush()
        errlog.seek(0)
        text = errlog.read().strip()
    except (OSError, ValueError):
        return ""
    if not text:
        return ""
    return f" (its stderr ends: {' | '.join(text[-STDERR_TAIL_CHARS:].splitlines())})"
