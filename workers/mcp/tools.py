"""A server's tools as the app's tools: listed when the app loads, each a function the worker
runs like any `async def` tool (docs/mcp.md).

A call connects to the server, calls its tool and returns what it returned. An elicitation the
server sends during the call is a `parley.interrupt()` of the tool (workers/asking.py): the
first time, the question parks the branch and the call is abandoned; once it is answered, the
tool runs again from its start, so the server's tool does too, and this time the elicitation is
answered with the resume's payload.
"""

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anyio
import mcp_types as types

from parley.workers.app import MCP_SERVER, MCP_TOOL, TOOL_DESCRIPTION, TOOL_PARAMETERS
from parley.workers.asking import interrupt
from parley.workers.mcp import connection, mapping
from parley.workers.mcp.servers import McpServer

T = TypeVar("T")


def app_tools(server: McpServer) -> dict[str, Callable[..., Awaitable[Any]]]:
    """The server's tools by the app's names, listed now (McpServerError, ListingError)."""
    listed = mapping.listed_tools(server, run_now(lambda: connection.list_tools(server)))
    return {tool.name: tool_function(server, tool) for tool in listed}


def tool_function(server: McpServer, tool: mapping.ListedTool) -> Callable[..., Awaitable[Any]]:
    """The app's tool for one tool of the server, carrying the marks the engine reads."""

    async def call(**arguments: Any) -> Any:
        result = await connection.call_tool(server, tool.remote, arguments,
                                            lambda params: answer(server, tool, params))
        return mapping.result_value(server, tool, result)

    call.__name__ = call.__qualname__ = tool.name
    marks: dict[str, Any] = {TOOL_PARAMETERS: tool.parameters, MCP_SERVER: server.name, MCP_TOOL: tool.remote,
                             "timeout_s": server.timeout_s, "needs_approval": server.needs_approval}
    if tool.description:
        marks[TOOL_DESCRIPTION] = tool.description
    for attr, value in marks.items():
        if value is not None:
            setattr(call, attr, value)
    return call


def answer(server: McpServer, tool: mapping.ListedTool, params: types.ElicitRequestFormParams
           ) -> types.ElicitResult:
    """The server's elicitation put to a person: their answer, once the call has one; until
    then `interrupt()` raises ToolAsked, which stops the call (connection.call_tool)."""
    question = mapping.question_of(server, tool, params)
    return mapping.accepted(interrupt(question.reason, question.payload,
                                      response_schema=question.response_schema))


def run_now(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run async `work` to its end from sync code (an app loading). In a thread of its own when
    this one already runs an event loop (an async test, an ASGI app loading an app), where
    another loop cannot run."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(work)
    with ThreadPoolExecutor(1, thread_name_prefix="parley-mcp-list") as pool:
        return pool.submit(anyio.run, work).result()
