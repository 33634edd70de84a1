"""`parley notify` as a real process against a local HTTP server that fails (5xx), stalls (past
the POST timeout) and recovers; a forwarder killed -9 with entries pending, another taking
them over; dead letters after --max-attempts; the signature a receiver checks; the feeds of two
shards forwarded in time order across them."""

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson
import pytest
import redis

from parley.fleet.notify import Forwarder, NotifyConfig, TimeOrdered, verify
from parley.runtime.procs import RedisServer, free_port
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually

SECRET = "webhook-test-secret"
FEED, DEAD, GROUP = "parley:feed", "parley:feed:dead", "parley-notify"

# What the server does with the n-th request (0-based): an HTTP status, or ("stall", seconds,
# status) to answer late.
Behaviour = Callable[[int], Any]


class Receiver:
    """A webhook receiver: checks each signature, records what it answered 2xx to."""

    def __init__(self, behaviour: Behaviour):
        self.behaviour = behaviour
        self.requests: list[str] = []
        self.accepted: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    n = len(receiver.requests)
                    receiver.requests.append(self.headers["Parley-Delivery"])
                    if not verify(SECRET.encode(), self.headers["Parley-Signature"], body, time.time()):
                        receiver.bad_signatures += 1
                what = receiver.behaviour(n)
                if isinstance(what, tuple):
                    _stall, seconds, what = what
                    time.sleep(seconds)
                entry = orjson.loads(body)
                # recorded before the answer goes out: once the forwarder has its 2xx it posts the
                # next entry, whose handler thread could otherwise record it first
                if 200 <= what < 300:
                    with receiver.lock:
                        receiver.accepted.append(entry)
                try:
                    self.send_response(what)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:  # the forwarder gave up (timeout, or it died): not delivered
                    with receiver.lock:
                        receiver.accepted = [a for a in receiver.accepted if a is not entry]

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted_ids(self) -> list[str]:
        with self.lock:
            return [a["id"] for a in self.accepted]


@pytest.fixture
def receivers() -> Iterator[Callable[[Behaviour], Receiver]]:
    made: list[Receiver] = []

    def make(behaviour: Behaviour) -> Receiver:
        made.append(Receiver(behaviour))
        return made[-1]

    yield make
    for rec in made:
        rec.server.shutdown()
        rec.server.server_close()


@pytest.fixture
def two_shards(r: redis.Redis, tmp_path: Any) -> Iterator[list[redis.Redis]]:
    """The test's Redis and a second redis-server, each with the notifier's group on its feed."""
    other = RedisServer(tmp_path / "redis-shard-1").start()
    try:
        shards = [r, redis.Redis.from_url(other.url)]
        for shard in shards:
            shard.xgroup_create(FEED, GROUP, id="0", mkstream=True)
        yield shards
    finally:
        other.stop(kill=True)


def write_feed(r: redis.Redis, n: int, kind: str = "interrupt.raised") -> list[str]:
    """Feed entries as the commit script writes them."""
    ids = []
    for i in range(n):
        event = {"type": kind, "at": i, "interrupt_id": f"int-{i}", "reason": "approval", "payload": {}}
        ids.append(r.xadd(FEED, {"session": f"s-{i}", "type": kind, "event_id": f"{i + 1}-0",
                                 "event": orjson.dumps(event)}).decode())
    return ids


