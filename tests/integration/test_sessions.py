"""The list of sessions on a real redis-server (parley/client/sessions.py; docs/operations.md, "The list
of sessions"): sets written by the outbox's own flush of `Listing` moves, read page by page with
every filter and both orders — no row twice, none missed, even while sessions move between pages
— the errors a bad filter or cursor gets, `parley sessions` itself, and the rebuild of the sets
for sessions an older release created."""

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.inbox import SCAN_FACTOR
from parley.client.sessions import SessionPage
from parley.dispatcher.core.effects import listing_move
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.sessions_rebuild import rebuild
from parley.dispatcher.store import load_script
from parley.schemas.codes import SessionStatus
from parley.schemas.keys import Keys
from parley.schemas.listing import ListingStatus, listed, listing_entries, listing_member
from parley.schemas.state import Core, Interrupt
from tests.forkserver import run_parley

KEYS = Keys()
ACTIVE, PARKED, CLOSED = ListingStatus.ACTIVE, ListingStatus.PARKED, ListingStatus.CLOSED
ROOT = Path(__file__).resolve().parents[2]
BASE = 1_764_558_000_000
TEAMS = ("a", "b", "c")


def core_of(i: int, status: ListingStatus = ListingStatus.ACTIVE) -> Core:
    """Session i: created at BASE + i (two share each millisecond, so ties sort by id), a team
    of three and a tier of two in its metadata, and the status asked for."""
    core = Core(session=f"s-{i:04}", created_at=BASE + i // 2,
                metadata={"team": TEAMS[i % 3], "tier": i % 2, "note": {"not": "indexed"}})
    return with_status(core, status)


def with_status(core: Core, status: ListingStatus) -> Core:
    interrupts = {"int-1": Interrupt(id="int-1", reason="confirm", anchor=None, turn=None, origin=None,
                                     raised_at=core.created_at)} if status is ListingStatus.PARKED else {}
    closed = {"status": SessionStatus.CLOSED, "closed_at": core.created_at + 5} \
        if status is ListingStatus.CLOSED else {"status": SessionStatus.OPEN, "closed_at": None}
    return core.model_copy(update={"interrupts": interrupts, **closed})


def put(r: redis.Redis, outbox: Outbox, core: Core, before: Core | None = None, ver: int = 1) -> None:
    """The session's record as a commit leaves it, and its listing moved by the outbox flush."""
    r.hset(KEYS.meta(core.session), mapping={"ver": ver, "core": core.to_json()})
    where = listed(core)
    assert where is not None
    if where != listed(before):
        outbox.flush_many([(core.session, [listing_move(ver, listed(before), where)])])


STATUS_OF = {0: ACTIVE, 1: PARKED, 2: CLOSED, 3: ACTIVE}


@pytest.fixture
def filled(r: redis.Redis) -> dict[str, Core]:
    outbox = Outbox(r, KEYS)
    cores = {}
    for i in range(120):
        core = core_of(i, STATUS_OF[i % 4])
        put(r, outbox, core)
        cores[core.session] = core
    return cores


def walk(client: Client, limit: int, **where: Any) -> tuple[list[str], int]:
    """Every page of a listing: the sessions in order, and how many pages it took."""
    out: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = client.sessions(limit=limit, cursor=cursor, **where)
        pages += 1
        out += [row.session for row in page.items]
        cursor = page.cursor
        if cursor is None:
            return out, pages


def expected(cores: dict[str, Core], status: set[str] | None = None, team: str | None = None,
             tier: int | None = None, after: int | None = None, before: int | None = None,
             newest_first: bool = False) -> list[str]:
    rows = [c for c in cores.values()
            if (status is None or listed(c).status in status)  # type: ignore[union-attr]
            and (team is None or c.metadata["team"] == team)  # type: ignore[index]
            and (tier is None or c.metadata["tier"] == tier)  # type: ignore[index]
            and (after is None or c.created_at > after) and (before is None or c.created_at < before)]
    rows.sort(key=lambda c: listing_member(c.created_at, c.session), reverse=newest_first)
    return [c.session for c in rows]


