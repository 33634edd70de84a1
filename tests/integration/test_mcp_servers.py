"""MCP servers as real processes, the engine in one process (parley.testing, no Redis): the
ways of reaching a server and of eliciting that the e2e (tests/e2e/test_mcp.py) does not take,
and every way loading an app with servers fails (docs/mcp.md)."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

import parley.mcp
from parley.cli.app_problems import check_app, summary
from parley.runtime.procs import free_port
from parley.testing import AppRunner
from parley.workers.app import AppError, app_of
from parley.workers.llm import ScriptedModel
from parley.workers.mcp.servers import McpServer

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "server.log"


def app_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> str:
    """A module `name` with `attrs`, importable by name as an app (its model: `call NAME {...}`)."""
    module = ModuleType(name)
    module.__dict__.update({"llm": ScriptedModel(), **attrs})
    monkeypatch.setitem(sys.modules, name, module)
    return name


def stdio_server(log: Path, **options: Any) -> McpServer:
    return parley.mcp.stdio(sys.executable, SERVER, env={"PARLEY_TEST_MCP_LOG": str(log)}, **options)


def elicit_and_answer(app: str, call: str, answer: dict[str, Any]) -> AppRunner:
    runner = AppRunner(app)
    session = runner.session()
    session.send(call)
    [question] = session.questions
    assert question.reason == "elicitation"
    assert question.response_schema is not None and question.response_schema["required"] == ["account"]
    session.resume(question, answer)
    assert session.questions == []
    return runner


def test_an_input_required_elicitation_of_a_2026_server_is_asked_and_answered(
        monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    """mode="auto": the server speaks 2026-07-28, so its resolver's question comes back as an
    input-required result, and the client calls again with the answer."""
    server = stdio_server(log, name="m", mode="auto", tools=["pay"])
    app = app_module(monkeypatch, "mcp_auto_app", mcp_servers=[server])
    session = AppRunner(app).session()
    session.send('call m_pay {"amount": 4}')
    [question] = session.questions
    assert question.payload == {"message": "Which account for 4 EUR?", "server": "m", "tool": "m_pay"}
    session.resume(question, {"account": "checking"})
    [call] = session.tool_calls
    assert (call.content, call.error) == ('{"result":"paid 4 from checking"}', None)
    # the resolver asked on the first run; on the second it asked again, was answered at once, and
    # ran once more on the server's round with the answer (the SDK re-runs resolvers each round)
    assert log.read_text().splitlines() == ["resolve 4", "resolve 4", "resolve 4",
                                            'received {"account": "checking", "note": ""}']


@pytest.fixture
def http_server(log: Path) -> Iterator[str]:
    port = free_port()
    env = {"PARLEY_TEST_MCP_LOG": str(log), "PATH": os.environ["PATH"]}
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            assert proc.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


def test_a_streamable_http_servers_tools_are_called_and_its_elicitation_answered(
        monkeypatch: pytest.MonkeyPatch, log: Path, http_server: str) -> None:
    app = app_module(monkeypatch, "mcp_http_app",
                     mcp_servers=[parley.mcp.http(http_server, name="web", headers={"X-Token": "t"},
                                                  tools=["weather", "transfer"])])
    runner = elicit_and_answer(app, 'call web_transfer {"amount": 9}', {"account": "savings"})
    assert set(runner.app.tools) == {"web_weather", "web_transfer"}
    session = runner.session("s-2")
    session.send('call web_weather {"city": "Oslo"}')
    assert session.tool_calls[0].content == '{"city":"Oslo","celsius":21}'
    assert log.read_text().splitlines() == ["transfer 9", "transfer 9",
                                            'received {"account": "savings", "note": ""}', "weather Oslo"]


# ---- loading fails clearly -------------------------------------------------------------------


def load_error(*servers: McpServer, **attrs: Any) -> str:
    with pytest.raises(AppError) as caught:
        app_of("a", type("App", (), {"mcp_servers": list(servers), **attrs}))
    return str(caught.value)


def test_a_server_that_exits_at_once_is_named_with_the_end_of_its_stderr() -> None:
    server = parley.mcp.stdio(sys.executable, "-c", "import sys; sys.exit('no config file')", name="broken")
    error = load_error(server)
    assert error.startswith(f"app 'a': MCP server 'broken' (stdio: {sys.executable} -c import sys; ")
    assert "cannot list its tools: MCPError: Connection closed (its stderr ends: no config file)" in error


def test_a_server_that_never_answers_is_given_up_after_its_list_timeout() -> None:
    server = parley.mcp.stdio(sys.executable, "-c", "import time; time.sleep(60)", name="mute",
                              list_timeout_s=1)
    started = time.monotonic()
    assert load_error(server).endswith("cannot list its tools: no answer within 1 s")
    assert time.monotonic() - started < 10


def test_a_tool_named_as_the_apps_own_or_missing_from_the_server_stops_the_load(log: Path) -> None:
    def t_add(a: int, b: int) -> int:
        """The app's own add."""
        return a + b

    clash = load_error(stdio_server(log, name="t", tools=["add"]), tools=[t_add])
    assert clash == (f"app 'a': MCP server 't' (stdio: {sys.executable} {SERVER}): its tool 'add' is named "
                     "'t_add', as one of the app's own tools: give the server another prefix=, or leave "
                     "the tool out with tools=[...]")
    twice = load_error(stdio_server(log, name="t", tools=["add"]),
                       stdio_server(log, name="u", prefix="t_", tools=["add"]))
    assert "its tool 'add' is named 't_add', as a tool of MCP server 't'" in twice
    missing = load_error(stdio_server(log, name="t", tools=["add", "fly"]))
    assert missing.startswith("app 'a': MCP server 't' (stdio: ")
    assert "has no tool 'fly' (it lists: add, " in missing
    assert not log.exists()  # listing called nothing


def test_app_check_lists_each_failing_server_and_keeps_the_others_tools(
        monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    app = app_module(monkeypatch, "mcp_check_app", mcp_servers=[
        parley.mcp.stdio("/nonexistent/server", name="gone"), stdio_server(log, name="t", tools=["add"]),
        parley.mcp.stdio(sys.executable, "-c", "raise SystemExit(2)", name="dead")])
    checked = check_app(app)
    assert not checked.ok and checked.app is not None
    assert set(checked.app.tools) == {"t_add"}
    errors = [p.message for p in checked.problems if p.level == "error"]
    assert len(errors) == 2
    assert errors[0].startswith("app 'mcp_check_app': MCP server 'gone' (stdio: /nonexistent/server): cannot "
                                "list its tools: FileNotFoundError")
    assert errors[1].startswith("app 'mcp_check_app': MCP server 'dead' (stdio: ")
    assert "  tool t_add: from MCP server t ('add')" in summary(checked.app)
