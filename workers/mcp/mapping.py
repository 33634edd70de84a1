"""The rules between MCP and Parley, pure (no connection, no process; docs/mcp.md):

- naming: a server's tool `read` becomes the app's tool `<prefix>read` (`files_read`);
- schemas: the server's `inputSchema` is the tool's `parameters`, its description the tool's;
- results: what a call returned becomes the tool's result, or its error;
- elicitation: a server's form request becomes a `parley.interrupt()` question, and the
  question's answer the server's `accept`.
"""

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import orjson

from parley.workers.app import check_tool_name
from parley.workers.mcp.servers import McpServer

#: the reason of every question an MCP server asks through Parley
ELICITATION_REASON = "elicitation"


class ListingError(Exception):
    """A server's tools cannot become the app's (a name Parley refuses, a tool named in
    `tools=` that the server does not list); the message names the server."""


class McpToolError(Exception):
    """The server's tool reported an error (`isError`): the call's tool error."""


@dataclass(frozen=True, slots=True)
class ListedTool:
    """One tool of a server as the app has it."""

    #: the app's name for it (what the model calls)
    name: str
    #: the server's name for it (what the call asks the server for)
    remote: str
    description: str
    #: a JSON Schema of the arguments: the server's inputSchema as it sent it
    parameters: dict[str, Any]


def tool_name(server: McpServer, remote: str) -> str:
    """The app's name for the server's tool `remote`: the server's prefix and its name."""
    return server.tool_prefix + remote


def listed_tools(server: McpServer, tools: Sequence[types.Tool]) -> list[ListedTool]:
    """The app's tools of `server`, from what it listed (in its order): ListingError when one
    cannot be named, or when `server.tools` names a tool the server does not have."""
    remote = [t.name for t in tools]
    if server.tools is not None:
        missing = [t for t in server.tools if t not in remote]
        if missing:
            raise ListingError(f"{server.describe()} has no tool {', '.join(map(repr, missing))} "
                               f"(it lists: {', '.join(remote) or 'none'})")
    out: list[ListedTool] = []
    for tool in tools:
        if server.tools is not None and tool.name not in server.tools:
            continue
        name = tool_name(server, tool.name)
        problem = check_tool_name(name)  # the one rule of tool names (workers/app.py)
        if problem is not None:
            raise ListingError(f"{server.describe()}: its tool {tool.name!r} cannot be a Parley tool: "
                               f"{problem}; leave it out with tools=[...], or choose a shorter prefix=")
        out.append(ListedTool(name=name, remote=tool.name,
                              description=(tool.description or tool.title or "").strip(),
                              parameters=parameters_of(tool.input_schema)))
    return out


def parameters_of(input_schema: dict[str, Any]) -> dict[str, Any]:
    """The tool's `parameters`: the server's inputSchema as it is (a copy: a model's request
    may be changed by the app's `llm`), an object schema even when the server sent none."""
    schema = copy.deepcopy(input_schema) if isinstance(input_schema, dict) else {}
    schema.setdefault("type", "object")
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema


def result_value(server: McpServer, tool: ListedTool, result: types.CallToolResult) -> Any:
    """What the call's result is in the transcript: the structured content when the server sent
    one, else its content as text; an `isError` result is the call's error (McpToolError)."""
    if result.is_error:
        text = content_text(result.content) or "the tool reported an error"
        # what the model reads to correct itself: the server's words, not its command line
        raise McpToolError(f"MCP server {server.name!r}, tool {tool.remote!r}: {text}")
    if result.structured_content is not None:
        # a JSON value the transcript can hold (pydantic gave us plain values; a check as for
        # any tool result, so a server's oddity is this call's error, not the worker's)
        return orjson.loads(orjson.dumps(result.structured_content))
    return content_text(result.content)


def content_text(blocks: Sequence[types.ContentBlock]) -> str:
    """The blocks as one text: text as it is, a text resource's text, and a short note for what
    a transcript of text cannot hold (images, audio, binary resources, links)."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.EmbeddedResource) \
                and isinstance(block.resource, types.TextResourceContents):
            parts.append(block.resource.text)
        elif isinstance(block, types.EmbeddedResource):
            parts.append(f"[resource {block.resource.uri} ({block.resource.mime_type or 'binary'})]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[link {block.uri}]")
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type} {block.mime_type}]")
    return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class Question:
    """What `parley.interrupt()` is asked for a server's elicitation."""

    reason: str
    payload: dict[str, Any]
    response_schema: dict[str, Any]


def question_of(server: McpServer, tool: ListedTool, params: types.ElicitRequestFormParams) -> Question:
    """The Parley question for a server's form elicitation: its message, which server and tool
    asked, and its requestedSchema as the answer's schema (a resume is checked against it)."""
    return Question(reason=ELICITATION_REASON,
                    payload={"message": params.message, "server": server.name, "tool": tool.name},
                    response_schema=copy.deepcopy(params.requested_schema))


def accepted(answer: Any) -> types.ElicitResult:
    """The server's reply to its elicitation: the person's answer (a resume's payload, already
    checked against the requestedSchema) as the accepted content."""
    return types.ElicitResult(action="accept", content=answer)
