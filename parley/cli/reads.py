"""The reads: `parley show`, `export`, `watch`, `interrupts` and `sessions`.

They write nothing (but `sessions --rebuild`, which lists what an older release left unlisted):
one session whole, its events as they come, or a page of the open interrupts or of the sessions
across every shard.
"""

import time
from typing import Any

import click
import orjson
import redis

from parley.cli.connect import client_of, connect
from parley.cli.transcript import format_transcript
from parley.client.inbox import DEFAULT_LIMIT, MAX_LIMIT, InterruptFilter


@click.command()
@click.argument("session")
@click.option("--json", "as_json", is_flag=True,
              help='Print the session as JSON (docs/protocol.md, "Reading a session").')
@click.pass_context
def show(ctx: click.Context, session: str, as_json: bool) -> None:
    """Print SESSION: its messages, open interrupts and pending work."""
    view = client_of(ctx).show(session)
    if view is None:
        raise click.ClickException(f"no session {session!r}")
    if as_json:
        click.echo(orjson.dumps(view, option=orjson.OPT_INDENT_2).decode())
        return
    click.echo(format_transcript(view))


#: exit code of `parley export` for a session that has no record (never created, or expired):
#: sysexits.h's EX_NOINPUT, so a script tells it from a failure (1) or an unusable Redis (69)
NO_SUCH_SESSION = 66


@click.command("export")
@click.argument("session")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the JSON to this file instead of stdout (written only once it is read).")
@click.pass_context
def export_(ctx: click.Context, session: str, output: str | None) -> None:
    """Print SESSION whole as indented JSON: messages as a tree, events, open interrupts
    (docs/protocol.md, "Export and archive"). Exit 66 when there is no such session."""
    from parley.client.export import ExportError, NoSuchSession

    try:
        document = client_of(ctx).export(session).to_json(indent=True) + b"\n"
    except NoSuchSession as exc:
        click.echo(f"parley: {exc}", err=True)
        ctx.exit(NO_SUCH_SESSION)
    except ExportError as exc:
        raise click.ClickException(f"session {session!r}: {exc}") from None
    if output is None:
        click.echo(document, nl=False)
        return
    try:
        with open(output, "wb") as out:
            out.write(document)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None


@click.command()
@click.argument("session")
@click.option("--from", "after", default="0-0", show_default=True,
              help="Print only the events after this event id (the first column of a line printed "
                   "before), to go on where a watch stopped.")
@click.option("--until", "until_type", default=None, help="Stop after the first event of this type.")
@click.option("--timeout", type=float, default=None, help="Stop after this many seconds.")
@click.option("--deltas", is_flag=True,
              help="Also print the pieces of model replies as they are generated "
                   "({\"type\": \"llm.delta\", ...} lines, in order among the events).")
@click.pass_context
def watch(ctx: click.Context, session: str, after: str, until_type: str | None,
          timeout: float | None, deltas: bool) -> None:
    """Follow SESSION's events, one JSON object a line."""
    deadline = time.monotonic() + timeout if timeout else None
    for entry_id, event in client_of(ctx).events(session, after, until=deadline, deltas=deltas):
        click.echo(f"{entry_id} {orjson.dumps(event).decode()}")
        if until_type and event.get("type") == until_type:
            return


@click.command()
@click.option("--json", "as_json", is_flag=True,
              help="One JSON array, for scripts; with --limit, one object {items, cursor}.")
@click.option("--session-prefix", default=None, help="Only sessions whose id starts with this.")
@click.option("--reason", default=None, help="Only interrupts raised with this reason.")
@click.option("--older-than", type=click.FloatRange(0), default=None,
              help="Only interrupts open for more than this many seconds.")
@click.option("--principal", default=None,
              help="Only interrupts this principal may resume (its own and those anyone may).")
@click.option("--newest-first", is_flag=True,
              help="Newest first (default: oldest first); with --session-prefix, by session id descending.")
@click.option("--search", default=None,
              help="Only interrupts whose reason, session id or payload holds every word of this "
                   "(in any case).")
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=None,
              help="One page of at most this many rows, and the cursor of the next.")
@click.option("--cursor", default=None,
              help="The page after the one that printed this cursor (same filters and order).")
@click.pass_context
def interrupts(ctx: click.Context, as_json: bool, session_prefix: str | None, reason: str | None,
               older_than: float | None, principal: str | None, newest_first: bool, search: str | None,
               limit: int | None, cursor: str | None) -> None:
    """List open interrupts across all sessions, oldest first unless --newest-first (by session
    id with --session-prefix), read from the index: each page costs the same however many are
    open."""
    now_ms = time.time() * 1000
    where = InterruptFilter(reason=reason, session_prefix=session_prefix, principal=principal,
                            raised_before=None if older_than is None else int(now_ms - older_than * 1000),
                            newest_first=newest_first, text=(search or "").strip() or None)
    client = client_of(ctx)
    try:
        unreachable: list[int] = []
        if limit is None and cursor is None:
            rows, next_cursor = client.interrupts(where), None
        else:
            page = client.interrupt_page(where, limit or DEFAULT_LIMIT, cursor)
            rows, next_cursor = [row.model_dump() for row in page.items], page.cursor
            unreachable = page.unreachable
            _say_unreachable(unreachable)
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        paged = limit is not None or cursor is not None
        out: Any = {"items": rows, "cursor": next_cursor} if paged else rows
        if paged and unreachable:  # only then: the field's absence says every shard answered
            out["unreachable"] = unreachable
        click.echo(orjson.dumps(out).decode())
        return
    for r in rows:
        age = (now_ms - r["raised_at"]) / 1000
        click.echo(f"{r['session']}\t{r['interrupt_id']}\t{r['reason']}\tanchor={r['anchor']}\t"
                   f"open {age:.0f}s")
    if next_cursor is not None:
        click.echo(f"next page: --cursor {next_cursor}")


