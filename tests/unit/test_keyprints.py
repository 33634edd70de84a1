"""The fingerprints of the dispatchers' signing keys, and a signer's keys compared with them
(schemas/keyprints.py): what the inbox says at start when the dispatchers lack its keys."""

import hashlib
import hmac
from collections.abc import Mapping, Sequence

import pytest

from parley.schemas.keyprints import (
    AGUI,
    FINGERPRINT_TAG,
    INBOX,
    Keyprints,
    KeyProblem,
    KeyTrouble,
    Published,
    PublishedKeys,
    compare_keys,
    departed,
    describe,
    fingerprint,
    read_published,
    summary,
)

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"


def published(*records: tuple[str, Mapping[str, Sequence[str]]], at: int = 1_000) -> PublishedKeys:
    """What dispatchers published: (name, their keys file) each."""
    return PublishedKeys(tuple(Published(name, Keyprints.of(keys, at)) for name, keys in records))


def lines(signer: dict[str, tuple[str, ...]], found: PublishedKeys, shard: int | None = None) -> list[str]:
    return [describe(p) for p in compare_keys(signer, found, shard)]


# ---- the fingerprint ---------------------------------------------------------------------------


def test_a_fingerprint_is_a_truncated_hmac_of_principal_and_key_under_the_fixed_tag() -> None:
    fp = fingerprint("alice", ALICE)
    assert fp == hmac.new(FINGERPRINT_TAG, b"alice\n" + ALICE.encode(), hashlib.sha256).hexdigest()[:16]
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fingerprint("alice", ALICE) == fp  # the same key, the same print: what is compared
    assert fingerprint("alice", BOB) != fp
    # two principals sharing a key do not show it
    assert fingerprint("bob", ALICE) != fp
    # nothing of the key is in it, nor is it a plain hash of the key
    assert ALICE[:8] not in fp and hashlib.sha256(ALICE.encode()).hexdigest()[:16] != fp


def test_what_a_dispatcher_publishes_holds_prints_never_keys_and_reads_back() -> None:
    record = Keyprints.of({"alice": (ALICE, BOB), "bob": (BOB,)}, at_ms=1234)
    raw = record.encode()
    assert ALICE.encode() not in raw and BOB.encode() not in raw
    assert record.principals == {"alice": (fingerprint("alice", ALICE), fingerprint("alice", BOB)),
                                 "bob": (fingerprint("bob", BOB),)}
    found = read_published({b"d-2": raw, b"d-1": Keyprints.of({}, 5).encode()})
    assert [(r.dispatcher, r.prints.at) for r in found.records] == [("d-1", 5), ("d-2", 1234)]
    assert found.records[1].prints == record and found.unreadable == ()
    # str fields (a decoding client) read the same
    assert read_published({"d-2": raw.decode()}).records[0].prints == record


@pytest.mark.parametrize("raw", [b"not json", b"{}", b'{"at": "soon", "principals": {}}', b"[]",
                                 b'{"at": 1, "principals": {"alice": "one"}}'])
def test_a_record_that_does_not_parse_is_named_not_fatal(raw: bytes) -> None:
    good = Keyprints.of({"alice": (ALICE,)}, 1).encode()
    found = read_published({b"d-ok": good, b"d-odd": raw})
    assert [r.dispatcher for r in found.records] == ["d-ok"] and found.unreadable == ("d-odd",)


def test_a_newer_releases_extra_fields_are_read_past() -> None:
    raw = b'{"at": 7, "principals": {"alice": ["00ff"]}, "algorithm": "v2"}'
    assert read_published({b"d": raw}).records[0].prints == Keyprints(at=7, principals={"alice": ("00ff",)})


# ---- the comparison ----------------------------------------------------------------------------


def test_the_same_keys_file_has_nothing_to_say() -> None:
    keys = {"alice": (ALICE,), "bob": (BOB,)}
    assert compare_keys(keys, published(("d-1", keys), ("d-2", keys))) == []
    # the dispatchers may know more principals than the signer: producers, other teams
    assert compare_keys({"alice": (ALICE,)}, published(("d-1", keys))) == []


