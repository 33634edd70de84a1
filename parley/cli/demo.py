"""`parley demo`: the seed scenario end to end, as a user would run it."""

import secrets
import sys
import tempfile
import time
from pathlib import Path

import click

from parley.cli.transcript import format_transcript
from parley.client import Client
from parley.client.shards import connect_checked
from parley.runtime.procs import RedisServer, start_parley, stop_process
from parley.workers.app import AppError, load_app

TIMEOUT_S = 60
SEED_APP = "examples.seed_app"


@click.command()
@click.option("--app", default=SEED_APP, show_default=True, help="The app to run.")
@click.option("--yes", "answer", flag_value="yes", help="Approve without asking.")
@click.option("--no", "answer", flag_value="no", help="Decline without asking.")
@click.option("--message", default="Email bob@example.com: the launch moved to Friday.",
              show_default=True, help="The user's message.")
@click.pass_context
def demo(ctx: click.Context, app: str, answer: str | None, message: str) -> None:
    """The seed scenario end to end: a dispatcher and a worker, an email the app asks about
    before sending, a human answer, the transcript. Starts a private redis-server unless
    PARLEY_REDIS_URL is set; stops everything it started."""
    assert ctx.parent is not None
    given = ctx.parent.get_parameter_source("redis_urls") != click.core.ParameterSource.DEFAULT
    sys.exit(run_demo(ctx.obj["url"] if given else None, ctx.obj["prefix"], app, answer, message))


def run_demo(url: str | None, prefix: str, app: str, answer: str | None, message: str) -> int:
    try:
        load_app(app)  # here, with a clear message, rather than in the processes it starts
    except AppError as exc:
        hint = (" (the seed app lives in the repository's examples/ folder, which is not installed:"
                " run the demo from a checkout, or pass --app)" if app == SEED_APP else "")
        raise click.ClickException(f"{exc}{hint}") from None
    workdir = Path(tempfile.mkdtemp(prefix="parley-demo-"))
    server = None
    if url is None:
        try:
            server = RedisServer(workdir / "redis").start()
        except (RuntimeError, OSError) as exc:  # not installed, or it would not start
            raise click.ClickException(f"cannot start a private redis-server: {exc} (or set "
                                       "PARLEY_REDIS_URL to a Redis of yours)") from None
        url = server.url
        click.echo(f"started a private redis-server on {url}")
    # checked before anything is started: not a Redis Cluster node (ClusterNotSupported)
    connection = connect_checked(url)
    env = {"PARLEY_REDIS_URL": url, "PARLEY_PREFIX": prefix, "PARLEY_APP": app}
    procs = [start_parley(["dispatcher"], env, workdir / "dispatcher.log"),
             start_parley(["worker"], env, workdir / "worker.log")]
    try:
        return _converse(Client(connection, prefix), answer, message)
    finally:
        for p in procs:
            stop_process(p)
        if server is not None:
            server.stop()
        click.echo(f"stopped everything the demo started (logs in {workdir})")


def _converse(client: Client, answer: str | None, message: str) -> int:
    session = f"demo-{secrets.token_hex(3)}"
    click.echo(f"session {session}\n> user: {message}")
    client.send(session, {"type": "message.create", "content": message})
    deadline = time.monotonic() + TIMEOUT_S
    for _entry, event in client.events(session, until=deadline):
        kind = event["type"]
        if kind == "message.created" and event["message"]["role"] != "user":
            m = event["message"]
            calls = ", ".join(f"{c['name']}({c['arguments']})" for c in m.get("tool_calls") or [])
            click.echo(f"< {m['role']}: {m['content']}{' ' + calls if calls else ''}")
        elif kind == "interrupt.raised":
            question = (event.get("payload") or {}).get("message", event["reason"])
            click.echo(f"! interrupt {event['interrupt_id']} ({event['reason']}): {question}")
            if answer is None and not sys.stdin.isatty():
                click.echo("(no terminal to ask at: approving; pass --no to decline)")
                answer = "yes"
            approved = answer == "yes" if answer else click.confirm(question, default=False)
            click.echo(f"> human: {'yes' if approved else 'no'}")
            client.send(session, {"type": "interrupt.resume", "interrupt_id": event["interrupt_id"],
                                  "payload": {"approved": approved}})
        elif kind in ("decision.failed", "llm.failed", "input.refused"):
            click.echo(f"! {kind}: {event.get('error') or event.get('message')}")
        elif kind == "turn.completed":
            view = client.show(session)
            click.echo("\ntranscript:\n" + format_transcript(view or {}))
            return 0
    click.echo(f"the conversation did not finish within {TIMEOUT_S}s", err=True)
    return 1