def notify(procs: Procs, url: str, *args: str, metrics_port: int | None = None) -> Any:
    extra = ["--metrics-port", str(metrics_port)] if metrics_port else []
    return procs.start("notify", "examples.seed_app", "--webhook", url, "--timeout", "0.5",
                       "--retry-base", "0.05", "--retry-cap", "0.2", *extra, *args,
                       env={"PARLEY_WEBHOOK_SECRET": SECRET})


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_fails_stalls_recovers_and_delivers_each_entry_once(
        procs: Procs, r: redis.Redis, receivers: Callable[[Behaviour], Receiver]) -> None:
    # two 503s, then one answer later than the POST timeout, then the server is well again
    rec = receivers(lambda n: 503 if n < 2 else ("stall", 1.5, 200) if n == 2 else 200)
    r.xgroup_create(FEED, GROUP, id="0", mkstream=True)
    ids = write_feed(r, 3)
    port = free_port()
    notify(procs, rec.url, metrics_port=port)
    eventually(lambda: len(rec.accepted_ids()) >= 3, timeout=20)
    time.sleep(0.3)
    assert rec.accepted_ids() == ids  # in order, each once
    assert rec.bad_signatures == 0
    assert rec.accepted[0] == {"id": ids[0], "session": "s-0", "type": "interrupt.raised", "event_id": "1-0",
                               "event": {"type": "interrupt.raised", "at": 0, "interrupt_id": "int-0",
                                         "reason": "approval", "payload": {}}}
    eventually(lambda: r.xpending(FEED, GROUP)["pending"] == 0)
    text = scrape(port)
    assert 'parley_notify_failed_total{reason="status"} 2.0' in text
    assert 'parley_notify_failed_total{reason="timeout"} 1.0' in text
    assert 'parley_notify_failed_total{reason="connection"} 0.0' in text  # there from the start
    assert 'parley_notify_forwarded_total{type="interrupt.raised"} 3.0' in text
    assert 'parley_notify_forwarded_total{type="turn.completed"} 0.0' in text
    assert not r.exists(DEAD)


def test_an_entry_failing_max_attempts_times_goes_to_the_dead_letters(
        procs: Procs, r: redis.Redis, receivers: Callable[[Behaviour], Receiver]) -> None:
    rec = receivers(lambda n: 500 if n < 3 else 200)
    r.xgroup_create(FEED, GROUP, id="0", mkstream=True)
    doomed, kept = write_feed(r, 2)
    port = free_port()
    notify(procs, rec.url, "--max-attempts", "3", metrics_port=port)
    eventually(lambda: rec.accepted_ids() == [kept], timeout=20)
    assert rec.requests == [doomed] * 3 + [kept]
    (_dead_id, dead), = r.xrange(DEAD)
    assert dead[b"feed_id"].decode() == doomed and dead[b"error"] == b"status 500"
    assert dead[b"attempts"] == b"3" and dead[b"session"] == b"s-0"
    assert orjson.loads(dead[b"event"])["interrupt_id"] == "int-0"  # the whole entry, kept
    eventually(lambda: r.xpending(FEED, GROUP)["pending"] == 0)
    assert "parley_notify_dead_lettered_total 1.0" in scrape(port)


def test_a_forwarder_killed_with_entries_pending_another_takes_them_over(
        procs: Procs, r: redis.Redis, receivers: Callable[[Behaviour], Receiver]) -> None:
    # the first request hangs until the forwarder that sent it is dead; the rest are answered
    rec = receivers(lambda n: ("stall", 3, 503) if n == 0 else 200)
    r.xgroup_create(FEED, GROUP, id="0", mkstream=True)
    ids = write_feed(r, 5)
    first = procs.start("notify", "examples.seed_app", "--webhook", rec.url, "--timeout", "20",
                        "--name", "first", env={"PARLEY_WEBHOOK_SECRET": SECRET})
    eventually(lambda: len(rec.requests) == 1, timeout=10)
    assert r.xpending(FEED, GROUP)["consumers"] == [{"name": b"first", "pending": 5}]
    first.kill()  # kill -9 with five entries read and none acknowledged
    first.wait()
    procs.forget(first)
    notify(procs, rec.url, "--name", "second", "--claim-idle", "1")
    eventually(lambda: len(rec.accepted_ids()) >= 5, timeout=20)
    time.sleep(0.5)
    assert rec.accepted_ids() == ids  # nothing lost, nothing twice
    eventually(lambda: r.xpending(FEED, GROUP)["pending"] == 0)


def test_a_slow_forwarder_keeps_its_batch_from_being_taken_over(
        procs: Procs, r: redis.Redis, receivers: Callable[[Behaviour], Receiver]) -> None:
    # each answer takes 0.3 s: the first forwarder's batch of 10 takes three claim idle times
    rec = receivers(lambda n: ("stall", 0.3, 200))
    r.xgroup_create(FEED, GROUP, id="0", mkstream=True)
    ids = write_feed(r, 10)
    notify(procs, rec.url, "--name", "slow", "--claim-idle", "1")
    eventually(lambda: len(rec.requests) >= 1, timeout=10)
    notify(procs, rec.url, "--name", "eager", "--claim-idle", "1")
    eventually(lambda: len(rec.accepted_ids()) >= 10, timeout=20)
    time.sleep(1.5)  # a second copy of any entry would arrive meanwhile
    assert rec.accepted_ids() == ids


