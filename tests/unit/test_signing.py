"""The keys file and the keyring (docs/protocol.md, Signing; docs/operations.md, "Rotating signing
keys"): several keys per principal, any of them verifies, a signer uses the first; a file of the
wrong shape is refused with a message naming what is wrong, and a reload of one keeps the keys."""

import json
import time
from pathlib import Path

import pytest

from parley.schemas.results import WorkOutcome
from parley.schemas.signing import (
    ENGINE_PRINCIPAL,
    Keyring,
    KeysFileError,
    Unauthorized,
    engine_signed,
    outcome_signature,
    parse_keys,
    signature,
    signed_fields,
)

NOW = int(time.time() * 1000)
RAW = b'{"type":"message.create","content":"hi"}'


def entry(key: str, principal: str = "alice", session: str = "acme/s-1") -> dict[bytes | str, bytes | str]:
    fields: dict[bytes | str, bytes | str] = {"session": session, "input": RAW, "id": "k-1"}
    fields.update(signed_fields(key, principal, session, "k-1", RAW, now_ms=NOW))
    return fields


def keys_file(tmp_path: Path, data: object) -> str:
    path = tmp_path / "keys.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_one_key_as_a_string_stays_accepted(tmp_path: Path) -> None:
    ring = Keyring.load(keys_file(tmp_path, {"alice": "old"}))
    assert ring.keys == {"alice": ("old",)}
    assert ring.verify(entry("old"), NOW) == "alice"
    assert ring.signing_key("alice") == "old"


def test_any_listed_key_verifies_and_the_first_signs(tmp_path: Path) -> None:
    ring = Keyring.load(keys_file(tmp_path, {"alice": ["new", "old"], "bob": "b"}))
    assert ring.verify(entry("new"), NOW) == "alice"
    assert ring.verify(entry("old"), NOW) == "alice"
    assert ring.signing_key("alice") == "new"
    assert ring.signing_key("nobody") is None
    with pytest.raises(Unauthorized, match="bad signature"):
        ring.verify(entry("b"), NOW)  # bob's key does not sign for alice


def test_a_removed_key_is_refused_once_reloaded(tmp_path: Path) -> None:
    path = keys_file(tmp_path, {"alice": ["new", "old"]})
    ring = Keyring.load(path, required=True).with_engine_key("engine")
    keys_file(tmp_path, {"alice": ["new"]})
    revoked = ring.reloaded(path)
    assert (revoked.required, revoked.engine_key) == (True, "engine")  # only the keys change
    assert revoked.verify(entry("new"), NOW) == "alice"
    with pytest.raises(Unauthorized, match="bad signature"):
        revoked.verify(entry("old"), NOW)
    assert ring.verify(entry("old"), NOW) == "alice"  # the keyring in use is not changed


def test_a_plain_string_given_to_keyring_is_one_key_not_its_characters() -> None:
    ring = Keyring({"alice": "secret"})  # type: ignore[dict-item]
    assert ring.secrets_of("alice") == ("secret",)
    with pytest.raises(Unauthorized, match="bad signature"):
        ring.verify(entry("s"), NOW)


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not JSON"),
    ('["alice", "secret"]', "expected a JSON object"),
    ('{"alice": ""}', "principal 'alice'"),
    ('{"alice": []}', "principal 'alice'"),
    ('{"alice": ["new", ""]}', "principal 'alice'"),
    ('{"alice": ["new", 7]}', "principal 'alice'"),
    ('{"alice": {"key": "new"}}', "principal 'alice'"),
    ('{"alice": null}', "principal 'alice'"),
    ('{"": "secret"}', "principal ''"),
    ('{"alice": ["same", "same"]}', "lists one secret twice"),
    (json.dumps({ENGINE_PRINCIPAL: "x"}), "dispatchers' own principal"),
    (b"\xff\xfe".decode("latin-1"), "not JSON"),
])
def test_bad_keys_files_are_refused_naming_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(KeysFileError, match=message):
        parse_keys(text)
    path = keys_file(tmp_path, text)
    with pytest.raises(KeysFileError, match=message):
        Keyring.load(path)
    good = Keyring({"alice": ("kept",)})
    with pytest.raises(KeysFileError):
        good.reloaded(path)


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_bytes(b'{"alice": "\xff"}')
    with pytest.raises(KeysFileError, match="not JSON"):
        Keyring.load(str(path))


