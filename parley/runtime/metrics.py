"""Prometheus metrics and health endpoints, served by every dispatcher and worker.

What each metric means: docs/operations.md, "Metrics".

Counters and histograms count what this process did. Gauges that describe Redis state
(open interrupts, parked branches, held decisions, stream lag, queue depths) are read
from Redis at scrape time by `RedisStateCollector`, so every process reports the same
fleet-wide truth and nothing is summed across processes by hand.

Workers are non-forking (docs/design.md), so one process holds its own counters: no
prometheus-client multiprocess mode is needed.
"""

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from redis import Redis

from parley.schemas.events import FEED_EVENT_TYPES
from parley.schemas.keys import Keys

REGISTRY = CollectorRegistry()

INPUTS = Counter("parley_inputs_total", "Inputs by type and outcome (applied, refused, ignored, rejected)",
                 ["type", "outcome", "code"], registry=REGISTRY)
TRIGGERS = Counter("parley_triggers_total", "Triggers fired, by type", ["type"], registry=REGISTRY)
ACTIONS = Counter("parley_actions_total", "Actions applied, by type", ["type"], registry=REGISTRY)
INTERRUPTS_RAISED = Counter("parley_interrupts_raised_total", "Interrupts raised", ["scope"],
                            registry=REGISTRY)
INTERRUPTS_RESUMED = Counter("parley_interrupts_resumed_total", "Interrupts resumed, by whether decide "
                             "got the trigger", ["delivered"], registry=REGISTRY)
LLM_VOIDED = Counter("parley_llm_voided_total", "LLM calls voided by a park", registry=REGISTRY)
RESULTS_DROPPED = Counter("parley_results_dropped_total", "Work outcomes dropped (late, stale, voided)",
                          ["reason"], registry=REGISTRY)
APPROVALS = Counter("parley_approvals_total", "Approvals of tools with needs_approval: asked, "
                    "granted, denied, timed_out, withdrawn", ["outcome"], registry=REGISTRY)
#: the outcomes of an approval question, counted by the core as ("approval", outcome)
APPROVAL_OUTCOMES = ("asked", "granted", "denied", "timed_out", "withdrawn")
WORK_RETRIED = Counter("parley_work_retried_total", "Jobs retried after their worker was lost", ["kind"],
                       registry=REGISTRY)
WORK_GIVEN_BACK = Counter("parley_work_given_back_total", "Jobs issued again because the worker that "
                          "took them gave them back unrun (signed with the job's token)", ["kind"],
                          registry=REGISTRY)
WORK_LOST = Counter("parley_work_lost_total", "Jobs found held by a dead worker", ["kind"],
                    registry=REGISTRY)
TRANSITIONS = Counter("parley_transitions_total", "Transitions committed (replays excluded)",
                      registry=REGISTRY)
SWEEP_ERRORS = Counter("parley_sweep_errors_total", "Sweeps Redis refused (an ACL missing a command, a "
                       "script error): the dispatcher goes on applying inputs", ["sweep"], registry=REGISTRY)
PENDING_SKIPPED = Counter("parley_pending_counts_skipped_total", "Pending counts a dispatcher could not "
                          "take one off: the producer's pending hash missing or not a hash, or its count "
                          "not an integer it can decrement (skipped, never failing the acknowledgement)",
                          registry=REGISTRY)
PRODUCER_STREAMS_UNUSABLE = Gauge("parley_producer_streams_unusable", "Registered producers' input streams "
                                  "that exist as another type than a stream: left out of the read (their "
                                  "producer is not served) until an operator deletes the key",
                                  registry=REGISTRY)
REPLAYS = Counter("parley_replays_total", "Entries found already applied (after a crash)", registry=REGISTRY)
REPLICA_ACK_TIMEOUTS = Counter("parley_replica_ack_timeouts_total", "Batches left unacknowledged because "
                               "fewer replicas than --replica-acks held them in time (replayed later)",
                               registry=REGISTRY)
TRANSITION_SECONDS = Histogram("parley_transition_seconds",
                               "Load, apply and commit of the wave an entry was in",
                               buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1),
                               registry=REGISTRY)
RESUME_WAIT = Histogram("parley_interrupt_wait_seconds", "Time from raise to resume",
                        buckets=(1, 5, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600),
                        registry=REGISTRY)
JOB_SECONDS = Histogram("parley_job_seconds", "Duration of decide, LLM and tool jobs on a worker",
                        ["kind"], buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 30, 120, 600),
                        registry=REGISTRY)
JOBS = Counter("parley_jobs_total", "Jobs a worker ran, by kind and outcome (ok, error, stopped; asked: "
               "a tool that asked a question from its code)",
               ["kind", "outcome"], registry=REGISTRY)
