"""`parley.mcp`: the MCP servers whose tools become an app's tools (docs/mcp.md).

    import parley.mcp

    mcp_servers = [parley.mcp.stdio("python", "-m", "files_server", name="files"),
                   parley.mcp.http("http://127.0.0.1:8000/mcp", name="search", timeout_s=30)]
"""

from parley.workers.mcp import Http, McpServer, Stdio, http, stdio

__all__ = ["Http", "McpServer", "Stdio", "http", "stdio"]