def test_a_principal_no_dispatcher_knows_is_one_line_naming_the_fix() -> None:
    found = published(("d-1", {"bob": (BOB,)}), ("d-2", {"bob": (BOB,)}))
    assert lines({"alice": (ALICE,), "bob": (BOB,)}, found) == [
        "inbox key for alice is unknown to the dispatchers: start them with the same --keys-file "
        "(or add alice's key to theirs)"]


def test_a_principal_only_some_dispatchers_know_names_those_that_do_not() -> None:
    found = published(("d-1", {"alice": (ALICE,)}), ("d-2", {"bob": (BOB,)}), ("d-3", {"bob": (BOB,)}))
    [problem] = compare_keys({"alice": (ALICE,)}, found)
    assert (problem.trouble, problem.principal, problem.dispatchers, problem.published) == (
        KeyTrouble.UNKNOWN, "alice", ("d-2", "d-3"), 3)
    assert describe(problem) == ("inbox key for alice is unknown to 2 of the 3 dispatchers (d-2, d-3): "
                                 "start them with the same --keys-file (or add alice's key to theirs)")


def test_another_key_for_a_known_principal_is_said_to_differ() -> None:
    [problem] = compare_keys({"alice": (ALICE,)}, published(("d-1", {"alice": (BOB,)})))
    assert problem.trouble is KeyTrouble.DIFFERS
    assert describe(problem) == (
        "inbox key for alice (its first, which it signs with) is not one the dispatchers have for "
        "alice: start them with the same --keys-file (or add alice's key to theirs)")


@pytest.mark.parametrize(("inbox", "dispatcher"), [
    ((ALICE,), (ALICE, BOB)),        # the dispatchers have the new key added second (step 1)
    ((ALICE,), (BOB, ALICE)),        # ... or first
    ((ALICE, BOB), (ALICE,)),        # the inbox holds a second key they lack: it never signs with it
    ((ALICE, BOB), (ALICE, "x" * 20)),
], ids=["added-second", "added-first", "inbox-has-more", "second-keys-differ"])
def test_a_rotation_under_way_is_fine_while_they_have_the_key_it_signs_with(
        inbox: tuple[str, ...], dispatcher: tuple[str, ...]) -> None:
    assert compare_keys({"alice": inbox}, published(("d-1", {"alice": dispatcher}))) == []


def test_a_rotation_that_moved_the_inbox_to_a_key_they_lack_is_said() -> None:
    """The inbox signs with its first key: that one unknown to them, the rotation is not over."""
    [problem] = compare_keys({"alice": (BOB, ALICE)}, published(("d-1", {"alice": (ALICE,)})))
    assert (problem.trouble, problem.principal) == (KeyTrouble.DIFFERS, "alice")


def test_unknown_to_some_and_differing_at_others_are_two_lines() -> None:
    found = published(("d-1", {"alice": (BOB,)}), ("d-2", {}), ("d-3", {"alice": (ALICE,)}),
                      ("d-4", {"bob": (BOB,)}))
    problems = compare_keys({"alice": (ALICE,)}, found)
    assert [(p.trouble, p.dispatchers) for p in problems] == [(KeyTrouble.UNKNOWN, ("d-2", "d-4")),
                                                             (KeyTrouble.DIFFERS, ("d-1",))]
    # d-2 knows no principal at all: a dispatcher started without --keys-file
    assert problems[0].keyless == ("d-2",)
    assert describe(problems[0]) == (
        "inbox key for alice is unknown to 2 of the 4 dispatchers (d-2, d-4) (d-2 verifies no key at "
        "all: started without --keys-file?): start them with the same --keys-file (or add alice's key "
        "to theirs)")
    assert "1 of the 4 dispatchers (d-1) have for alice" in describe(problems[1])
    # the only one that lacks it knows no key at all
    [alone] = compare_keys({"alice": (ALICE,)}, published(("d-1", {"alice": (ALICE,)}), ("d-2", {})))
    assert "(d-2) (it verifies no key at all: started without --keys-file?)" in describe(alone)


def test_dispatchers_without_any_key_are_one_line_not_one_per_principal() -> None:
    found = published(("d-1", {}), ("d-2", {}))
    [problem] = compare_keys({"alice": (ALICE,), "bob": (BOB,)}, found)
    assert problem.trouble is KeyTrouble.NO_KEYS
    assert describe(problem) == ("the dispatchers verify no signing key at all (started without "
                                 "--keys-file?): they refuse every answer the inbox signs; start them "
                                 "with the same --keys-file")