JOBS_REFUSED = Counter("parley_jobs_refused_total", "Jobs a worker dropped unrun, by reason: not_issued (no "
                       "dispatcher issued it: no in-flight record), changed (not the function and arguments "
                       "it issued), foreign_function (naming a function outside Parley's own)",
                       ["reason"], registry=REGISTRY)
DECISIONS_FAILED = Counter("parley_decisions_failed_total", "Decisions that failed (decision.failed: "
                           "decide raised or timed out, or returned an invalid decision)", registry=REGISTRY)
LLM_FAILED = Counter("parley_llm_failed_total", "Model calls that failed (llm.failed)", registry=REGISTRY)
INTERRUPTS_TIMED_OUT = Counter("parley_interrupts_timed_out_total", "Interrupts resumed by their deadline "
                               "(interrupt.resumed with timed_out)", registry=REGISTRY)
SESSIONS_EXPIRED = Counter("parley_sessions_expired_total", "Closed sessions deleted once their retention "
                           "ended (every key of theirs)", registry=REGISTRY)
IDLE_CLOSES = Counter("parley_idle_closes_total", "Idle closes the idle sweep wrote (a session active "
                      "since ignores its close: not_idle)", registry=REGISTRY)
KEYS_RELOADS = Counter("parley_keys_reloads_total", "Reloads of the signing keys file (on SIGHUP or a "
                       "change), by outcome: ok, failed (the keys in use stay)", ["outcome"],
                       registry=REGISTRY)

#: outcomes of `parley_keys_reloads_total` (dispatcher/keys_reload.py)
KEYS_RELOAD_OUTCOMES = ("ok", "failed")
#: the dispatcher's sweeps, in the order a tick runs them: dispatcher/sweeps.py runs them by
#: these names, and their refusals are counted under them
SWEEP_NAMES = ("fire_deadlines", "find_lost_work", "find_unclaimed_work", "expire_sessions",
               "close_idle_sessions")
#: outcomes of `parley_jobs_total` (workers/jobs.py)
JOB_OUTCOMES = ("ok", "error", "stopped")


def _action_types() -> list[str]:
    """Each `Action` model's `type` (schemas/actions.py): one list, read off the union."""
    from typing import get_args

    from parley.schemas.actions import Action

    union = get_args(Action)[0]
    return sorted(model.model_fields["type"].default for model in get_args(union))


def start_dispatcher_series() -> None:
    """Create every dispatcher series whose label values are a known set, at 0: a dashboard or
    an alert then reads 0 from a fresh process instead of "No data" (a series is born on its
    first `.labels()`, which for a failure may be never)."""
    from parley.schemas.codes import DropReason, IgnoreCode, InputOutcome, RefusalCode
    from parley.schemas.inputs import INPUT_TYPES
    from parley.schemas.jobs import JobKind
    from parley.schemas.triggers import TRIGGER_TYPES

    codes_of: dict[InputOutcome, list[str]] = {
        InputOutcome.APPLIED: [""],
        InputOutcome.REFUSED: list(RefusalCode),
        InputOutcome.IGNORED: list(IgnoreCode),
        # the dispatcher's own refusals, before the session is read (schemas/codes.py)
        InputOutcome.REJECTED: [RefusalCode.INVALID_INPUT, RefusalCode.UNAUTHORIZED,
                                RefusalCode.WRONG_TENANT],
    }
    for outcome, codes in codes_of.items():
        # an entry that does not decode has no type: it is counted as `unknown`
        types = sorted(INPUT_TYPES) + (["unknown"] if outcome == InputOutcome.REJECTED else [])
        for input_type in types:
            for code in codes:
                INPUTS.labels(input_type, outcome, code)
    for trigger_type in sorted(TRIGGER_TYPES):
        TRIGGERS.labels(trigger_type)
    for action_type in _action_types():
        ACTIONS.labels(action_type)
    for scope in ("anchored", "global"):
        INTERRUPTS_RAISED.labels(scope)
    for delivered in ("true", "false"):
        INTERRUPTS_RESUMED.labels(delivered)
    for reason in DropReason:
        RESULTS_DROPPED.labels(reason)
    for approval in APPROVAL_OUTCOMES:
        APPROVALS.labels(approval)
    for kind in JobKind:
        WORK_RETRIED.labels(kind)
        WORK_GIVEN_BACK.labels(kind)
        WORK_LOST.labels(kind)
    for sweep in SWEEP_NAMES:
        SWEEP_ERRORS.labels(sweep)
    for reload_outcome in KEYS_RELOAD_OUTCOMES:
        KEYS_RELOADS.labels(reload_outcome)


