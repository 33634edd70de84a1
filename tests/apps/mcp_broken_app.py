"""An app whose MCP server cannot start: loading it is one clear error (tests/e2e/test_mcp.py)."""

import parley.mcp

mcp_servers = [parley.mcp.stdio("/nonexistent/mcp-server", "--serve", name="gone")]
