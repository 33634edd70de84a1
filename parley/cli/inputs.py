"""The inputs to a session: `parley send`, `resume`, `close`, `switch` and `input`.

Each sends one input (signed with --principal/--signing-key, through the submit function with
--producer) and prints its entry id; `resume` and `close` can also wait for its outcome. A
refusal is one line and exit 7, no submit function yet exit 75 (parley/cli/main.py).
"""

from typing import Any

import click
import orjson

from parley.cli.connect import client_of


def _send(ctx: click.Context, session: str, value: dict[str, Any], idem: str | None = None) -> None:
    click.echo(client_of(ctx, sends=True).send(session, value, idem, ctx.obj["principal"], ctx.obj["key"]))


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from None


@click.command()
@click.argument("session")
@click.argument("text")
@click.option("--parent", default=None, help="Parent message id (default: the active head).")
@click.option("--root", is_flag=True, help="Start a new root (parent_id null): an edit of the first message.")
@click.option("--message-id", default=None, help="Choose the new message's id.")
@click.option("--id", "idem", default=None,
              help="Idempotency key of this input: another with the same key is ignored for 24 h.")
@click.pass_context
def send(ctx: click.Context, session: str, text: str, parent: str | None, root: bool,
         message_id: str | None, idem: str | None) -> None:
    """Send a user message to SESSION (creates the session if needed)."""
    value: dict[str, Any] = {"type": "message.create", "content": text}
    if root:
        value["parent_id"] = None
    elif parent is not None:
        value["parent_id"] = parent
    if message_id:
        value["message_id"] = message_id
    _send(ctx, session, value, idem)


@click.command()
@click.argument("session")
@click.argument("interrupt_id")
@click.argument("payload", required=False)
@click.option("--id", "idem", default=None, help="Idempotency key of this input.")
@click.option("--wait", is_flag=True,
              help="Wait for what became of the resume, print it, and exit with its code: 0 "
                   "delivered, 3 not delivered, 4 refused, 5 ignored, 6 no outcome in time.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="With --wait: seconds to wait for the outcome.")
@click.pass_context
def resume(ctx: click.Context, session: str, interrupt_id: str, payload: str | None,
           idem: str | None, wait: bool, timeout_s: float) -> None:
    """Resume INTERRUPT_ID of SESSION with an optional JSON PAYLOAD.

    Prints the entry id; with --wait, the outcome (docs/protocol.md, "Waiting for a resume")."""
    answer = _json_arg(payload, "PAYLOAD")
    client = client_of(ctx, sends=True)
    sign = {"idempotency_key": idem, "principal": ctx.obj["principal"], "key": ctx.obj["key"]}
    if not wait:
        click.echo(client.resume(session, interrupt_id, answer, **sign))
        return
    outcome = client.resume(session, interrupt_id, answer, **sign, wait=True, timeout_s=timeout_s)
    click.echo(outcome.describe())
    ctx.exit(outcome.exit_code)


@click.command()
@click.argument("session")
@click.option("--reason", default=None,
              help="Why, reported on session.closed (1-256 characters; default: closed).")
@click.option("--id", "idem", default=None, help="Idempotency key of this input.")
@click.option("--wait", is_flag=True,
              help="Wait for what became of the close, print it, and exit with its code: 0 "
                   "closed, 4 refused, 5 ignored (e.g. already closed), 6 no outcome in time.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="With --wait: seconds to wait for the outcome.")
@click.pass_context
def close(ctx: click.Context, session: str, reason: str | None, idem: str | None, wait: bool,
          timeout_s: float) -> None:
    """Close SESSION: stop everything it runs (model calls, tools, interrupts, sub-agents); it
    takes no more inputs.

    Prints the entry id; with --wait, the outcome (docs/protocol.md, "Waiting for a close")."""
    client = client_of(ctx, sends=True)
    sign = {"idempotency_key": idem, "principal": ctx.obj["principal"], "key": ctx.obj["key"]}
    if not wait:
        click.echo(client.close(session, reason, **sign))
        return
    outcome = client.close(session, reason, **sign, wait=True, timeout_s=timeout_s)
    click.echo(outcome.describe())
    ctx.exit(outcome.exit_code)


@click.command()
@click.argument("session")
@click.argument("head")
@click.pass_context
def switch(ctx: click.Context, session: str, head: str) -> None:
    """Move SESSION's active head to message HEAD."""
    _send(ctx, session, {"type": "branch.switch", "head": head})


@click.command("input")
@click.argument("session")
@click.argument("value")
@click.option("--id", "idem", default=None, help="Idempotency key of this input.")
@click.pass_context
def input_(ctx: click.Context, session: str, value: str, idem: str | None) -> None:
    """Send any input VALUE (a JSON object, docs/protocol.md "Inputs") to SESSION,
    e.g. session.create or tool.result."""
    parsed = _json_arg(value, "VALUE")
    if not isinstance(parsed, dict):
        raise click.BadParameter("VALUE must be a JSON object")
    _send(ctx, session, parsed, idem)