def test_two_forwarders_share_the_feed_and_post_each_entry_once(
        procs: Procs, r: redis.Redis, receivers: Callable[[Behaviour], Receiver]) -> None:
    rec = receivers(lambda n: 200)
    notify(procs, rec.url, "--name", "a")
    notify(procs, rec.url, "--name", "b")
    eventually(lambda: bool(r.exists(FEED)) and len(r.xinfo_groups(FEED)) == 1, timeout=10)
    ids = write_feed(r, 40, kind="turn.completed")
    eventually(lambda: len(rec.accepted_ids()) >= 40, timeout=20)
    time.sleep(0.3)
    assert sorted(rec.accepted_ids()) == sorted(ids) and len(rec.accepted_ids()) == 40


def test_type_filter_posts_only_the_chosen_types(procs: Procs, r: redis.Redis,
                                                 receivers: Callable[[Behaviour], Receiver]) -> None:
    rec = receivers(lambda n: 200)
    r.xgroup_create(FEED, GROUP, id="0", mkstream=True)
    write_feed(r, 2, kind="turn.completed")
    raised = write_feed(r, 1)
    notify(procs, rec.url, "--types", "interrupt.raised,interrupt.resumed")
    eventually(lambda: r.xpending(FEED, GROUP)["pending"] == 0
               and r.xinfo_groups(FEED)[0]["lag"] == 0, timeout=10)
    eventually(lambda: rec.accepted_ids() == raised)


def test_a_claim_idle_time_shorter_than_a_post_and_a_wait_is_refused(procs: Procs) -> None:
    proc = notify(procs, "http://127.0.0.1:9/x", "--claim-idle", "0.6")
    assert proc.wait(20) == 2
    assert "must exceed the POST timeout plus the longest retry wait" in procs.logs()
    procs.forget(proc)


def test_without_a_secret_it_refuses_to_start(procs: Procs) -> None:
    proc = procs.start("notify", "examples.seed_app", "--webhook", "http://127.0.0.1:9/x")
    assert proc.wait(20) == 1
    assert "no webhook secret" in procs.logs()
    procs.forget(proc)


def test_a_type_that_is_not_on_the_feed_is_refused(procs: Procs) -> None:
    """A misspelt type would have every entry acknowledged and none posted, silently."""
    proc = notify(procs, "http://127.0.0.1:9/x", "--types", "interrupt.raise")
    assert proc.wait(20) == 2
    assert "interrupt.raise: not on the feed" in procs.logs()
    procs.forget(proc)


def test_the_feeds_of_two_shards_are_forwarded_in_time_order_across_them(
        procs: Procs, two_shards: list[redis.Redis], receivers: Callable[[Behaviour], Receiver]) -> None:
    # interleaved in time: entry k is written at millisecond 1000 + k on shard k mod 2, and
    # one entry of each shard shares a millisecond (the tie goes to shard 0)
    order = write_interleaved(two_shards, 20, tie_last=True)
    rec = receivers(lambda n: 200)
    second = two_shards[1].connection_pool.connection_kwargs
    procs.start("notify", "examples.seed_app", "--webhook", rec.url,
                env={"PARLEY_WEBHOOK_SECRET": SECRET,
                     "PARLEY_REDIS_URLS": f"{procs.url} redis://{second['host']}:{second['port']}/0"})
    eventually(lambda: len(rec.accepted_ids()) >= 20, timeout=20)
    with rec.lock:
        assert [a["session"] for a in rec.accepted] == order
    for shard in two_shards:  # each acknowledged on its own shard
        eventually(lambda shard=shard: shard.xpending(FEED, GROUP)["pending"] == 0, timeout=10)


