"""The `parley` command line: one click group, its subcommands and their options."""

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click
import orjson
import redis

from parley import logs
from parley.cli.demo import SEED_APP
from parley.cli.producers import register_producers
from parley.cli.transcript import format_transcript
from parley.inbox import DEFAULT_LIMIT, MAX_LIMIT, InterruptFilter
from parley.producer import InvalidInput, SubmitRefused, SubmitUnavailable
from parley.redis_errors import cluster_message, is_cluster_reply
from parley.retry import backoff
from parley.schemas.shards import PlacementError

if TYPE_CHECKING:
    from parley.dispatcher.keys_reload import KeysReloader

DEFAULT_URL = "redis://localhost:6379/0"


def _connect(ctx: click.Context, shard: int | None = None) -> redis.Redis:
    """A client of one shard (the first when not told): a plain or a redis+sentinel:// URL;
    ClusterNotSupported for a Redis Cluster node (parley/shards.py, `connect_checked`)."""
    from parley.shards import connect_checked

    return connect_checked(ctx.obj["urls"][shard or 0])


def _shards(ctx: click.Context) -> Any:
    """Every shard of the deployment, in order (one with one URL): parley/shards.py."""
    from parley.schemas.keys import Keys
    from parley.shards import Shards

    return Shards([_connect(ctx, i) for i in range(len(ctx.obj["urls"]))], Keys(ctx.obj["prefix"]))


def _check_shard(ctx: click.Context, shard: int | None) -> int | None:
    """`--shard i`: a shard the URLs name (UsageError otherwise)."""
    if shard is not None and shard >= len(ctx.obj["urls"]):
        raise click.UsageError(f"--shard {shard}: there are {len(ctx.obj['urls'])} Redis URLs "
                               f"(shards 0-{len(ctx.obj['urls']) - 1})")
    return shard


def _client(ctx: click.Context, sends: bool = False) -> Any:
    """The client of every shard: a session's calls go to its shard, listings merge them all."""
    from parley.client import Client

    if sends and len(ctx.obj["urls"]) > 1 and ctx.obj["producer"] is None:
        raise click.UsageError("a deployment of several shards takes inputs through the submit "
                               "function: name the producer (--producer or PARLEY_PRODUCER)")
    return Client(_shards(ctx), ctx.obj["prefix"], ctx.obj["producer"])


def _send(ctx: click.Context, session: str, value: dict[str, Any], idem: str | None = None) -> None:
    click.echo(_client(ctx, sends=True).send(session, value, idem, ctx.obj["principal"], ctx.obj["key"]))


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from None


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


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


