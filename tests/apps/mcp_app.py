"""The app of the MCP tests: tests/mcp_server.py as stdio servers whose tools are the app's.

`t_*` are the server's plain tools and the one that elicits (`t_transfer`); `slow_sleep` is the
same server under another name with a 2-second time limit. With PARLEY_TEST_MCP_LOG set, the
server writes what reached it there; with PARLEY_TEST_MCP_TOOLS set, the app's `llm` writes the
tool schemas each model request carried there (evidence kept outside the engine).
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import parley.mcp
from parley import ScriptedModel

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")
# a stdio server inherits only a few variables (HOME, PATH, ...): pass the evidence file on
_env = {k: os.environ[k] for k in ("PARLEY_TEST_MCP_LOG", "PARLEY_TEST_MCP_PIDS") if k in os.environ}

mcp_servers = [
    parley.mcp.stdio(sys.executable, SERVER, name="t", env=_env,
                     tools=["add", "weather", "transfer", "refuse", "crash"]),
    # time enough for a stdio server to start on a loaded 2-core box (about 0.5 s when quiet,
    # over 2 s seen under the whole suite): the test needs the call to have reached the server
    parley.mcp.stdio(sys.executable, SERVER, name="slow", env=_env, tools=["sleep"], timeout_s=5),
]

_model = ScriptedModel()


def llm(request: dict[str, Any]) -> dict[str, Any]:
    path = os.environ.get("PARLEY_TEST_MCP_TOOLS")
    if path:
        Path(path).write_text(json.dumps(request["tools"], sort_keys=True))
    return _model(request)


def lookup(q: str) -> str:
    """The app's own tool, beside the servers'."""
    return f"found {q}"


tools = [lookup]