def start_worker_series() -> None:
    """A worker's known series at 0 (see `start_dispatcher_series`)."""
    from parley.schemas.jobs import JobKind

    for kind in JobKind:
        JOB_SECONDS.labels(kind)
        for outcome in JOB_OUTCOMES:
            JOBS.labels(kind, outcome)

# `parley notify` (parley/fleet/notify.py): the webhook forwarder of the fleet-wide feed
NOTIFY_FORWARDED = Counter("parley_notify_forwarded_total", "Feed entries the webhook took (2xx), by "
                           "event type", ["type"], registry=REGISTRY)
NOTIFY_FAILED = Counter("parley_notify_failed_total", "Webhook POSTs that failed, by why (status: "
                        "not 2xx, timeout, connection)", ["reason"], registry=REGISTRY)
NOTIFY_DEAD = Counter("parley_notify_dead_lettered_total", "Feed entries given up on, copied to the "
                      "dead-letter stream", registry=REGISTRY)
NOTIFY_RECLAIMED = Counter("parley_notify_reclaimed_total", "Feed entries taken over from a forwarder "
                           "that stopped acknowledging them", registry=REGISTRY)
NOTIFY_SECONDS = Histogram("parley_notify_seconds", "Duration of one webhook POST",
                           buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30),
                           registry=REGISTRY)


def init_notify_metrics() -> None:
    """Every label series of the notifier at 0 from the start: dashboards show 0, not no data."""
    for kind in sorted(FEED_EVENT_TYPES):
        NOTIFY_FORWARDED.labels(kind)
    for reason in ("status", "timeout", "connection"):
        NOTIFY_FAILED.labels(reason)


def record_transition(tr: Any, seconds: float) -> None:
    """Count what one committed transition did (`parley.dispatcher.core.Transition`)."""
    TRANSITIONS.inc()
    TRANSITION_SECONDS.observe(seconds)
    if tr.input_outcome is not None:
        INPUTS.labels(*tr.input_outcome).inc()
    for (kind, label), n in tr.counts.items():
        if kind == "trigger":
            TRIGGERS.labels(label).inc(n)
        elif kind == "action":
            ACTIONS.labels(label).inc(n)
        elif kind == "interrupt_raised":
            INTERRUPTS_RAISED.labels(label).inc(n)
        elif kind == "interrupt_resumed":
            INTERRUPTS_RESUMED.labels("true" if label == "delivered" else "false").inc(n)
        elif kind == "llm_voided":
            LLM_VOIDED.inc(n)
        elif kind == "result_dropped":
            RESULTS_DROPPED.labels(label).inc(n)
        elif kind == "work_retried":
            WORK_RETRIED.labels(label).inc(n)
        elif kind == "work_given_back":
            WORK_GIVEN_BACK.labels(label).inc(n)
        elif kind == "approval":
            APPROVALS.labels(label).inc(n)
    for wait in tr.waits:
        RESUME_WAIT.observe(wait)
    _count_failures(tr.events)


def _count_failures(events: list[dict[str, Any]]) -> None:
    """Failures are read off the committed events, which already say all of it: the pure core
    keeps no counter of its own for them."""
    for event in events:
        kind = event.get("type")
        if kind == "decision.failed":
            DECISIONS_FAILED.inc()
        elif kind == "llm.failed":
            LLM_FAILED.inc()
        elif kind == "interrupt.resumed" and event.get("timed_out"):
            INTERRUPTS_TIMED_OUT.inc()