@pytest.mark.parametrize("where", [
    {},
    {"status": "parked"},
    {"status": ["active", "closed"]},
    {"metadata": {"team": "b"}},
    {"metadata": {"team": "a", "tier": 1}},
    {"status": "active", "metadata": {"tier": "0"}},  # "0" and 0 are listed alike
    {"created_after": BASE + 10, "created_before": BASE + 40},
    {"status": ["parked", "closed"], "metadata": {"team": "c"}, "created_after": BASE + 5},
    {"newest_first": True},
    {"status": "closed", "newest_first": True, "created_before": BASE + 50},
    {"metadata": {"team": "a"}, "newest_first": True, "created_after": BASE + 20},
], ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "all")
def test_every_filter_pages_in_creation_order_with_no_row_twice_or_missed(
        client: Client, filled: dict[str, Core], where: dict[str, Any]) -> None:
    meta = where.get("metadata", {})
    status = where.get("status")
    want = expected(filled, None if status is None else {status} if isinstance(status, str) else set(status),
                    meta.get("team"), None if "tier" not in meta else int(meta["tier"]),
                    where.get("created_after"), where.get("created_before"), where.get("newest_first", False))
    assert want  # every filter keeps some rows here
    for limit in (1, 7, 1000):
        got, pages = walk(client, limit, **where)
        assert got == want, limit
        assert pages <= len(want) // limit + 2


def test_a_row_carries_status_times_metadata_and_open_interrupts(client: Client,
                                                                  filled: dict[str, Core]) -> None:
    page = client.sessions("closed", limit=1)
    (row,) = page.items
    core = filled[row.session]
    assert row.model_dump() == {"session": core.session, "status": "closed", "created_at": core.created_at,
                                "closed_at": core.created_at + 5, "metadata": core.metadata,
                                "open_interrupts": 0, "parent": None}
    (parked,) = client.sessions("parked", limit=1).items
    assert parked.open_interrupts == 1 and parked.closed_at is None


def test_sessions_moving_between_pages_are_neither_repeated_nor_missed(
        r: redis.Redis, client: Client, filled: dict[str, Core]) -> None:
    outbox = Outbox(r, KEYS)
    order = expected(filled)
    first = client.sessions(limit=10)
    assert [row.session for row in first.items] == order[:10]
    # meanwhile: sessions on either side of the cursor are parked, answered and closed
    for name in (order[3], order[15], order[40], order[41]):
        core = filled[name]
        moved = with_status(core, {ListingStatus.ACTIVE: ListingStatus.PARKED,
                                   ListingStatus.PARKED: ListingStatus.ACTIVE,
                                   ListingStatus.CLOSED: ListingStatus.CLOSED}[listed(core).status])  # type: ignore[union-attr]
        put(r, outbox, moved, before=core, ver=2)
    rest: list[str] = []
    cursor = first.cursor
    while cursor is not None:
        page = client.sessions(limit=10, cursor=cursor)
        rest += [row.session for row in page.items]
        cursor = page.cursor
    assert rest == order[10:]


def test_the_sets_hold_exactly_each_sessions_entries_after_its_moves(r: redis.Redis) -> None:
    outbox = Outbox(r, KEYS)
    core = core_of(1)
    put(r, outbox, core)
    for before, after in [(ACTIVE, PARKED), (PARKED, ACTIVE), (ACTIVE, PARKED), (PARKED, CLOSED)]:
        put(r, outbox, with_status(core, after), before=with_status(core, before), ver=2)
        assert sets_holding(r) == listing_entries(KEYS, with_status(core, after))
    # a flush replayed after a crash (the same move again) changes nothing
    outbox.flush_many([(core.session, [listing_move(9, listed(with_status(core, ListingStatus.PARKED)),
                                                    listed(with_status(core, ListingStatus.CLOSED)))])])  # type: ignore[arg-type]
    assert sets_holding(r) == listing_entries(KEYS, with_status(core, ListingStatus.CLOSED))


def sets_holding(r: redis.Redis) -> set[tuple[str, str]]:
    out = set()
    for name in r.scan_iter(match="parley:sessions:*"):
        out.update((name.decode(), m.decode()) for m in r.zrange(name, 0, -1))
    return out


