"""The long-running processes: `parley dispatcher`, `parley worker` and `parley notify`.

Each runs until SIGTERM or SIGINT and serves /metrics, /healthz and /readyz when given a
`--metrics-port`. With several Redis URLs and no `--shard`, a dispatcher or worker starts one
process per shard instead (parley/cli/per_shard.py).
"""

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click
import redis

from parley.cli.connect import check_shard, connect
from parley.cli.per_shard import (
    await_shards_placement,
    refuse_a_lone_shard,
    resolve_partitions,
    shard_to_serve,
)
from parley.cli.producers import register_producers
from parley.runtime import logs
from parley.runtime.retry import backoff

if TYPE_CHECKING:
    from parley.dispatcher.core import AppInfo
    from parley.dispatcher.keys_reload import KeysReloader
    from parley.schemas.signing import Keyring


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _exit_on_signals_while_starting() -> None:
    """Until RQ's loop installs its own handlers, SIGTERM or SIGINT ends the worker at once, with
    exit code 0: while it loads the app and waits for the shards' placement it has taken no job,
    so there is nothing to finish (an orchestrator may stop a worker that is still starting).
    Without this the signal's default action kills it, and the stop looks like a crash."""

    def handler(_signum: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _reload_keys_on_sighup(keys_file: str | None) -> "KeysReloader | None":
    """SIGHUP reloads the signing keys file (docs/operations.md, "Rotating signing keys"); the
    loop also reloads it when it changes. Without a keys file, SIGHUP is logged and ignored
    rather than ending the dispatcher (its default)."""
    from parley.dispatcher.keys_reload import KeysReloader

    reloader = KeysReloader(keys_file) if keys_file else None

    def handler(_signum: int, _frame: Any) -> None:
        if reloader is not None:
            reloader.request()
        else:
            logging.getLogger("parley.dispatcher").warning("SIGHUP: no keys file to reload")

    signal.signal(signal.SIGHUP, handler)
    return reloader


SHARD = click.option(
    "--shard", envvar="PARLEY_SHARD", type=click.IntRange(0), default=None,
    help="Serve this shard only: its index in the Redis URLs (env PARLEY_SHARD). Without it, "
         "a deployment of several shards is served by one process per shard, started by this one.")

OTEL_ENDPOINT = click.option(
    "--otel-endpoint", envvar="PARLEY_OTEL_ENDPOINT", default=None,
    help="Export OpenTelemetry traces of turns, jobs and interrupts to this OTLP/HTTP traces "
         "endpoint, e.g. http://collector:4318/v1/traces (env PARLEY_OTEL_ENDPOINT; needs the "
         "`otel` extra). Off without it (docs/tracing.md).")


def start_tracing(service: str, endpoint: str | None) -> None:
    from parley.runtime import telemetry

    try:
        telemetry.configure(service, endpoint)
    except telemetry.TelemetryUnavailable as exc:
        raise click.ClickException(str(exc)) from None


METRICS_PORT = click.option(
    "--metrics-port", envvar="PARLEY_METRICS_PORT", type=click.IntRange(1, 65535), default=None,
    help="Serve /metrics, /healthz and /readyz on this port (env PARLEY_METRICS_PORT).")


def idle_block_option(default_ms: int, what: str) -> Callable[[Any], Any]:
    """`--idle-block-ms`: how long one blocking read of an idle process lasts. It bounds how
    soon SIGTERM is acted on when nothing comes (a graceful stop waits out the read); shorter
    costs a few more round trips per second while idle, nothing while busy."""
    return click.option(
        "--idle-block-ms", envvar="PARLEY_IDLE_BLOCK_MS", type=click.IntRange(10, 10_000),
        default=default_ms, show_default=True,
        help=f"How long one blocking read ({what}) waits when nothing comes; an idle process "
             "acts on SIGTERM within about this (env PARLEY_IDLE_BLOCK_MS).")


def _serve_metrics(ctx: click.Context, port: int | None, connection: redis.Redis,
                   checks: Sequence[Callable[[], str | None]] = ()) -> Any:
    from parley.runtime.metrics import Health, serve
    from parley.schemas.keys import Keys

    health = Health(connection, checks=checks)
    if port is not None:
        serve(port, connection, Keys(ctx.obj["prefix"]), health)
    return health


@click.command()
@click.option("--app", envvar="PARLEY_APP", required=True,
              help="The app, `module` or `module:attr` (env PARLEY_APP).")
@click.option("--partitions", type=click.IntRange(1, 1024), default=None,
              help="Partitions to publish in parley:config when none is published yet. Default: "
                   "1 with one Redis URL, 16 with several (room for up to 16 shards).")
@click.option("--lease-ms", type=click.IntRange(1000), default=10_000, show_default=True,
              help="How long a partition's lease lasts without renewal.")
@click.option("--decide-timeout", type=click.FloatRange(0.1), default=30, show_default=True,
              help="Seconds a decide job may run before it fails as decision.failed (timeout).")
@click.option("--llm-timeout", type=click.FloatRange(0.1), default=120, show_default=True,
              help="Seconds an LLM job may run before it fails as llm.failed (timeout).")
@click.option("--tool-timeout", type=click.FloatRange(0.1), default=300, show_default=True,
              help="Seconds a tool job may run (unless the tool sets fn.timeout_s) before it "
                   "fails as the tool error `timeout`.")
@click.option("--subagent-timeout", type=click.FloatRange(0.1), default=3600, show_default=True,
              help="Seconds a sub-agent call waits for its child's report (unless the tool sets "
                   "fn.timeout_s) before it fails as the tool error `timeout` and the child is closed.")
@click.option("--keys-file", envvar="PARLEY_KEYS_FILE", default=None,
              help="JSON {principal: secret or [secrets]} to verify signed inputs with (env "
                   "PARLEY_KEYS_FILE); reloaded on SIGHUP and when it changes.")
@click.option("--require-signing", envvar="PARLEY_REQUIRE_SIGNING", is_flag=True,
              help="Refuse every unsigned input as `unauthorized` (env PARLEY_REQUIRE_SIGNING=1).")
@click.option("--feed-maxlen", envvar="PARLEY_FEED_MAXLEN", type=click.IntRange(1), default=100_000,
              show_default=True,
              help="About how many entries the fleet-wide feed keeps (env PARLEY_FEED_MAXLEN).")
@click.option("--events-maxlen", envvar="PARLEY_EVENTS_MAXLEN", type=click.IntRange(1), default=10_000,
              show_default=True,
              help="About how many events each session's stream keeps (env PARLEY_EVENTS_MAXLEN); "
                   "the archive holds what the stream still holds.")
@click.option("--retention", envvar="PARLEY_RETENTION", type=click.IntRange(0), default=7 * 24 * 3600,
              show_default=True,
              help="Seconds a closed session's keys stay before they are deleted (env PARLEY_RETENTION).")
@click.option("--archive-maxlen", envvar="PARLEY_ARCHIVE_MAXLEN", type=click.IntRange(1), default=10_000,
              show_default=True,
              help="About how many closed sessions the archive stream keeps (env PARLEY_ARCHIVE_MAXLEN).")
@click.option("--no-archive", envvar="PARLEY_NO_ARCHIVE", is_flag=True,
              help="Write no archive entry when a session closes (env PARLEY_NO_ARCHIVE=1).")
@click.option("--idle-timeout", envvar="PARLEY_IDLE_TIMEOUT", type=click.IntRange(1), default=None,
              help="Close an open session after this many seconds without a transition (reason "
                   "`idle`; never while an interrupt with a deadline is open). Default: never "
                   "(env PARLEY_IDLE_TIMEOUT).")
@click.option("--max-input-bytes", envvar="PARLEY_MAX_INPUT_BYTES", type=click.IntRange(1),
              default=1024 * 1024, show_default=True,
              help="Largest `input` field of an entry, in bytes; larger ones are refused `too_large` "
                   "(env PARLEY_MAX_INPUT_BYTES).")
@click.option("--max-pending", envvar="PARLEY_MAX_PENDING", type=click.IntRange(1), default=100,
              show_default=True,
              help="A producer's inputs of one session admitted and not yet applied; the submit "
                   "function refuses more as `rate_limited` (env PARLEY_MAX_PENDING).")
@click.option("--max-messages", envvar="PARLEY_MAX_MESSAGES", type=click.IntRange(1), default=10_000,
              show_default=True,
              help="Messages of one session; a client's message beyond is refused `session_full` "
                   "(env PARLEY_MAX_MESSAGES).")
@click.option("--max-branches", envvar="PARLEY_MAX_BRANCHES", type=click.IntRange(1), default=1_000,
              show_default=True,
              help="Branches (leaves of the message tree) of one session; a client's message that "
                   "would make one more is refused `session_full` (env PARLEY_MAX_BRANCHES).")
@click.option("--unknown-session-ttl", envvar="PARLEY_UNKNOWN_SESSION_TTL", type=click.IntRange(1),
              default=600, show_default=True,
              help="Seconds the keys an input naming no session leaves (its refusal, its idempotency "
                   "key) live (env PARLEY_UNKNOWN_SESSION_TTL).")
@click.option("--register-producer", "register", multiple=True, metavar="NAME[=TENANT]",
              envvar="PARLEY_REGISTER_PRODUCERS",
              help="Register this producer at start (as `parley producers add NAME [--tenant "
                   "TENANT]` does), so a deployment's producers need no separate step; repeat for "
                   "several (env PARLEY_REGISTER_PRODUCERS, separated by spaces).")
@SHARD
@click.option("--replica-acks", envvar="PARLEY_REPLICA_ACKS", type=click.IntRange(0), default=0,
              show_default=True,
              help="Replicas that must hold a batch's transitions (Redis WAIT) before its entries "
                   "are acknowledged and its jobs enqueued, so a failover loses none; 0: off "
                   "(env PARLEY_REPLICA_ACKS).")
@click.option("--replica-ack-timeout-ms", envvar="PARLEY_REPLICA_ACK_TIMEOUT_MS", type=click.IntRange(1),
              default=1000, show_default=True,
              help="How long one WAIT for --replica-acks may take; fewer replicas by then: the batch "
                   "is replayed after a back-off (env PARLEY_REPLICA_ACK_TIMEOUT_MS).")
@idle_block_option(500, "XREADGROUP of the streams")
@METRICS_PORT
@OTEL_ENDPOINT
@click.pass_context
def dispatcher(ctx: click.Context, app: str, partitions: int | None, lease_ms: int, decide_timeout: float,
               llm_timeout: float, tool_timeout: float, subagent_timeout: float, keys_file: str | None,
               require_signing: bool, feed_maxlen: int, events_maxlen: int, retention: int,
               archive_maxlen: int, no_archive: bool, idle_timeout: int | None,
               max_input_bytes: int, max_pending: int, max_messages: int, max_branches: int,
               unknown_session_ttl: int, register: tuple[str, ...], shard: int | None,
               replica_acks: int, replica_ack_timeout_ms: int, idle_block_ms: int,
               metrics_port: int | None, otel_endpoint: str | None) -> None:
    """Run a dispatcher: consume inputs and results, commit transitions, enqueue jobs.

    Several can run: live dispatchers share the partitions (about N / live each), each
    partition read by one lease holder at a time, and take over a dead one's partitions as
    their leases lapse. SIGTERM finishes the current transition and exits 0.

    With several Redis URLs (shards), `--shard i` serves shard i only: the partitions its
    placement puts there. Without it, one dispatcher per shard is started.
    """
    from parley.cli.appinfo import app_info
    from parley.cli.doctor import warn_if_aof_unsafe
    from parley.dispatcher.consume import Dispatcher
    from parley.dispatcher.core import AdmissionLimits, Lifecycle, Limits
    from parley.dispatcher.replicas import ReplicaPolicy
    from parley.schemas.keys import Keys
    from parley.schemas.producers import ProducerError, parse_registration
    from parley.schemas.signing import Keyring
    from parley.workers.app import AppError, load_agents, load_app

    shard = shard_to_serve(ctx, shard, metrics_port)
    try:
        loaded = load_app(app)
        info = app_info(loaded)
        agents = {spec: app_info(a) for spec, a in load_agents(loaded).items()}
    except AppError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        registrations = [parse_registration(spec) for spec in register]
    except ProducerError as exc:
        raise click.BadParameter(str(exc), param_hint="--register-producer") from None
    stop = _stop_on_signals()
    limits = Limits(decide_timeout_s=decide_timeout, llm_timeout_s=llm_timeout,
                    tool_timeout_s=tool_timeout, subagent_timeout_s=subagent_timeout)
    try:
        keyring = Keyring.load(keys_file, require_signing)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"signing keys: {exc}") from None
    check_approvers([info, *agents.values()], keyring, keys_file)
    start_tracing("parley-dispatcher", otel_endpoint)
    if shard is None:
        refuse_a_lone_shard(ctx)
    partitions = resolve_partitions(ctx, shard, partitions)
    d = Dispatcher(connect(ctx, shard), Keys(ctx.obj["prefix"]), info, partitions=partitions,
                   lease_ms=lease_ms, limits=limits, keyring=keyring, agents=agents,
                   feed_maxlen=feed_maxlen, events_maxlen=events_maxlen,
                   archive_maxlen=0 if no_archive else archive_maxlen,
                   lifecycle=Lifecycle(retention_ms=retention * 1000,
                                       idle_timeout_ms=None if idle_timeout is None else idle_timeout * 1000),
                   admission=AdmissionLimits(input_bytes=max_input_bytes, pending=max_pending,
                                             messages=max_messages, branches=max_branches),
                   unknown_session_ttl_ms=unknown_session_ttl * 1000, shard=shard,
                   replicas=ReplicaPolicy(replica_acks, replica_ack_timeout_ms), block_ms=idle_block_ms)
    # not ready while replicas hold back every settle; and say so at once if they are missing
    d.health = _serve_metrics(ctx, metrics_port, d.redis, checks=[d.replicas.readiness])
    d.replicas.warn_if_short()
    warn_if_aof_unsafe(d.redis)
    register_producers(d.redis, d.keys, registrations)
    reloader = _reload_keys_on_sighup(keys_file)
    if reloader is not None:
        d.decoder.reload_keys = reloader.poll
    on = "" if shard is None else f", shard {shard}"
    click.echo(f"parley dispatcher {d.name} started (app {app}{on})", err=True)
    d.run(stop)
    click.echo(f"parley dispatcher {d.name} stopped: applied={d.stats.applied} "
               f"replays={d.stats.replays} rejected={d.stats.rejected}", err=True)