def _valid_prefix(_ctx: click.Context, _param: click.Parameter, prefix: str) -> str:
    """Every process checks the prefix as it starts, before it connects: a prefix that cannot
    work (schemas/keys.py) would otherwise show up only as jobs failing later."""
    from parley.schemas.keys import check_prefix

    try:
        return check_prefix(prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _valid_producer(_ctx: click.Context, _param: click.Parameter, name: str | None) -> str | None:
    from parley.producer import check_producer

    try:
        return None if name is None else check_producer(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


SHARD = click.option(
    "--shard", envvar="PARLEY_SHARD", type=click.IntRange(0), default=None,
    help="Serve this shard only: its index in the Redis URLs (env PARLEY_SHARD). Without it, "
         "a deployment of several shards is served by one process per shard, started by this one.")

METRICS_PORT = click.option(
    "--metrics-port", envvar="PARLEY_METRICS_PORT", type=click.IntRange(1, 65535), default=None,
    help="Serve /metrics, /healthz and /readyz on this port (env PARLEY_METRICS_PORT).")


def _serve_metrics(ctx: click.Context, port: int | None, connection: redis.Redis,
                   checks: Sequence[Callable[[], str | None]] = ()) -> Any:
    from parley.metrics import Health, serve
    from parley.schemas.keys import Keys

    health = Health(connection, checks=checks)
    if port is not None:
        serve(port, connection, Keys(ctx.obj["prefix"]), health)
    return health


#: exit code of any command that cannot use Redis (down, a wrong address, a refused password);
#: sysexits.h's EX_UNAVAILABLE, apart from click's 1 (an error) and 2 (a usage error)
REDIS_UNAVAILABLE = 69
# Errors that say "this Redis cannot be used", not "this command went wrong": an
# AuthenticationError is a ConnectionError; the wrong-number-of-args kind is a Redis before 6
# given a user name.
#: exit code of send/resume/close/switch/input when the submit function refuses the input
#: (`too_large`, `rate_limited`, `session_full`, `wrong_tenant`, `invalid_input`): nothing was written
SUBMIT_REFUSED = 7
#: exit code when Redis holds no submit function yet: sysexits.h's EX_TEMPFAIL, try again soon
SUBMIT_UNAVAILABLE = 75
#: exit code when a Redis URL names a Redis Cluster node, not supported: sysexits.h's EX_CONFIG
REDIS_CLUSTER = 78
REDIS_UNUSABLE = (redis.ConnectionError, redis.TimeoutError,
                  redis.exceptions.AuthenticationWrongNumberOfArgsError)


def masked_url(url: str) -> str:
    """`url` as it may be shown: its password (in the address or a `password=` query) as ***."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)],
                          safe="*")
        # by hand: urlunsplit drops the `//` of `unix:///path` (an empty host)
        return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    except ValueError:  # not a URL redis-py reads either: show nothing of it
        return "<an invalid URL>"


class ParleyGroup(click.Group):
    """The `parley` group: a Redis any command cannot use is one line and `REDIS_UNAVAILABLE`,
    not a traceback (those are for bugs). Outages a running dispatcher or worker meets are
    waited out by their own loops; this catches what reaches the top, e.g. at start."""

    def invoke(self, ctx: click.Context) -> Any:
        from parley.shards import ClusterNotSupported

        try:
            return super().invoke(ctx)
        except ClusterNotSupported as exc:  # found at connect (INFO cluster)
            click.echo(cluster_message([masked_url(exc.url)]), err=True)
            raise click.exceptions.Exit(REDIS_CLUSTER) from None
        except REDIS_UNUSABLE as exc:
            url = ctx.obj["url"] if isinstance(ctx.obj, dict) else "?"
            click.echo(f"parley: cannot use Redis at {masked_url(url)}: {exc}", err=True)
            raise click.exceptions.Exit(REDIS_UNAVAILABLE) from None
        except InvalidInput as exc:  # the client checks an input before sending: nothing was sent
            raise click.ClickException(str(exc)) from None
        except SubmitRefused as exc:
            click.echo(f"parley: refused {exc.code}: {exc.message}", err=True)
            raise click.exceptions.Exit(SUBMIT_REFUSED) from None
        except SubmitUnavailable as exc:
            click.echo(f"parley: {exc}", err=True)
            raise click.exceptions.Exit(SUBMIT_UNAVAILABLE) from None
        except PlacementError as exc:  # the shards disagree, or hold no placement yet
            raise click.ClickException(f"placement: {exc}") from None
        except redis.ResponseError as exc:  # last: some of the above are ResponseErrors
            if not is_cluster_reply(exc):  # found by a login that may not run INFO
                raise
            urls = ctx.obj["urls"] if isinstance(ctx.obj, dict) else ["?"]
            click.echo(cluster_message([masked_url(u) for u in urls]), err=True)
            raise click.exceptions.Exit(REDIS_CLUSTER) from None


@click.group(cls=ParleyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True,
              help="Say which Redis (password masked) and key prefix the command uses, on stderr.")
@click.option("--redis-url", "redis_urls", multiple=True, envvar=["PARLEY_REDIS_URLS", "PARLEY_REDIS_URL"],
              default=[DEFAULT_URL], show_default=True,
              help="Redis to use; credentials go in the URL. Repeat it, in order, for a deployment "
                   "of several shards (env PARLEY_REDIS_URLS, URLs separated by spaces; or "
                   "PARLEY_REDIS_URL). A redis+sentinel://host:port[,host:port]/service[/db] URL "
                   "follows a Sentinel-managed primary.")
@click.option("--prefix", envvar="PARLEY_PREFIX", default="parley", show_default=True,
              callback=_valid_prefix,
              help="Key prefix of every Parley key (env PARLEY_PREFIX): names of letters, digits, "
                   "'.', '_', '-' joined by single colons, e.g. acme:parley.")
@click.option("--log-level", envvar="PARLEY_LOG_LEVEL", default="INFO", show_default=True)
@click.option("--principal", envvar="PARLEY_PRINCIPAL", default=None,
              help="Sign inputs sent by send/resume/close/switch/input as this principal "
                   "(env PARLEY_PRINCIPAL).")
@click.option("--signing-key", envvar="PARLEY_SIGNING_KEY", default=None,
              help="The principal's secret (env PARLEY_SIGNING_KEY; prefer the environment to argv).")
@click.option("--producer", envvar="PARLEY_PRODUCER", default=None, callback=_valid_producer,
              help="Submit inputs (send/resume/close/switch/input) as this registered producer, "
                   "through the submit function (env PARLEY_PRODUCER); needed where users.acl is "
                   "loaded. Default: write parley:inputs directly (development).")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, redis_urls: tuple[str, ...], prefix: str, log_level: str,
        principal: str | None, signing_key: str | None, producer: str | None) -> None:
    """Parley: agent sessions on RQ worker fleets, with durable interrupts.

    Inputs, events and codes: docs/protocol.md. Interrupt rules: docs/rules.md.
    """
    logs.setup(log_level)
    if (principal is None) != (signing_key is None):
        raise click.UsageError("--principal and --signing-key go together")
    urls = list(redis_urls) or [DEFAULT_URL]
    ctx.obj = {"url": urls[0], "urls": urls, "prefix": prefix, "principal": principal, "key": signing_key,
               "producer": producer}
    if verbose:
        shown = ", ".join(masked_url(u) for u in urls)
        click.echo(f"parley: redis {shown}, prefix {prefix}", err=True)


@cli.command()
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
@METRICS_PORT
@click.pass_context
def dispatcher(ctx: click.Context, app: str, partitions: int | None, lease_ms: int, decide_timeout: float,
               llm_timeout: float, tool_timeout: float, subagent_timeout: float, keys_file: str | None,
               require_signing: bool, feed_maxlen: int, events_maxlen: int, retention: int,
               archive_maxlen: int, no_archive: bool, idle_timeout: int | None,
               max_input_bytes: int, max_pending: int, max_messages: int, max_branches: int,
               unknown_session_ttl: int, register: tuple[str, ...], shard: int | None,
               replica_acks: int, replica_ack_timeout_ms: int, metrics_port: int | None) -> None:
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

    shard = _per_shard(ctx, shard, metrics_port)
    try:
        loaded = load_app(app)
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
    if shard is None:
        _refuse_a_lone_shard(ctx)
    partitions = _resolve_partitions(ctx, shard, partitions)
    d = Dispatcher(_connect(ctx, shard), Keys(ctx.obj["prefix"]), app_info(loaded), partitions=partitions,
                   lease_ms=lease_ms, limits=limits, keyring=keyring, agents=agents,
                   feed_maxlen=feed_maxlen, events_maxlen=events_maxlen,
                   archive_maxlen=0 if no_archive else archive_maxlen,
                   lifecycle=Lifecycle(retention_ms=retention * 1000,
                                       idle_timeout_ms=None if idle_timeout is None else idle_timeout * 1000),
                   admission=AdmissionLimits(input_bytes=max_input_bytes, pending=max_pending,
                                             messages=max_messages, branches=max_branches),
                   unknown_session_ttl_ms=unknown_session_ttl * 1000, shard=shard,
                   replicas=ReplicaPolicy(replica_acks, replica_ack_timeout_ms))
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


@cli.command()
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
@METRICS_PORT
@click.pass_context
def worker(ctx: click.Context, app: str, queues: str, name: str | None, burst: bool,
           shard: int | None, replica_acks: int, metrics_port: int | None) -> None:
    """Run a worker: execute decide, LLM and tool jobs of the app, post their outcomes.

    Non-forking (see docs/design.md). SIGTERM lets the current job finish, then exits.
    With several Redis URLs (shards), `--shard i` serves shard i's queues only; without it,
    one worker per shard is started.
    """
    from parley.replicas import ReplicaPolicy
    from parley.schemas.keys import Keys
    from parley.workers.app import AppError, load_agents, load_app
    from parley.workers.jobs import set_app, set_replica_policy, set_worker_id
    from parley.workers.worker import Heartbeat, make_worker, worker_id

    shard = _per_shard(ctx, shard, metrics_port)
    try:
        main_app = load_app(app)
        set_app(main_app, load_agents(main_app))
    except AppError as exc:
        raise click.ClickException(str(exc)) from None
    keys = Keys(ctx.obj["prefix"])
    names = [keys.queue(q.strip()) for q in queues.split(",") if q.strip()]
    if shard is not None:
        _await_placement(ctx)
    else:
        _refuse_a_lone_shard(ctx)
    connection = _connect(ctx, shard)
    ident = name or worker_id()
    heartbeat = Heartbeat(connection, keys.worker_alive(ident), _serve_metrics(ctx, metrics_port, connection))
    heartbeat.beat()
    heartbeat.start()
    set_worker_id(ident)
    set_replica_policy(ReplicaPolicy(replica_acks))
    try:
        _work_until_stopped(
            lambda n: make_worker(names, connection, name=ident if n == 0 else f"{ident}-{n}", keys=keys),
            burst)
    finally:
        heartbeat.stop()


#: how long a worker of one shard waits for a dispatcher to write the first placement
WORKER_PLACEMENT_WAIT_S = 15.0


def _per_shard(ctx: click.Context, shard: int | None, metrics_port: int | None) -> int | None:
    """The shard this dispatcher or worker serves: None with one Redis URL (as before shards);
    with several and no `--shard`, one child process per shard is run instead, and this process
    exits with their outcome (parley/cli/per_shard.py)."""
    from parley import metrics
    from parley.cli.per_shard import run_per_shard

    urls = ctx.obj["urls"]
    _check_shard(ctx, shard)
    if len(urls) == 1:
        return None
    if shard is None:
        ctx.exit(run_per_shard(len(urls), metrics_port))
    assert shard is not None
    metrics.set_shard(shard)
    return shard


def _refuse_a_lone_shard(ctx: click.Context) -> None:
    """With one Redis URL: refuse to start (exit 1) on a Redis that is a shard of several (its
    config holds `placement` or `shard`). A pod left on one old URL would otherwise lease
    every partition of that shard, ignore moves and sweep frozen partitions. A Redis that
    cannot be used stops the process here, as it would at its first command (exit 69)."""
    from parley.schemas.keys import Keys
    from parley.schemas.shards import PLACEMENT_FIELD, SHARD_FIELD, Placement, PlacementError

    raw, index = _connect(ctx).hmget(Keys(ctx.obj["prefix"]).config, [PLACEMENT_FIELD, SHARD_FIELD])
    if raw is None and index is None:
        return
    try:
        of = f"{Placement.from_json(raw).shards} shards" if raw is not None else "several shards"
    except PlacementError:
        of = "several shards"
    i = int(index) if index is not None else "i"
    raise click.ClickException(f"this Redis is shard {i} of a deployment of {of}: give every shard's "
                               f"URL, in order, and --shard {i}")


def _resolve_partitions(ctx: click.Context, shard: int | None, partitions: int | None) -> int:
    """N to publish: as given, else 1 with one Redis (as before shards), 16 with several. A
    dispatcher of one shard checks the placement every shard holds against its URLs, writing
    the first one on a fresh deployment; one that disagrees refuses to start."""
    from parley.schemas.shards import DEFAULT_SHARDED_PARTITIONS, PlacementError

    if shard is None:
        return partitions or 1
    from parley.dispatcher.engine_key import share_engine_key

    shards = _shards(ctx)
    try:
        placement = shards.check(partitions or DEFAULT_SHARDED_PARTITIONS, create=True)
    except PlacementError as exc:
        raise click.ClickException(f"shard {shard}: {exc}") from None
    share_engine_key(shards.clients, shards.keys, shard)
    return int(placement.partitions)


def _await_placement(ctx: click.Context) -> None:
    """A worker of one shard checks the shards' placement too (the same URLs, in the same
    order), waiting a little for a dispatcher to write the first one."""
    from parley.cli.per_shard import await_placement
    from parley.schemas.shards import PlacementError

    shards = _shards(ctx)
    try:
        await_placement(lambda: shards.check(create=False), WORKER_PLACEMENT_WAIT_S)
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None


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
            delay = backoff(restarts, base=0.25, cap=5.0)
            log.warning("redis unavailable; restarting the worker loop",
                        extra=logs.kv(error=repr(exc), backoff_s=delay, restarts=restarts))
            stop = _stop_on_signals()
            if stop.wait(delay):
                return


@cli.command()
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


@cli.command()
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
    client = _client(ctx, sends=True)
    sign = {"idempotency_key": idem, "principal": ctx.obj["principal"], "key": ctx.obj["key"]}
    if not wait:
        click.echo(client.resume(session, interrupt_id, answer, **sign))
        return
    outcome = client.resume(session, interrupt_id, answer, **sign, wait=True, timeout_s=timeout_s)
    click.echo(outcome.describe())
    ctx.exit(outcome.exit_code)


@cli.command()
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
    client = _client(ctx, sends=True)
    sign = {"idempotency_key": idem, "principal": ctx.obj["principal"], "key": ctx.obj["key"]}
    if not wait:
        click.echo(client.close(session, reason, **sign))
        return
    outcome = client.close(session, reason, **sign, wait=True, timeout_s=timeout_s)
    click.echo(outcome.describe())
    ctx.exit(outcome.exit_code)


@cli.command()
@click.argument("session")
@click.argument("head")
@click.pass_context
def switch(ctx: click.Context, session: str, head: str) -> None:
    """Move SESSION's active head to message HEAD."""
    _send(ctx, session, {"type": "branch.switch", "head": head})


@cli.command("input")
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


@cli.command()
@click.argument("session")
@click.option("--json", "as_json", is_flag=True,
              help='Print the session as JSON (docs/protocol.md, "Reading a session").')
@click.pass_context
def show(ctx: click.Context, session: str, as_json: bool) -> None:
    """Print SESSION: its messages, open interrupts and pending work."""
    view = _client(ctx).show(session)
    if view is None:
        raise click.ClickException(f"no session {session!r}")
    if as_json:
        click.echo(orjson.dumps(view, option=orjson.OPT_INDENT_2).decode())
        return
    click.echo(format_transcript(view))


#: exit code of `parley export` for a session that has no record (never created, or expired):
#: sysexits.h's EX_NOINPUT, so a script tells it from a failure (1) or an unusable Redis (69)
NO_SUCH_SESSION = 66


@cli.command("export")
@click.argument("session")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the JSON to this file instead of stdout (written only once it is read).")
@click.pass_context
def export_(ctx: click.Context, session: str, output: str | None) -> None:
    """Print SESSION whole as indented JSON: messages as a tree, events, open interrupts
    (docs/protocol.md, "Export and archive"). Exit 66 when there is no such session."""
    from parley.export import ExportError, NoSuchSession

    try:
        document = _client(ctx).export(session).to_json(indent=True) + b"\n"
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


@cli.command()
@click.argument("session")
@click.option("--from", "after", default="0-0", show_default=True,
              help="Print only the events after this event id (the first column of a line printed "
                   "before), to go on where a watch stopped.")
@click.option("--until", "until_type", default=None, help="Stop after the first event of this type.")
@click.option("--timeout", type=float, default=None, help="Stop after this many seconds.")
@click.pass_context
def watch(ctx: click.Context, session: str, after: str, until_type: str | None,
          timeout: float | None) -> None:
    """Follow SESSION's events, one JSON object a line."""
    deadline = time.monotonic() + timeout if timeout else None
    for entry_id, event in _client(ctx).events(session, after, until=deadline):
        click.echo(f"{entry_id} {orjson.dumps(event).decode()}")
        if until_type and event.get("type") == until_type:
            return


@cli.command()
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
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=None,
              help="One page of at most this many rows, and the cursor of the next.")
