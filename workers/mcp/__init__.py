"""MCP servers whose tools an app uses (docs/mcp.md): declare them with `stdio(...)` and
`http(...)` (also `parley.mcp`). Importing this package does not import the MCP SDK: only an
app that names servers needs it (`pip install 'parley[mcp]'`)."""

from parley.workers.mcp.servers import Http, McpServer, Stdio, http, stdio

__all__ = ["Http", "McpServer", "Stdio", "http", "stdio"]