def test_one_notifier_per_shard_delivers_each_entry_once(
        procs: Procs, two_shards: list[redis.Redis], receivers: Callable[[Behaviour], Receiver]) -> None:
    """Issue 35: `notify` scaled out, one process per shard (`--shard i`) and a second one on
    shard 0 in the same group: every entry of both feeds is posted once, each acknowledged on
    its own shard."""
    order = write_interleaved(two_shards, 40)
    rec = receivers(lambda n: 200)
    second = two_shards[1].connection_pool.connection_kwargs
    urls = f"{procs.url} redis://{second['host']}:{second['port']}/0"
    for shard in ("0", "1", "0"):
        procs.start("notify", "examples.seed_app", "--webhook", rec.url, "--shard", shard,
                    env={"PARLEY_WEBHOOK_SECRET": SECRET, "PARLEY_REDIS_URLS": urls})
    eventually(lambda: len(rec.accepted_ids()) >= 40, timeout=30)
    for shard in two_shards:
        eventually(lambda shard=shard: shard.xpending(FEED, GROUP)["pending"] == 0, timeout=10)
    time.sleep(0.5)  # a duplicate would be posted by now
    with rec.lock:
        sessions = [a["session"] for a in rec.accepted]
    assert sorted(sessions) == sorted(order) and len(set(sessions)) == 40, sessions
    # shard 1's one notifier posts its entries in its feed's order (shard 0's two share theirs)
    odd = [x for x in order if int(x.split("-")[1]) % 2 == 1]
    assert [x for x in sessions if x in odd] == odd


def write_interleaved(shards: list[redis.Redis], n: int, tie_last: bool = False) -> list[str]:
    """Feed entries k = 0..n-1 at millisecond 1000 + k on shard k mod 2 (with `tie_last`, the
    last two share a millisecond: the tie goes to shard 0); their sessions in time order."""
    for k in range(n):
        ms = 1000 + k - (1 if tie_last and k == n - 1 else 0)
        event = {"type": "interrupt.raised", "at": k, "interrupt_id": f"int-{k}", "reason": "approval"}
        shards[k % 2].xadd(FEED, {"session": f"s-{k}", "type": "interrupt.raised", "event_id": "1-0",
                                  "event": orjson.dumps(event)}, id=f"{ms}-0")
    return [f"s-{k}" for k in range(n)]


def test_after_an_outage_mid_batch_the_unfinished_entries_go_before_any_read_later(
        two_shards: list[redis.Redis]) -> None:
    """Two shards forwarded together, small batches: Redis fails (an acknowledgement raises) after
    the second POST of the first round. The loop starts again and must post what it had read and
    not finished (both shards' rest of the round) before the entries it reads next; without that
    they waited out the claim idle time while later entries overtook them."""
    shards, second = two_shards, two_shards[1]
    write_interleaved(shards, 24)
    posted: list[str] = []

    def receive(request: httpx.Request) -> httpx.Response:
        posted.append(orjson.loads(request.content)["session"])
        return httpx.Response(200)

    http = httpx.Client(transport=httpx.MockTransport(receive))
    config = NotifyConfig(url="http://receiver.invalid/", secret=SECRET.encode(), batch=4,
                          timeout_s=0.1, retry_base_s=0.05, retry_cap_s=0.1, claim_idle_ms=60_000)
    forwarders = [Forwarder(shard, Keys(), config, http=http) for shard in shards]
    real_xack = second.xack
    failed: list[bool] = []

    def xack_failing_once(*args: Any) -> Any:
        if not failed:
            failed.append(True)
            raise redis.ConnectionError("injected: Redis went away")
        return real_xack(*args)

    second.xack = xack_failing_once  # type: ignore[method-assign]
    stop = threading.Event()
    loop = threading.Thread(target=TimeOrdered(forwarders).run, args=(stop,), daemon=True)
    loop.start()
    try:
        eventually(lambda: len(set(posted)) >= 24, timeout=10)
    finally:
        stop.set()
        loop.join(timeout=5)
    assert failed, "the outage was not injected"
    # s-1's POST went through but its acknowledgement failed: it is posted again (at least
    # once), first; then everything in feed order, none skipped
    assert posted == ["s-0", "s-1", "s-1", *[f"s-{k}" for k in range(2, 24)]]
    for shard in shards:
        assert shard.xpending(FEED, GROUP)["pending"] == 0