def test_combined_filters_stop_a_page_short_with_a_cursor_after_a_bounded_scan(r: redis.Redis,
                                                                               client: Client) -> None:
    outbox = Outbox(r, KEYS)
    # many of team a, active; the one parked of team a comes last
    n = 5 * SCAN_FACTOR + 3
    for i in range(n):
        core = Core(session=f"t-{i:03}", created_at=BASE + i, metadata={"team": "a"})
        put(r, outbox, core)
    for i in range(4 * n):  # parked sessions of other teams: the status set is bigger
        core = with_status(Core(session=f"u-{i:03}", created_at=BASE + i, metadata={"team": "z"}),
                           ListingStatus.PARKED)
        put(r, outbox, core)
    last = with_status(Core(session="t-last", created_at=BASE + n, metadata={"team": "a"}), PARKED)
    put(r, outbox, last)
    page = client.sessions("parked", {"team": "a"}, limit=5)
    assert page.items == [] and page.cursor is not None  # scanned 5 x SCAN_FACTOR of team a, stopped
    got, _pages = walk(client, 5, status="parked", metadata={"team": "a"})
    assert got == ["t-last"]


def test_a_bad_filter_or_cursor_is_refused_clearly(client: Client, filled: dict[str, Core]) -> None:
    cursor = client.sessions(limit=1).cursor
    assert cursor is not None
    with pytest.raises(ValueError, match="invalid cursor"):
        client.sessions(cursor="not-a-cursor")
    with pytest.raises(ValueError, match="other filters"):
        client.sessions("parked", cursor=cursor)
    with pytest.raises(ValueError, match="unknown session status"):
        client.sessions("open")
    with pytest.raises(ValueError, match="not indexed"):
        client.sessions(metadata={"note": {"not": "indexed"}})
    with pytest.raises(ValueError, match="limit"):
        client.sessions(limit=0)


def test_a_session_gone_between_the_two_reads_is_left_out(r: redis.Redis, client: Client,
                                                          filled: dict[str, Core]) -> None:
    first = expected(filled)[0]
    r.delete(KEYS.meta(first))  # expired after its member was read (expiry removes both)
    assert client.sessions(limit=3).items[0].session == expected(filled)[1]


def test_the_async_client_pages_the_same(redis_server: Any, client: Client, filled: dict[str, Core]) -> None:
    async def pages() -> list[str]:
        aredis = AsyncRedis.from_url(redis_server.url)
        try:
            aclient, out, cursor = AsyncClient(aredis), [], None
            while True:
                page: SessionPage = await aclient.sessions(["parked", "closed"], {"team": "a"}, limit=4,
                                                           cursor=cursor, newest_first=True)
                out += [row.session for row in page.items]
                if page.cursor is None:
                    return out
                cursor = page.cursor
        finally:
            await aredis.aclose()

    assert asyncio.run(pages()) == walk(client, 4, status=["parked", "closed"], metadata={"team": "a"},
                                        newest_first=True)[0] != []


# ---- the rebuild, for sessions an older release created --------------------------------------------

def test_the_rebuild_lists_old_sessions_exactly_once_in_steps(r: redis.Redis, client: Client) -> None:
    cores = [core_of(i, STATUS_OF[i % 4]) for i in range(37)]
    for core in cores:  # written by an older release: records, no sets
        r.hset(KEYS.meta(core.session), mapping={"ver": 3, "core": core.to_json()})
    r.set("parley:{not-a-record}:idem:k", 1)
    assert client.sessions().items == []
    steps: list[int] = []
    report = rebuild(r, KEYS, batch=5, progress=lambda rep: steps.append(rep.scanned))
    assert (report.scanned, report.listed, report.busy) == (37, 37, 0)
    assert len(steps) > 1 and steps[-1] == 37
    want = set().union(*(listing_entries(KEYS, c) for c in cores))
    assert sets_holding(r) == want
    again = rebuild(r, KEYS)
    assert again.listed == 37 and sets_holding(r) == want  # idempotent
    assert [row.session for row in client.sessions(limit=1000).items] == \
        expected({c.session: c for c in cores})


