"""Signing keys rotate and are revoked without a restart (docs/operations.md, "Rotating signing
keys"): a dispatcher process reloads its keys file on SIGHUP and when the file changes; an entry
signed with a key added since is accepted, one signed with a key removed since is refused
`unauthorized`, and a file that does not parse keeps the keys in use (logged, counted)."""

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from parley.cli.appinfo import app_info
from parley.client import Client
from parley.dispatcher.entries import EntryDecoder
from parley.dispatcher.keys_reload import KeysReloader
from parley.runtime import metrics
from parley.runtime.procs import free_port
from parley.schemas.signing import Keyring, Unauthorized, signed_fields
from parley.workers.app import load_app
from tests.conftest import Procs, all_events, eventually, of_type
from tests.forkserver import run_parley

SESSION = "acme/rotation"


def write_keys(path: Path, data: object) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def signed_entry(key: str, entry_id: str, value: dict[str, Any], principal: str = "alice") -> dict[Any, Any]:
    raw = orjson.dumps(value)
    return {"session": SESSION, "input": raw, "id": entry_id,
            **signed_fields(key, principal, SESSION, entry_id, raw)}


def message(key: str, entry_id: str) -> dict[Any, Any]:
    # a new root each time: no turn of an earlier message is in the way
    return signed_entry(key, entry_id, {"type": "message.create", "content": entry_id, "parent_id": None})


def outcome_of(client: Client, entry_id: str) -> str:
    """What became of the entry `entry_id`: `applied` (its message was created) or the code of
    its refusal; waits until one of them is there."""
    found: list[str] = []

    def seen() -> bool:
        for event in all_events(client, SESSION):
            if event["type"] == "message.created" and event["message"]["content"] == entry_id:
                found.append("applied")
            elif event["type"] == "input.refused" and event["input"]["entry"] == entries[entry_id]:
                found.append(event["code"])
        return bool(found)

    eventually(seen, timeout=10)
    return found[0]


entries: dict[str, str] = {}


def add(r: redis.Redis, fields: dict[Any, Any]) -> None:
    entry: Any = r.xadd("parley:inputs", fields)
    entries[fields["id"]] = entry.decode()