def check_approvers(apps: "Sequence[AppInfo]", keyring: "Keyring", keys_file: str | None) -> None:
    """A tool whose approvers sign their answers needs signing on: without a keys file no resume
    has a principal, and no call of it could ever run, so the dispatcher does not start. An
    approver missing from the keys file is only warned about: a reload (SIGHUP) may add it."""
    approvers = sorted({p for app in apps for tool in app.tools.values() if tool.approval is not None
                        for p in tool.approval.approvers or ()})
    if approvers and not keys_file:
        raise click.ClickException(
            f"tools with `needs_approval` name approvers ({', '.join(approvers)}), whose resumes "
            "must be signed: start the dispatcher with --keys-file (env PARLEY_KEYS_FILE)")
    unknown = [p for p in approvers if not keyring.secrets_of(p)]
    if unknown:
        logging.getLogger("parley.dispatcher").warning(
            "approvers not in the keys file: their approvals are refused until it names them",
            extra=logs.kv(approvers=unknown))


@click.command()
@click.option("--app", envvar="PARLEY_APP", required=True,
              help="The app, `module` or `module:attr` (env PARLEY_APP).")
@click.option("--queues", default="decide,llm,tools", show_default=True,
              help="Comma-separated queues to serve, in priority order.")
@click.option("--name", default=None, help="Worker name (default: RQ's).")
@click.option("--burst", is_flag=True, help="Exit when the queues are empty.")
@SHARD
@click.option("--replica-acks", envvar="PARLEY_REPLICA_ACKS", type=click.IntRange(0), default=0,
              show_default=True,
              help="Replicas that must hold each job's take before it runs, and each outcome "
                   "posted, else it is posted again (Redis WAIT), so a failover loses none and "
                   "runs none twice; 0: off (env PARLEY_REPLICA_ACKS, as the "
                   "dispatcher's).")
