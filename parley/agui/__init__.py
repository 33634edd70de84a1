"""`parley agui`: Parley sessions as AG-UI agents (docs/agui.md).

A front end speaking AG-UI (the `@ag-ui/client` package, CopilotKit, assistant-ui) posts a run
input; the endpoint turns it into a Parley input (a user message, or resumes of open
interrupts), follows the session's events and token stream, and answers with AG-UI events
over server-sent events. A run ends when the turn completes, or with an AG-UI interrupt
outcome once the session waits for a person.

The pure parts (what a run input asks, how an event reads in AG-UI, which interrupts a
resume answers) have no I/O: `runs`, `translate`, `interrupts`, `messages`. `endpoint` is the
HTTP shell around them.
"""
