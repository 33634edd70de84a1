"""A typed answer's schema is checked with no I/O: a reference to a document outside it is
never fetched, even when the check is reached with one (an older stored interrupt)."""

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from parley.schemas import answers


def test_a_remote_reference_is_never_fetched() -> None:
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"type": "object"}')

        def log_message(self, *_args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/answer.json"
        schema = {"$ref": url}
        assert "inside the schema" in (answers.schema_problem(schema) or "")
        wrong = answers.mismatch(schema, {"approved": True})
        assert wrong is not None and "cannot be resolved" in wrong.message
        assert hits == []
    finally:
        server.shutdown()