@idle_block_option(1000, "BLPOP of the queues")
@METRICS_PORT
@OTEL_ENDPOINT
@click.pass_context
def worker(ctx: click.Context, app: str, queues: str, name: str | None, burst: bool,
           shard: int | None, replica_acks: int, idle_block_ms: int, metrics_port: int | None,
           otel_endpoint: str | None) -> None:
    """Run a worker: execute decide, LLM and tool jobs of the app, post their outcomes.

    Non-forking (see docs/design.md). SIGTERM lets the current job finish, then exits.
    With several Redis URLs (shards), `--shard i` serves shard i's queues only; without it,
    one worker per shard is started.
    """
    from parley.runtime.replicas import ReplicaPolicy
    from parley.schemas.keys import Keys
    from parley.workers.app import AppError, load_agents, load_app
    from parley.workers.heartbeat import Heartbeat
    from parley.workers.jobs import set_app, set_replica_policy, set_worker_id
    from parley.workers.worker import make_worker, worker_id

    shard = shard_to_serve(ctx, shard, metrics_port)
    _exit_on_signals_while_starting()
    start_tracing("parley-worker", otel_endpoint)
    try:
        main_app = load_app(app)
        set_app(main_app, load_agents(main_app))
    except AppError as exc:
        raise click.ClickException(str(exc)) from None
    keys = Keys(ctx.obj["prefix"])
    names = [keys.queue(q.strip()) for q in queues.split(",") if q.strip()]
    if shard is not None:
        await_shards_placement(ctx)
    else:
        refuse_a_lone_shard(ctx)
    connection = connect(ctx, shard)
    ident = name or worker_id()
    heartbeat = Heartbeat(connection, keys.worker_alive(ident), _serve_metrics(ctx, metrics_port, connection))
    heartbeat.beat()
    heartbeat.start()
    set_worker_id(ident)
    set_replica_policy(ReplicaPolicy(replica_acks))
    try:
        _work_until_stopped(
            lambda n: make_worker(names, connection, name=ident if n == 0 else f"{ident}-{n}", keys=keys,
                                  block_s=idle_block_ms / 1000),
            burst)
    finally:
        heartbeat.stop()


