"""A small MCP server for the tests, written with the `mcp` SDK's own server (MCPServer, what
was FastMCP before mcp 2), run as a stdio child (`python tests/mcp_server.py`) or over
streamable HTTP (`python tests/mcp_server.py --http PORT`).

It keeps evidence outside the system under test: with PARLEY_TEST_MCP_LOG set, each run of a
tool appends a line to that file (`transfer 5`; `sleep` writes its process id), and each
answer an elicitation brought back another (`received {"account": "savings"}`), so a test sees
what reached the server.
"""

import os

# Before the SDK's imports (seconds on a loaded box): with PARLEY_TEST_MCP_PIDS set, the
# process id of every server started, so a test can check the server is stopped even when a
# time limit ran out before the call reached a tool.
if os.environ.get("PARLEY_TEST_MCP_PIDS"):
    with open(os.environ["PARLEY_TEST_MCP_PIDS"], "a") as _pids:
        _pids.write(f"{os.getpid()}\n")

import json
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel

server = MCPServer("parley-tests")


def _log(line: str) -> None:
    path = os.environ.get("PARLEY_TEST_MCP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


class Account(BaseModel):
    account: str
    note: str = ""


@server.tool()
def add(a: int, b: int) -> str:
    """Add two numbers."""
    _log(f"add {a} {b}")
    return str(a + b)


@server.tool()
def weather(city: str) -> dict[str, object]:
    """Today's weather in a city, as structured content."""
    _log(f"weather {city}")
    return {"city": city, "celsius": 21}


@server.tool()
async def transfer(amount: int, ctx: Context) -> str:
    """Move money, asking the client which account (an elicitation in the middle of the call)."""
    _log(f"transfer {amount}")  # before the question: runs again on every run
    got = await ctx.elicit(f"Which account should {amount} EUR come from?", Account)
    if got.action != "accept":
        _log(f"declined {got.action}")
        return f"not moved ({got.action})"
    _log("received " + json.dumps(got.data.model_dump(), sort_keys=True))
    return f"moved {amount} from {got.data.account}"


def _which_account(amount: int) -> Elicit[Account]:
    _log(f"resolve {amount}")
    return Elicit(f"Which account for {amount} EUR?", Account)


@server.tool()
def pay(amount: int, account: Annotated[Account, Resolve(_which_account)]) -> str:
    """Pay, the account asked by a resolver (2026-07-28: an input-required result)."""
    _log("received " + json.dumps(account.model_dump(), sort_keys=True))
    return f"paid {amount} from {account.account}"


@server.tool()
def refuse(why: str) -> str:
    """Always fails, as a tool error the model reads (isError)."""
    raise ToolError(f"refused: {why}")


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then answer (a time limit stops the call first)."""
    _log(f"sleep {os.getpid()}")
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
def crash() -> str:
    """The server process dies in the middle of the call."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