def test_a_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        Keyring.load(str(tmp_path / "absent.json"))


def test_the_keyring_never_prints_its_secrets() -> None:
    ring = Keyring({"alice": ("new-secret", "old-secret")})
    assert "secret" not in repr(ring).replace("principals", "")


# ---- outcomes only the engine makes ------------------------------------------------------------


def test_an_engine_outcome_is_signed_by_its_key_alone() -> None:
    outcome = WorkOutcome(session="s", work="int-1", attempt=0, kind="deadline", ok=True)
    raw = outcome.model_dump_json().encode()
    sig = outcome_signature("engine-key", raw)
    assert engine_signed("engine-key", raw, sig)
    assert not engine_signed("another-key", raw, sig)
    assert not engine_signed("engine-key", raw.replace(b"int-1", b"int-2"), sig)  # another outcome
    assert not engine_signed(None, raw, sig) and not engine_signed("engine-key", raw, None)
    # never the signature of an input with the same bytes (a producer's key could not make one either)
    assert sig != signature("engine-key", "s", "e", "1", raw)


@pytest.mark.parametrize(("outcome", "engine_made"), [
    (WorkOutcome(session="s", work="int-1", attempt=0, kind="deadline", ok=True), True),
    (WorkOutcome(session="s", work="call-1", attempt=1, kind="tool", ok=True, source="s:sub-1"), True),
    (WorkOutcome(session="s", work="call-1", attempt=1, kind="tool", ok=True), False),
    (WorkOutcome(session="s", work="llm-1", attempt=1, kind="llm", ok=False, lost=True), False),
])
def test_deadlines_and_sub_agent_reports_are_the_engines_own(outcome: WorkOutcome, engine_made: bool) -> None:
    assert outcome.engine_made is engine_made


def test_a_job_outcome_is_signed_under_the_token_its_job_id_and_the_engines_key_derive():
    import hashlib
    import hmac

    from parley.schemas.signing import job_outcome_signature, job_signed, job_token

    token = job_token("engine-key", "parley-abc")
    assert token == hmac.new(b"engine-key", b"parley-job-token\nparley-abc", hashlib.sha256).hexdigest()
    assert token != job_token("engine-key", "parley-abd") != job_token("other-key", "parley-abc")
    sig = job_outcome_signature(token, b'{"ok":true}')
    assert job_signed("engine-key", "parley-abc", b'{"ok":true}', sig)
    assert not job_signed("engine-key", "parley-abc", b'{"ok":false}', sig)  # another outcome
    assert not job_signed("engine-key", "parley-abd", b'{"ok":true}', sig)  # another job
    assert not job_signed("other-key", "parley-abc", b'{"ok":true}', sig)
    assert not job_signed(None, "parley-abc", b'{"ok":true}', sig) and not job_signed("k", "j", b"", None)


def test_the_lua_scripts_keep_a_jobs_token_as_long_as_the_dispatcher_says():
    from pathlib import Path

    from parley.dispatcher.enqueue import JOB_TOKEN_TTL_MS

    root = Path(__file__).resolve().parents[2]
    assert str(JOB_TOKEN_TTL_MS) in (root / "dispatcher/lua/commit.lua").read_text()
    # and no worker script writes one (a worker may only GETDEL a token: deploy/redis/users.acl)
    for script in (root / "workers/lua").glob("*.lua"):
        assert str(JOB_TOKEN_TTL_MS) not in script.read_text(), script