class RedisStateCollector(Collector):
    """Gauges read from Redis when scraped: O(streams + queues), whatever the number of open
    interrupts (their counts are kept with the index by the outbox flush)."""

    def __init__(self, redis: Redis, keys: Keys):
        self.redis = redis
        self.keys = keys

    def collect(self) -> Iterator[GaugeMetricFamily]:
        k = self.keys
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zcard(k.interrupt_index)
            pipe.hget(k.stats, "parked")
            pipe.hget(k.stats, "held")
            pipe.hget(k.config, "partitions")
            pipe.zrange(k.interrupt_index, 0, 0, withscores=True)
            for q in ("decide", "llm", "tools"):
                pipe.llen(f"rq:queue:{k.queue(q)}")
            replies: Any = pipe.execute()
        except Exception:
            return  # Redis away: the process metrics still answer; readiness says the rest
        open_interrupts, parked, held, partitions, oldest = replies[:5]
        yield GaugeMetricFamily("parley_open_interrupts", "Open interrupts across sessions",
                                value=open_interrupts)
        # a global interrupt parks its session's every branch: counted once per session
        yield GaugeMetricFamily("parley_parked_branches", "Distinct parked anchors (global: one per "
                                "session)", value=int(parked or 0))
        age = max(0.0, time.time() - oldest[0][1] / 1000) if oldest else 0.0
        yield GaugeMetricFamily("parley_oldest_open_interrupt_age_seconds", "Age of the oldest open "
                                "interrupt (0 when none is open)", value=age)
        yield GaugeMetricFamily("parley_held_decisions", "Triggers held until their branch is active "
                                "and unparked", value=int(held or 0))
        depth = GaugeMetricFamily("parley_queue_depth", "Jobs waiting in each RQ queue", labels=["queue"])
        for q, n in zip(("decide", "llm", "tools"), replies[5:], strict=True):
            depth.add_metric([q], n)
        yield depth
        n = int(partitions or 1)
        pending = GaugeMetricFamily("parley_stream_pending", "Entries read but not yet acknowledged",
                                    labels=["stream"])
        lag = GaugeMetricFamily("parley_stream_lag", "Entries not yet read by the dispatchers",
                                labels=["stream"])
        for stream in [k.inputs(p, n) for p in range(n)] + [k.results(p, n) for p in range(n)]:
            try:
                groups: Any = self.redis.xinfo_groups(stream)
            except Exception:
                continue
            for g in groups:
                name = g.get("name")
                if (name.decode() if isinstance(name, bytes) else name) != k.GROUP:
                    continue
                pending.add_metric([stream], g.get("pending") or 0)
                lag.add_metric([stream], g.get("lag") or 0)
        yield pending
        yield lag


SHARD_LABEL = "shard"


class ShardLabelled(Collector):
    """Every metric of `inner`, each sample with `shard="<i>"` added: the series of a process
    that serves one shard of a deployment, told apart from the other shards' without every
    metric declaring the label (and every `.labels()` call passing it)."""

    def __init__(self, inner: CollectorRegistry, shard: int):
        self.inner = inner
        self.shard = str(shard)

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [s._replace(labels={**s.labels, SHARD_LABEL: self.shard})
                                for s in family.samples]
            yield labelled


#: what /metrics serves: REGISTRY itself, or (after `set_shard`) a registry of REGISTRY labelled
_served: CollectorRegistry = REGISTRY


def set_shard(shard: int) -> None:
    """From now on every series this process serves on /metrics carries `shard="<shard>"`
    (a process of one shard of several: `--shard i`). The metrics themselves are unchanged;
    the label is added as they are served, so the Redis-state gauges read from this process's
    shard carry it too. Calling it again replaces the label."""
    global _served
    served = CollectorRegistry()
    served.register(ShardLabelled(REGISTRY, shard))
    _served = served


def served() -> CollectorRegistry:
    """The registry /metrics serves (see `set_shard`)."""
    return _served


class Health:
    """Liveness: the process answers. Readiness: Redis answers, the main loop is turning, and
    each of `checks` (a reason not to be ready, or None) passes: e.g. a dispatcher with
    `--replica-acks` whose last settle was refused for want of replicas applies nothing."""

    def __init__(self, redis: Redis, stale_after_s: float = 30,
                 checks: Sequence[Callable[[], str | None]] = ()):
        self.redis = redis
        self.stale_after_s = stale_after_s
        self.last_beat = time.monotonic()
        self.checks = list(checks)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def ready(self) -> tuple[bool, str]:
        try:
            self.redis.ping()
        except Exception as exc:
            return False, f"redis: {exc}"
        if time.monotonic() - self.last_beat > self.stale_after_s:
            return False, "main loop stalled"
        for check in self.checks:
            if (why := check()) is not None:
                return False, why
        return True, "ok"


def serve(port: int, redis: Redis, keys: Keys, health: Health,
          redis_state: bool = True) -> ThreadingHTTPServer:
    """`/metrics`, `/healthz` and `/readyz` on `port`, in a daemon thread. Without `redis_state`
    (the notifier, whose Redis login reads the feed only) no gauge is read from Redis."""
    if redis_state:
        REGISTRY.register(RedisStateCollector(redis, keys))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body, ctype = 404, b"not found\n", "text/plain"
            if self.path == "/metrics":
                status, body, ctype = 200, generate_latest(served()), CONTENT_TYPE_LATEST
            elif self.path == "/healthz":
                status, body = 200, b"ok\n"
            elif self.path == "/readyz":
                ok, why = health.ready()
                status, body = (200 if ok else 503), (why + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            return

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="parley-metrics", daemon=True).start()
    return server


def timed(kind: str) -> Callable[[float, str], None]:
    """For job functions: record one job's duration and outcome (ok, error, asked)."""
    def done(seconds: float, outcome: str) -> None:
        JOB_SECONDS.labels(kind).observe(seconds)
        JOBS.labels(kind, outcome).inc()
    return done
