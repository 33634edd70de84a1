"""The pure rules of MCP servers' tools (workers/mcp/servers.py, mapping.py; docs/mcp.md): the
declaration, naming, schemas, results and elicitation, and how the app loader takes them."""

from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest

import parley.mcp
from parley.workers.app import AppError, _mcp_tools, app_of, tool_schema
from parley.workers.mcp import connection, mapping, tools
from parley.workers.mcp.servers import Http, McpServer, Stdio


def tool(name: str, description: str | None = "Does it.", schema: dict[str, Any] | None = None,
         title: str | None = None) -> types.Tool:
    return types.Tool(name=name, description=description, title=title,
                      input_schema=schema or {"type": "object", "properties": {"x": {"type": "integer"}}})


SERVER = parley.mcp.stdio("python", "-m", "files", name="files")


# ---- declaring a server --------------------------------------------------------------------


def test_stdio_and_http_declare_typed_servers() -> None:
    assert McpServer(name="files", transport=Stdio("python", ("-m", "files"))) == SERVER
    web = parley.mcp.http("https://mcp.example/mcp", name="search",
                          headers={"Authorization": "Bearer s3cret"}, timeout_s=30, tools=["find"],
                          mode="auto", list_timeout_s=5)
    assert web.transport == Http("https://mcp.example/mcp", {"Authorization": "Bearer s3cret"})
    assert (web.timeout_s, web.tools, web.mode, web.list_timeout_s) == (30, ("find",), "auto", 5.0)
    assert web.describe() == "MCP server 'search' (http: https://mcp.example/mcp)"  # never its headers
    assert SERVER.describe() == "MCP server 'files' (stdio: python -m files)"


@pytest.mark.parametrize(("make", "wrong"), [
    (lambda: parley.mcp.stdio("python", name="my files"), "`name` must be 1-32 characters"),
    (lambda: parley.mcp.stdio("python", name="a.b"), "`name` must be 1-32 characters"),
    (lambda: parley.mcp.stdio("", name="f"), "`command` must be a non-empty string"),
    (lambda: parley.mcp.stdio("python", 3, name="f"), "the arguments must be strings"),  # type: ignore[arg-type]
    (lambda: parley.mcp.stdio("python", name="f", env={"A": 1}), "`env` must map strings to strings"),
    (lambda: parley.mcp.stdio("python", name="f", timeout_s=0), "`timeout_s` must be a number of seconds"),
    (lambda: parley.mcp.stdio("python", name="f", tools="read"), "`tools` must be a non-empty list"),
    (lambda: parley.mcp.stdio("python", name="f", tools=[]), "`tools` must be a non-empty list"),
    (lambda: parley.mcp.stdio("python", name="f", prefix="a b"), "`prefix` must be up to 32 characters"),
    (lambda: parley.mcp.stdio("python", name="f", mode="modern"), "`mode` must be one of legacy, auto"),
    (lambda: parley.mcp.stdio("python", name="f", needs_approval={"approvers": "alice"}), "`needs_approval`"),
    (lambda: parley.mcp.http("ftp://x", name="f"), "`url` must be an http:// or https:// URL"),
])
def test_a_wrong_declaration_fails_where_it_is_made(make: Any, wrong: str) -> None:
    with pytest.raises(ValueError, match=wrong.replace("(", r"\(")):
        make()


# ---- naming and schemas --------------------------------------------------------------------


def test_a_servers_tools_are_named_with_its_prefix_and_keep_its_schema() -> None:
    schema = {"type": "object", "title": "readArguments", "properties": {"path": {"type": "string"}},
              "required": ["path"]}
    listed = [tool("read", "Read a file.", schema), tool("write", None, title="Write it")]
    [read, write] = mapping.listed_tools(SERVER, listed)
    assert (read.name, read.remote, read.description) == ("files_read", "read", "Read a file.")
    assert read.parameters == schema
    assert read.parameters is not schema  # a copy: an app's llm may change what it is given
    assert (write.name, write.description) == ("files_write", "Write it")  # no description: its title
    bare = mapping.listed_tools(parley.mcp.stdio("x", name="f", prefix=""), [tool("read")])
    assert [t.name for t in bare] == ["read"]


def test_only_the_tools_named_are_taken_and_one_the_server_lacks_is_an_error() -> None:
    server = parley.mcp.stdio("x", name="f", tools=["b"])
    assert [t.name for t in mapping.listed_tools(server, [tool("a"), tool("b")])] == ["f_b"]
    with pytest.raises(mapping.ListingError,
                       match=r"MCP server 'f' \(stdio: x\) has no tool 'c' \(it lists: a, b\)"):
        mapping.listed_tools(parley.mcp.stdio("x", name="f", tools=["b", "c"]), [tool("a"), tool("b")])