def _say_unreachable(shards: list[int]) -> None:
    """On stderr, so that --json's output stays the page: shards whose rows a page lacks."""
    if shards:
        click.echo(f"shard(s) {shards} did not answer: this page holds the other shards' rows only", err=True)


def _meta_pair(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for text in values:
        key, eq, value = text.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{text!r} is not KEY=VALUE")
        if key in pairs and pairs[key] != value:
            raise click.BadParameter(f"{key!r} is given twice with different values: no session has both")
        pairs[key] = value
    return pairs


def _sessions_hint(message: str) -> str:
    """The option a `Client.sessions` error is about, by what its message names."""
    for word, option in (("cursor", "--cursor"), ("status", "--status"), ("created_before", "--older-than"),
                         ("created_after", "--newer-than"), ("limit", "--limit")):
        if word in message:
            return option
    return "--meta"


@click.command()
@click.option("--status", "statuses", multiple=True, type=click.Choice(["active", "parked", "closed"]),
              help="Only sessions in this status (repeat for several; default: all). active: open, "
                   "no interrupt waiting; parked: open, an interrupt waiting; closed.")
@click.option("--meta", "metadata", multiple=True, callback=_meta_pair, metavar="KEY=VALUE",
              help="Only sessions created with this metadata value (repeat: all of them). Top-level "
                   "string, integer and boolean values are indexed, matched as text.")
@click.option("--older-than", type=click.FloatRange(0), default=None,
              help="Only sessions created more than this many seconds ago.")
@click.option("--newer-than", type=click.FloatRange(0), default=None,
              help="Only sessions created less than this many seconds ago.")
@click.option("--newest-first", is_flag=True, help="Newest first (default: oldest first).")
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=DEFAULT_LIMIT, show_default=True,
              help="At most this many rows; the cursor of the next page is printed after them.")
@click.option("--cursor", default=None, help="The page after the one that printed this cursor.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object {items, cursor}, for scripts.")
@click.option("--rebuild", is_flag=True,
              help="Instead of listing: list the sessions an older release created, once after "
                   "upgrading (SCAN in steps; needs a login that may SCAN).")
@click.pass_context
def sessions(ctx: click.Context, statuses: tuple[str, ...], metadata: dict[str, str],
             older_than: float | None, newer_than: float | None, newest_first: bool, limit: int,
             cursor: str | None, as_json: bool, rebuild: bool) -> None:
    """List sessions by status, metadata and age, oldest first, one page at a time: each page
    costs the same however many sessions there are."""
    if rebuild:
        _rebuild_sessions(ctx, statuses or metadata or older_than or newer_than or cursor)
        return
    now_ms = int(time.time() * 1000)

    def since(age_s: float | None) -> int | None:
        # an age reaching back before 1970 is the start of time: every session is newer
        return None if age_s is None else max(0, now_ms - int(age_s * 1000))

    try:
        page = client_of(ctx).sessions(statuses or None, metadata, since(newer_than), since(older_than),
                                     limit=limit, cursor=cursor, newest_first=newest_first)
    except ValueError as err:  # a bad cursor, or a --meta pair no session is listed under
        raise click.BadParameter(str(err), param_hint=_sessions_hint(str(err))) from None
    _say_unreachable(page.unreachable)
    if as_json:
        listed: dict[str, Any] = {"items": [row.model_dump(mode="json") for row in page.items],
                                  "cursor": page.cursor}
        if page.unreachable:  # only then: the field's absence says every shard answered
            listed["unreachable"] = page.unreachable
        click.echo(orjson.dumps(listed).decode())
        return
    for row in page.items:
        age = (now_ms - row.created_at) / 1000
        meta = orjson.dumps(row.metadata).decode() if row.metadata else ""
        click.echo(f"{row.session}\t{row.status}\tcreated {age:.0f}s ago\t{meta}".rstrip("\t"))
    if page.cursor is not None:
        click.echo(f"next page: --cursor {page.cursor}")


def _rebuild_sessions(ctx: click.Context, with_filters: Any) -> None:
    from parley.dispatcher.sessions_rebuild import RebuildReport, rebuild
    from parley.schemas.keys import Keys

    if with_filters:
        raise click.UsageError("--rebuild takes no filter nor cursor: it lists every session")
    keys = Keys(ctx.obj["prefix"])
    try:  # each shard lists its own sessions
        reports = [rebuild(connect(ctx, i), keys) for i in range(len(ctx.obj["urls"]))]
    except redis.exceptions.NoPermissionError as err:
        raise click.ClickException(f"this login may not rebuild the list ({err}): it needs SCAN, which "
                                   "no Parley login has; run it with an administrator's") from None
    report = RebuildReport(scanned=sum(r.scanned for r in reports), listed=sum(r.listed for r in reports),
                           busy=sum(r.busy for r in reports))
    click.echo(f"listed {report.listed} of {report.scanned} sessions"
               + (f"; {report.busy} changing under the rebuild are listed by their own transitions"
                  if report.busy else ""))