def _work_until_stopped(new_worker: Any, burst: bool) -> None:
    """RQ's loop survives Redis outages while it waits for a job, but quits when one hits its
    bookkeeping around a job. Start it again (as a new RQ worker), with backoff, until asked to stop."""
    import logging

    log = logging.getLogger("parley.worker")
    restarts = 0
    while True:
        w = None
        try:
            w = new_worker(restarts)  # RQ's constructor talks to Redis too
            w.work(burst=burst, logging_level=logging.getLevelName(logging.getLogger().level),
                   with_scheduler=False)
            return
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
            if w is not None and w._stop_requested:
                return
            restarts += 1
            delay = backoff(restarts, base=0.25, cap=5.0, jitter=True)
            log.warning("redis unavailable; restarting the worker loop",
                        extra=logs.kv(error=repr(exc), backoff_s=delay, restarts=restarts))
            stop = _stop_on_signals()
            if stop.wait(delay):
                return


@click.command()
@click.option("--webhook", "url", envvar="PARLEY_WEBHOOK_URL", required=True,
              help="POST each feed entry here as JSON (env PARLEY_WEBHOOK_URL).")
@click.option("--secret-file", envvar="PARLEY_WEBHOOK_SECRET_FILE", default=None,
              help="File holding the signing secret (env PARLEY_WEBHOOK_SECRET_FILE); without it "
                   "the secret is read from env PARLEY_WEBHOOK_SECRET. Never taken on the command line.")