@click.option("--cursor", default=None,
              help="The page after the one that printed this cursor (same filters and order).")
@click.pass_context
def interrupts(ctx: click.Context, as_json: bool, session_prefix: str | None, reason: str | None,
               older_than: float | None, principal: str | None, newest_first: bool, limit: int | None,
               cursor: str | None) -> None:
    """List open interrupts across all sessions, oldest first unless --newest-first (by session
    id with --session-prefix), read from the index: each page costs the same however many are
    open."""
    now_ms = time.time() * 1000
    where = InterruptFilter(reason=reason, session_prefix=session_prefix, principal=principal,
                            raised_before=None if older_than is None else int(now_ms - older_than * 1000),
                            newest_first=newest_first)
    client = _client(ctx)
    try:
        if limit is None and cursor is None:
            rows, next_cursor = client.interrupts(where), None
        else:
            page = client.interrupt_page(where, limit or DEFAULT_LIMIT, cursor)
            rows, next_cursor = [row.model_dump() for row in page.items], page.cursor
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        paged = limit is not None or cursor is not None
        click.echo(orjson.dumps({"items": rows, "cursor": next_cursor} if paged else rows).decode())
        return
    for r in rows:
        age = (now_ms - r["raised_at"]) / 1000
        click.echo(f"{r['session']}\t{r['interrupt_id']}\t{r['reason']}\tanchor={r['anchor']}\t"
                   f"open {age:.0f}s")
    if next_cursor is not None:
        click.echo(f"next page: --cursor {next_cursor}")


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


