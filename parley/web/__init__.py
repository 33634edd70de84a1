"""`parley inbox`: the approvers' web page (docs/inbox.md).

People sign in, see the open interrupts across sessions (and shards) live, read what each asks
and the conversation that led to it, and answer with a form generated from its
`response_schema`; the page sends a signed resume as the signed-in principal and shows what
became of it. The pure parts (forms, sign-in files, CSRF tokens, the conversation's path) are
unit-tested without I/O; `routes/` holds the endpoints by what they serve, and `app.py`
assembles them, the shared state (`state.py`) and the middleware into the Starlette app.
"""