def reloads_logged(procs: Procs, what: str) -> int:
    return procs.logs().count(what)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_dispatcher_reloads_its_keys_on_sighup_and_on_change(procs: Procs, r: redis.Redis, client: Client,
                                                                tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    write_keys(keys, {"alice": ["old", "zzz"]})
    port = free_port()
    proc = procs.dispatcher("tests.apps.scenarios", "--keys-file", str(keys), "--require-signing",
                            "--metrics-port", str(port))
    add(r, signed_entry("old", "create", {"type": "session.create"}))
    eventually(lambda: "session.created" in [e["type"] for e in all_events(client, SESSION)], timeout=15)
    m = scrape(port)
    assert [m[("parley_keys_reloads_total", (("outcome", o),))] for o in ("ok", "failed")] == [0, 0]
    add(r, message("new", "new-before"))
    assert outcome_of(client, "new-before") == "unauthorized"  # not in the file yet

    # step 1 of a rotation: the new key second, then SIGHUP. The file keeps its size, inode and
    # modification time, so only the signal can make the dispatcher read it again.
    before = os.stat(keys)
    write_keys(keys, {"alice": ["old", "new"]})
    os.utime(keys, ns=(before.st_atime_ns, before.st_mtime_ns))
    time.sleep(3)  # past the dispatcher's next look at the file: it finds it unchanged
    assert reloads_logged(procs, "signing keys reloaded") == 0
    proc.send_signal(signal.SIGHUP)
    eventually(lambda: reloads_logged(procs, "signing keys reloaded") == 1, timeout=10)
    add(r, message("new", "new-added"))
    add(r, message("old", "old-still"))
    assert outcome_of(client, "new-added") == "applied"
    assert outcome_of(client, "old-still") == "applied"

    # revoking: the old key removed from the file; no signal: the dispatcher sees the change
    write_keys(keys, {"alice": ["new"]})
    eventually(lambda: reloads_logged(procs, "signing keys reloaded") == 2, timeout=10)
    add(r, message("old", "old-revoked"))
    add(r, message("new", "new-only"))
    assert outcome_of(client, "old-revoked") == "unauthorized"
    assert outcome_of(client, "new-only") == "applied"

    # a broken file (a half-written edit) keeps the keys in use, logged and counted
    write_keys(keys, '{"alice": ["newer"')
    eventually(lambda: reloads_logged(procs, "signing keys not reloaded") == 1, timeout=10)
    add(r, message("new", "new-kept"))
    add(r, message("newer", "newer-not-yet"))
    assert outcome_of(client, "new-kept") == "applied"
    assert outcome_of(client, "newer-not-yet") == "unauthorized"
    m = scrape(port)
    assert [m[("parley_keys_reloads_total", (("outcome", o),))] for o in ("ok", "failed")] == [2, 1]
    assert "newer" not in procs.logs() and "\"new\"" not in procs.logs()  # secrets are never logged
    refused = of_type(all_events(client, SESSION), "input.refused")
    assert all(e["message"].startswith("unauthorized") for e in refused)
    assert proc.poll() is None  # SIGHUP never ends the dispatcher


@pytest.fixture
def decoder(tmp_path: Path) -> EntryDecoder:
    return EntryDecoder(app_info(load_app("tests.apps.scenarios")), keyring=Keyring({"alice": ("old",)}))


def verify(decoder: EntryDecoder, key: str) -> str | None:
    raw = b'{"type":"session.create"}'
    fields = {"session": SESSION, "input": raw, "id": "k",
              **signed_fields(key, "alice", SESSION, "k", raw)}
    return decoder.keyring.verify(fields, int(time.time() * 1000))  # type: ignore[arg-type]


def test_the_reloader_looks_only_when_due_and_keeps_the_keys_of_a_vanished_file(
        decoder: EntryDecoder, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    write_keys(keys, {"alice": "old"})
    reloader = KeysReloader(str(keys), check_every_s=3600)
    decoder.reload_keys = reloader.poll
    failed = metrics.KEYS_RELOADS.labels(outcome="failed")._value.get()
    write_keys(keys, {"alice": ["new", "old"]})
    decoder.reload_keys_if_due()  # changed, but not yet time to look
    with pytest.raises(Unauthorized):
        verify(decoder, "new")
    reloader.request()  # SIGHUP
    decoder.reload_keys_if_due()
    assert verify(decoder, "new") == "alice" and verify(decoder, "old") == "alice"
    assert reloader.poll(decoder.keyring) is None  # nothing asked, nothing due
    os.unlink(keys)  # a deploy that removes the file by mistake
    reloader.request()
    assert reloader.poll(decoder.keyring) is None
    decoder.reload_keys_if_due()
    assert verify(decoder, "new") == "alice"  # the keys in use stay
    assert metrics.KEYS_RELOADS.labels(outcome="failed")._value.get() == failed + 1
    with pytest.raises(Unauthorized):
        verify(decoder, "other")


def test_a_reload_keeps_the_engine_key_and_the_signing_requirement(decoder: EntryDecoder,
                                                                   tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    write_keys(keys, {"alice": "old"})
    decoder.keyring = Keyring.load(str(keys), required=True).with_engine_key("engine-secret")
    decoder.reload_keys = KeysReloader(str(keys), check_every_s=0).poll
    write_keys(keys, {"alice": "newer"})  # another size: a change whatever the clock's resolution
    decoder.reload_keys_if_due()
    assert (decoder.keyring.required, decoder.keyring.engine_key) == (True, "engine-secret")
    assert decoder.keyring.keys == {"alice": ("newer",)}


def test_sighup_without_a_keys_file_is_logged_and_ignored(procs: Procs, r: redis.Redis) -> None:
    proc = procs.dispatcher("tests.apps.scenarios")
    eventually(lambda: "started" in procs.logs(), timeout=15)
    proc.send_signal(signal.SIGHUP)
    eventually(lambda: "SIGHUP: no keys file to reload" in procs.logs(), timeout=10)
    assert proc.poll() is None  # still running (SIGHUP's default would have ended it)


@pytest.mark.parametrize(("content", "message"), [
    ('{"alice": []}', "principal 'alice'"),
    ('{"alice": ["new"', "not JSON"),
    (None, "No such file"),
])
def test_a_dispatcher_does_not_start_with_a_bad_keys_file(procs: Procs, tmp_path: Path, content: str | None,
                                                          message: str) -> None:
    keys = tmp_path / "keys.json"
    if content is not None:
        write_keys(keys, content)
    done = run_parley(["dispatcher", "--keys-file", str(keys)], env={
        **os.environ, **procs.env("tests.apps.scenarios")}, text=True, timeout=60)
    assert done.returncode == 1 and "signing keys:" in done.stderr and message in done.stderr, done.stderr