@cli.command()
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
        page = _client(ctx).sessions(statuses or None, metadata, since(newer_than), since(older_than),
                                     limit=limit, cursor=cursor, newest_first=newest_first)
    except ValueError as err:  # a bad cursor, or a --meta pair no session is listed under
        raise click.BadParameter(str(err), param_hint=_sessions_hint(str(err))) from None
    if as_json:
        click.echo(orjson.dumps({"items": [row.model_dump(mode="json") for row in page.items],
                                 "cursor": page.cursor}).decode())
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
        reports = [rebuild(_connect(ctx, i), keys) for i in range(len(ctx.obj["urls"]))]
    except redis.exceptions.NoPermissionError as err:
        raise click.ClickException(f"this login may not rebuild the list ({err}): it needs SCAN, which "
                                   "no Parley login has; run it with an administrator's") from None
    report = RebuildReport(scanned=sum(r.scanned for r in reports), listed=sum(r.listed for r in reports),
                           busy=sum(r.busy for r in reports))
    click.echo(f"listed {report.listed} of {report.scanned} sessions"
               + (f"; {report.busy} changing under the rebuild are listed by their own transitions"
                  if report.busy else ""))


@cli.command()
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

    from parley.metrics import Health, serve
    from parley.notify import Forwarder, NotifyConfig, TimeOrdered, load_secret
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
    _check_shard(ctx, shard)
    stop = _stop_on_signals()
    keys = Keys(ctx.obj["prefix"])
    indexes = [shard] if shard is not None else list(range(len(ctx.obj["urls"])))
    connections = [_connect(ctx, i) for i in indexes]
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


@cli.command()
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
    from parley.cli.demo import run_demo

    assert ctx.parent is not None
    given = ctx.parent.get_parameter_source("redis_url") != click.core.ParameterSource.DEFAULT
    sys.exit(run_demo(ctx.obj["url"] if given else None, ctx.obj["prefix"], app, answer, message))


def main() -> None:
    cli(auto_envvar_prefix=None)


def _add_groups() -> None:
    from parley.cli.doctor import doctor
    from parley.cli.inbox import inbox
    from parley.cli.inbox_users import inbox_user
    from parley.cli.partitions import partitions
    from parley.cli.producers import producers

    cli.add_command(doctor)
    cli.add_command(producers)
    cli.add_command(partitions)
    cli.add_command(inbox)
    cli.add_command(inbox_user)


_add_groups()
