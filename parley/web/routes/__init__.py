"""The inbox's endpoints, by what they serve: `signin` (signing in and out), `listing` (the
list of open interrupts and its live updates), `answers` (one interrupt: its page and the
answer to it), `ops` (health, metrics, the page a Redis outage shows). Each endpoint is a
module-level function of a Starlette `Request`; what they share is `inbox_of(request)`
(parley/web/state.py), and parley/web/app.py assembles them into the application."""
