"""The MCP servers an app names (`mcp_servers = [...]`, docs/mcp.md): what each is and how to
reach it, checked where it is declared. Plain values: nothing here imports the MCP SDK, opens a
connection or starts a process, so an app module imports as fast with servers as without.
"""

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.schemas.approvals import PolicyError, parse_policy

#: how a connection agrees on the protocol: `legacy` is the initialize handshake every server
#: speaks, in which a server may send requests (elicitation) in the middle of a call; `auto`
#: asks the server for 2026-07-28 first (elicitation then comes back as an input-required
#: result) and falls back to the handshake
Mode = Literal["legacy", "auto"]
MODES: tuple[Mode, ...] = ("legacy", "auto")

#: a server's name: the default prefix of its tools' names, so it keeps to the characters every
#: model API allows in a function name
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")

#: how long listing the tools (connecting included) may take when an app loads: a clear error, not a hang
LIST_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Stdio:
    """A server the client starts as a child process and talks to over its stdin and stdout."""

    command: str
    args: tuple[str, ...] = ()
    #: added to the few variables the SDK passes on (HOME, PATH, USER, ...): a child does not
    #: inherit the worker's whole environment, its secrets included
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def describe(self) -> str:
        return "stdio: " + " ".join([self.command, *self.args])


@dataclass(frozen=True, slots=True)
class Http:
    """A server reached at a URL with the streamable HTTP transport."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"http: {self.url}"  # never the headers: they hold tokens


@dataclass(frozen=True, slots=True)
class McpServer:
    """One server of an app: its tools become the app's tools (docs/mcp.md)."""

    name: str
    transport: Stdio | Http
    #: put before each tool's name (None: `<name>_`); "" keeps the server's names as they are
    prefix: str | None = None
    #: only these tools of the server (by the server's names); None: all it lists
    tools: tuple[str, ...] | None = None
    #: each tool's time limit (a tool's `timeout_s`); None: the dispatcher's `--tool-timeout`
    timeout_s: float | None = None
    #: each tool's `needs_approval` (True or the dict of docs/protocol.md, Approvals)
    needs_approval: Any = None
    mode: Mode = "legacy"
    list_timeout_s: float = LIST_TIMEOUT_S

    @property
    def tool_prefix(self) -> str:
        return f"{self.name}_" if self.prefix is None else self.prefix

    def describe(self) -> str:
        """How errors name the server: `MCP server 'files' (stdio: python -m files)`."""
        return f"MCP server {self.name!r} ({self.transport.describe()})"


def stdio(command: str, *args: str, name: str, env: Mapping[str, str] | None = None, cwd: str | None = None,
          prefix: str | None = None, tools: Sequence[str] | None = None, timeout_s: float | None = None,
          needs_approval: Any = None, mode: Mode = "legacy",
          list_timeout_s: float = LIST_TIMEOUT_S) -> McpServer:
    """A server started as `command *args` (a child process per connection, docs/mcp.md).
    A value of the wrong kind raises ValueError here, where the app declares it."""
    where = f"parley.mcp.stdio(name={name!r})"
    if not isinstance(command, str) or not command:
        raise ValueError(f"{where}: `command` must be a non-empty string, got {command!r}")
    if not all(isinstance(a, str) for a in args):
        raise ValueError(f"{where}: the arguments must be strings, got {args!r}")
    _check_strings(where, "env", env)
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise ValueError(f"{where}: `cwd` must be a non-empty string, got {cwd!r}")
    transport = Stdio(command, tuple(args), dict(env or {}), cwd)
    return _server(where, name, transport, prefix, tools, timeout_s, needs_approval, mode, list_timeout_s)


def http(url: str, *, name: str, headers: Mapping[str, str] | None = None, prefix: str | None = None,
         tools: Sequence[str] | None = None, timeout_s: float | None = None, needs_approval: Any = None,
         mode: Mode = "legacy", list_timeout_s: float = LIST_TIMEOUT_S) -> McpServer:
    """A server at `url` (streamable HTTP, e.g. `http://127.0.0.1:8000/mcp`). A value of the
    wrong kind raises ValueError here, where the app declares it."""
    where = f"parley.mcp.http(name={name!r})"
    if not isinstance(url, str) or not re.match(r"https?://", url):
        raise ValueError(f"{where}: `url` must be an http:// or https:// URL, got {url!r}")
    _check_strings(where, "headers", headers)
    transport = Http(url, dict(headers or {}))
    return _server(where, name, transport, prefix, tools, timeout_s, needs_approval, mode, list_timeout_s)


def _server(where: str, name: Any, transport: Stdio | Http, prefix: Any, tools: Any, timeout_s: Any,
            needs_approval: Any, mode: Any, list_timeout_s: Any) -> McpServer:
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise ValueError(f"{where}: `name` must be 1-32 characters of A-Z a-z 0-9 _ -, got {name!r}")
    if prefix is not None and (not isinstance(prefix, str)
                               or not re.fullmatch(r"[A-Za-z0-9_.:-]{0,32}", prefix)):
        raise ValueError(f"{where}: `prefix` must be up to 32 characters of A-Z a-z 0-9 _ . : -, "
                         f"got {prefix!r}")
    if tools is not None and (isinstance(tools, str) or not isinstance(tools, Sequence)
                              or not tools or not all(isinstance(t, str) and t for t in tools)):
        raise ValueError(f"{where}: `tools` must be a non-empty list of the server's tool names, "
                         f"got {tools!r}")
    for attr, value in (("timeout_s", timeout_s), ("list_timeout_s", list_timeout_s)):
        if value is not None and not _is_seconds(value):
            raise ValueError(f"{where}: `{attr}` must be a number of seconds > 0, got {value!r}")
    if needs_approval not in (None, False):
        try:
            parse_policy(needs_approval)
        except PolicyError as exc:
            raise ValueError(f"{where}: `needs_approval` {exc}") from None
    if mode not in MODES:
        raise ValueError(f"{where}: `mode` must be one of {', '.join(MODES)}, got {mode!r}")
    return McpServer(name=name, transport=transport, prefix=prefix,
                     tools=None if tools is None else tuple(tools), timeout_s=timeout_s,
                     needs_approval=needs_approval if needs_approval not in (None, False) else None,
                     mode=mode, list_timeout_s=float(list_timeout_s))


def _check_strings(where: str, attr: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in value.items()):
        raise ValueError(f"{where}: `{attr}` must map strings to strings")


def _is_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and value > 0