def test_the_rebuild_never_lists_a_status_a_transition_changed_meanwhile(r: redis.Redis) -> None:
    core = core_of(1, ListingStatus.PARKED)
    r.hset(KEYS.meta(core.session), mapping={"ver": 4, "core": core.to_json()})
    script = load_script(r, "list_session")
    names = sorted(name for name, _m in listing_entries(KEYS, core))
    member = listing_member(core.created_at, core.session)
    # computed from version 3, but a transition committed version 4 meanwhile: nothing is listed
    assert script(keys=[KEYS.meta(core.session), *names], args=[3, member]) == 0
    assert sets_holding(r) == set()
    assert script(keys=[KEYS.meta(core.session), *names], args=[4, member]) == 1
    assert sets_holding(r) == listing_entries(KEYS, core)


# ---- the command ------------------------------------------------------------------------------------

def parley(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return run_parley(["--redis-url", url, *args],
                          text=True, env=env, timeout=60, check=False)


def test_the_command_pages_filters_and_prints_json_or_text(redis_server: Any,
                                                           filled: dict[str, Core]) -> None:
    url = redis_server.url
    first = parley(url, "sessions", "--status", "parked", "--status", "closed", "--meta", "team=a",
                   "--limit", "3", "--json")
    assert first.returncode == 0, first.stderr
    page = orjson.loads(first.stdout)
    want = expected(filled, {"parked", "closed"}, "a")
    assert [row["session"] for row in page["items"]] == want[:3] and page["cursor"]
    second = parley(url, "sessions", "--status", "parked", "--status", "closed", "--meta", "team=a",
                    "--limit", "3", "--json", "--cursor", page["cursor"])
    assert [row["session"] for row in orjson.loads(second.stdout)["items"]] == want[3:6]
    # every session here was created long ago: --older-than keeps them, --newer-than none
    old = orjson.loads(parley(url, "sessions", "--older-than", "60", "--limit", "1000", "--json").stdout)
    assert len(old["items"]) == len(filled) and old["cursor"] is None
    assert orjson.loads(parley(url, "sessions", "--newer-than", "60", "--json").stdout) == \
        {"items": [], "cursor": None}
    # an age reaching back before 1970 is the start of time: nothing older, everything newer
    assert orjson.loads(parley(url, "sessions", "--older-than", "1e12", "--json").stdout) == \
        {"items": [], "cursor": None}
    ancient = parley(url, "sessions", "--newer-than", "1e12", "--limit", "1000", "--json")
    assert ancient.returncode == 0 and len(orjson.loads(ancient.stdout)["items"]) == len(filled)
    text = parley(url, "sessions", "--newest-first", "--limit", "2")
    lines = text.stdout.splitlines()
    newest = expected(filled, newest_first=True)
    assert [line.split("\t")[0] for line in lines[:2]] == newest[:2]
    assert lines[0].split("\t")[1] in ("active", "parked", "closed") and '"team"' in lines[0]
    assert lines[2].startswith("next page: --cursor ")


@pytest.mark.parametrize(("args", "says"), [
    (["--status", "open"], "'open' is not one of"),
    (["--meta", "team"], "not KEY=VALUE"),
    (["--meta", "=a"], "not KEY=VALUE"),
    (["--meta", "team=a", "--meta", "team=b"], "given twice"),
    (["--meta", "team=" + "x" * 200], "Invalid value for --meta: "),
    (["--cursor", "garbage"], "Invalid value for --cursor: invalid cursor"),
    (["--limit", "0"], "--limit"),
    (["--rebuild", "--status", "active"], "--rebuild takes no filter"),
])
def test_bad_input_is_one_clear_error_and_exit_2(redis_server: Any, args: list[str], says: str) -> None:
    out = parley(redis_server.url, "sessions", *args)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr


def test_the_rebuild_command_says_what_it_listed(redis_server: Any, r: redis.Redis, client: Client) -> None:
    for i in range(3):
        core = core_of(i)
        r.hset(KEYS.meta(core.session), mapping={"ver": 1, "core": core.to_json()})
    out = parley(redis_server.url, "sessions", "--rebuild")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "listed 3 of 3 sessions"
    assert len(client.sessions().items) == 3


def test_a_rebuild_by_a_login_that_may_not_scan_says_so(redis_server: Any, r: redis.Redis) -> None:
    r.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-scan"])
    url = redis_server.url.replace("redis://", "redis://reader:pw@")
    out = parley(url, "sessions", "--rebuild")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "needs SCAN" in out.stderr and "administrator" in out.stderr