@click.option("--group", default="parley-notify", show_default=True,
              help="Consumer group on the feed: forwarders of one group share its entries.")
@click.option("--name", default=None, help="Consumer name (default: host-pid-random).")
@click.option("--types", default=None,
              help="Comma-separated event types to post (default: all); the rest are acknowledged.")
@click.option("--max-attempts", type=click.IntRange(1), default=8, show_default=True,
              help="POSTs of one entry before it goes to the dead-letter stream.")
@click.option("--timeout", type=click.FloatRange(0.1), default=10, show_default=True,
              help="Seconds one POST may take.")
@click.option("--retry-base", type=click.FloatRange(0.01), default=0.5, show_default=True,
              help="First retry waits up to this many seconds, doubling each time.")
@click.option("--retry-cap", type=click.FloatRange(0.01), default=30, show_default=True,
              help="No retry waits longer than this many seconds.")
@click.option("--claim-idle", type=click.FloatRange(0.1), default=60, show_default=True,
              help="Seconds an entry may stay unacknowledged by its forwarder before another "
                   "forwarder takes it over.")
@click.option("--shard", type=click.IntRange(0), default=None,
              help="Forward this shard's feed only (its index in the Redis URLs). Default: every "
                   "shard's, in time order across shards.")
@METRICS_PORT
@click.pass_context
def notify(ctx: click.Context, url: str, secret_file: str | None, group: str, name: str | None,
           types: str | None, max_attempts: int, timeout: float, retry_base: float,
           retry_cap: float, claim_idle: float, shard: int | None, metrics_port: int | None) -> None:
    """Forward the fleet-wide feed to a webhook: signed JSON POSTs, retried with backoff,
    dead-lettered after --max-attempts. Several may run: they share the feed through a consumer
    group. With several shards, every shard's feed is forwarded, in time order across shards
    within each read round (each shard's own group and dead-letter stream on that shard), or
    one shard's with --shard. SIGTERM stops it; an entry not yet acknowledged is taken over by
    another forwarder."""
    import os

    from parley.fleet.notify import Forwarder, NotifyConfig, TimeOrdered, load_secret
    from parley.runtime.metrics import Health, serve
    from parley.schemas.events import FEED_EVENT_TYPES
    from parley.schemas.keys import Keys

    try:
        secret = load_secret(secret_file, os.environ.get("PARLEY_WEBHOOK_SECRET"))
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"webhook secret: {exc}") from None
    wanted = frozenset(t.strip() for t in types.split(",") if t.strip()) if types else None
    if wanted is not None and (unknown := wanted - FEED_EVENT_TYPES):
        # a misspelt type would have every entry acknowledged and none posted, silently
        raise click.BadParameter(f"{', '.join(sorted(unknown))}: not on the feed; its types are "
                                 f"{', '.join(sorted(FEED_EVENT_TYPES))}", param_hint="--types")
    try:
        config = NotifyConfig(url=url, secret=secret, group=group, consumer=name or "", types=wanted,
                              max_attempts=max_attempts, timeout_s=timeout, retry_base_s=retry_base,
                              retry_cap_s=retry_cap, claim_idle_ms=int(claim_idle * 1000))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--claim-idle") from None
    check_shard(ctx, shard)
    stop = _stop_on_signals()
    keys = Keys(ctx.obj["prefix"])
    indexes = [shard] if shard is not None else list(range(len(ctx.obj["urls"])))
    connections = [connect(ctx, i) for i in indexes]
    for connection in connections:
        connection.ping()  # a Redis unusable at start is one line and exit 69, as for every command
    # one forwarder per shard's feed; the readiness beat is shared (any loop turning), the
    # counters are the process's (one `--shard` process per shard counts each apart)
    health = Health(connections[0])
    forwarders = [Forwarder(connection, keys, config) for connection in connections]
    for forwarder in forwarders:
        forwarder.health = health
    if metrics_port is not None:
        serve(metrics_port, connections[0], keys, health, redis_state=False)
    where = f"shard {shard}" if shard is not None else f"{len(indexes)} shard(s)"
    click.echo(f"parley notify {forwarders[0].consumer} started (feed {keys.feed} of {where}, "
               f"group {group})", err=True)
    # several shards: one loop, posting each round of reads in time order across the shards
    (forwarders[0] if len(forwarders) == 1 else TimeOrdered(forwarders)).run(stop)
    click.echo(f"parley notify {forwarders[0].consumer} stopped", err=True)