def test_a_tool_name_parley_refuses_is_a_listing_error_naming_the_way_out() -> None:
    with pytest.raises(mapping.ListingError, match=r"its tool 'read/file' cannot be a Parley tool: "
                                                   r"'f_read/file' is not a valid identifier .* "
                                                   r"tools=\[\.\.\.\]"):
        mapping.listed_tools(parley.mcp.stdio("x", name="f"), [tool("read/file")])
    with pytest.raises(mapping.ListingError):
        mapping.listed_tools(parley.mcp.stdio("x", name="f"), [tool("t" * 63)])  # 65 with the prefix


def test_parameters_are_an_object_schema_even_when_the_server_sends_a_bare_one() -> None:
    assert mapping.parameters_of({}) == {"type": "object", "properties": {}}
    assert mapping.parameters_of({"type": "object"}) == {"type": "object", "properties": {}}


def test_the_tools_function_carries_the_schema_and_marks_the_engine_reads() -> None:
    server = parley.mcp.stdio("x", name="f", timeout_s=12, needs_approval=True)
    [listed] = mapping.listed_tools(server, [tool("read", "Read a file.")])
    fn = tools.tool_function(server, listed)
    assert tool_schema("f_read", fn) == {"name": "f_read", "description": "Read a file.",
                                         "parameters": listed.parameters}
    assert (fn.timeout_s, fn.needs_approval, fn.mcp_server, fn.mcp_tool) == (  # type: ignore[attr-defined]
        12, True, "f", "read")
    assert not hasattr(tools.tool_function(SERVER, listed), "timeout_s")  # unset: the dispatcher's default


# ---- results --------------------------------------------------------------------------------


READ = mapping.ListedTool(name="files_read", remote="read", description="", parameters={})


def result(*content: Any, structured: Any = None, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), structured_content=structured, is_error=error)


def test_a_result_is_its_structured_content_when_sent_else_its_text() -> None:
    text = types.TextContent(text="{\"n\": 1}")
    assert mapping.result_value(SERVER, READ, result(text, structured={"n": 1})) == {"n": 1}
    two = result(types.TextContent(text="a"), types.TextContent(text="b"))
    assert mapping.result_value(SERVER, READ, two) == "a\nb"
    assert mapping.result_value(SERVER, READ, result()) == ""


def test_content_text_can_hold_is_kept_and_the_rest_is_named() -> None:
    blocks = [types.ImageContent(data="AAAA", mime_type="image/png"),
              types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///a.txt", text="hello")),
              types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///b", blob="AAAA")),
              types.ResourceLink(uri="file:///c", name="c")]
    assert mapping.content_text(blocks) == \
        "[image image/png]\nhello\n[resource file:///b (binary)]\n[link file:///c]"


def test_an_error_result_is_the_calls_error_in_the_servers_words() -> None:
    with pytest.raises(mapping.McpToolError, match=r"^MCP server 'files', tool 'read': no such file$"):
        mapping.result_value(SERVER, READ, result(types.TextContent(text="no such file"), error=True))
    with pytest.raises(mapping.McpToolError, match="the tool reported an error"):
        mapping.result_value(SERVER, READ, result(error=True))


# ---- elicitation -----------------------------------------------------------------------------


def test_an_elicitation_is_a_question_with_the_requested_schema_and_its_answer_is_accepted() -> None:
    schema = {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]}
    params = types.ElicitRequestFormParams(message="Which account?", requested_schema=schema)
    question = mapping.question_of(SERVER, READ, params)
    assert question == mapping.Question(
        reason="elicitation", payload={"message": "Which account?", "server": "files", "tool": "files_read"},
        response_schema=schema)
    assert mapping.accepted({"account": "savings"}) == types.ElicitResult(action="accept",
                                                                         content={"account": "savings"})


def test_answering_outside_a_tool_run_is_parleys_own_error() -> None:
    params = types.ElicitRequestFormParams(message="?", requested_schema={"type": "object", "properties": {}})
    with pytest.raises(RuntimeError, match=r"parley.interrupt\(\) asks from inside a tool"):
        tools.answer(SERVER, READ, params)


# ---- errors -----------------------------------------------------------------------------------


def test_a_failure_inside_nested_exception_groups_is_one_line() -> None:
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [ConnectionError("closed")]), OSError()])
    assert connection.failure(nested) == "ConnectionError: closed; OSError"
    assert connection.failure(FileNotFoundError(2, "No such file or directory")) == \
        "FileNotFoundError: [Errno 2] No such file or directory"


# ---- the app loader ----------------------------------------------------------------------------


@pytest.mark.parametrize("servers", [SERVER, [SERVER, "python -m other"], {"files": SERVER}])
def test_mcp_servers_must_be_a_list_of_declared_servers(servers: Any) -> None:
    with pytest.raises(AppError, match=r"app 'a': `mcp_servers` must be a list of parley.mcp.stdio"):
        _mcp_tools("a", servers, {})


def test_two_servers_of_one_name_stop_the_app_before_anything_is_started() -> None:
    with pytest.raises(AppError, match="app 'a': two MCP servers are named 'files'"):
        app_of("a", SimpleNamespace(mcp_servers=[SERVER, parley.mcp.stdio("other", name="files")]))


def test_an_app_without_servers_lists_nothing() -> None:
    assert _mcp_tools("a", None, {}) == {}