def test_nothing_published_says_so() -> None:
    [problem] = compare_keys({"alice": (ALICE,)}, PublishedKeys())
    assert problem.trouble is KeyTrouble.NOTHING_PUBLISHED
    assert describe(problem).startswith("no dispatcher has published its keys (older dispatchers, or "
                                        "none running)")


def test_an_unreadable_record_is_said_and_the_others_are_compared() -> None:
    found = PublishedKeys((Published("d-1", Keyprints.of({"bob": (BOB,)}, 1)),), unreadable=("d-new",))
    problems = compare_keys({"alice": (ALICE,)}, found)
    assert [p.trouble for p in problems] == [KeyTrouble.UNREADABLE, KeyTrouble.UNKNOWN]
    assert describe(problems[0]) == ("dispatcher d-new's published keys cannot be read (a newer release?): "
                                     "not compared")
    # only unreadable records: nothing could be compared, which is said too
    assert [p.trouble for p in compare_keys({"alice": (ALICE,)}, PublishedKeys(unreadable=("d-new",)))] == [
        KeyTrouble.UNREADABLE, KeyTrouble.NOTHING_PUBLISHED]


def test_a_signer_without_keys_has_nothing_to_check() -> None:
    assert compare_keys({}, PublishedKeys()) == []
    assert compare_keys({"carol": ()}, published(("d-1", {}))) == []


def test_with_shards_each_line_names_its_shard() -> None:
    found = published(("d-1", {"bob": (BOB,)}))
    assert lines({"alice": (ALICE,)}, found, shard=1) == [
        "inbox key for alice is unknown to the dispatchers of shard 1: start them with the same "
        "--keys-file (or add alice's key to theirs)"]
    [nothing] = compare_keys({"alice": (ALICE,)}, PublishedKeys(), shard=2)
    assert "no dispatcher has published its keys on shard 2" in describe(nothing)
    two = published(("d-1", {"bob": (BOB,)}), ("d-2", {"alice": (ALICE,)}))
    assert "1 of the 2 dispatchers of shard 0 (d-1)" in lines({"alice": (ALICE,)}, two, shard=0)[0]


def test_the_agui_endpoint_is_told_its_own_fix() -> None:
    [problem] = compare_keys({"desk": (ALICE,)}, published(("d-1", {"bob": (BOB,)})))
    assert describe(problem, AGUI) == ("agui key for desk is unknown to the dispatchers: add desk's key "
                                       "(parley agui's --signing-key) to their --keys-file")


def test_a_read_failure_is_worded_with_its_detail() -> None:
    problem = KeyProblem(KeyTrouble.NOT_READ, shard=None, detail="NOPERM no permissions")
    assert describe(problem) == ("the dispatchers' published keys could not be read (NOPERM no "
                                 "permissions): the inbox's keys are not checked against theirs")


def test_the_summary_counts_principals_and_dispatchers() -> None:
    keys = {"alice": (ALICE,), "bob": (BOB,), "carol": ()}
    assert summary(keys, [published(("d-1", keys)), published(("d-2", keys), ("d-3", keys))], INBOX) == (
        "inbox keys checked: the 3 dispatcher(s) that published theirs have the key the inbox signs "
        "with for each of its 2 principal(s)")


# ---- the records of departed dispatchers ---------------------------------------------------------


def test_departed_dispatchers_records_are_the_ones_to_delete() -> None:
    now, grace = 1_000_000, 60_000
    found = PublishedKeys(tuple(Published(name, Keyprints(at=at, principals={})) for name, at in [
        ("live", now - 10 * grace), ("gone", now - 2 * grace), ("just-started", now - 1_000),
        ("lapsed", now - 2 * grace), ("never-registered", now - 2 * grace)]), unreadable=("newer",))
    registered = {"live": now - 3_000, "gone": now - 2 * grace, "lapsed": now - grace - 1,
                  "just-started": now - 5 * grace}
    assert departed(found, registered, now, grace) == ["gone", "lapsed", "never-registered"]
    assert departed(PublishedKeys(), registered, now, grace) == []
