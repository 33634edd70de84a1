"""A refusal of the inbox's own key (the dispatchers were not given its keys file) is shown with
the fix (parley/web/present.py), from the refusal's code and message alone."""

import pytest

from parley.dispatcher.core import AppInfo
from parley.dispatcher.entries import EntryDecoder, Refused
from parley.schemas.codes import RefusalCode
from parley.schemas.resumes import ResumeOutcome, ResumeStatus
from parley.schemas.signing import Keyring, signed_fields
from parley.web.present import AnswerStatus, answer_result

FIX = ("they must be started with the same keys file as the inbox (--keys-file / PARLEY_KEYS_FILE). "
       "Tell whoever runs Parley.")


def refused(message: str, code: str = "unauthorized") -> ResumeOutcome:
    return ResumeOutcome(status=ResumeStatus.REFUSED, entry="1-0", code=code, message=message)


def test_an_unknown_principal_names_the_fix_and_whose_key() -> None:
    result = answer_result(refused("unauthorized: unknown principal"), principal="alice")
    assert (result.status, result.code) == (AnswerStatus.REFUSED, "unauthorized")
    assert result.headline == "Refused (unauthorized): the question is still open."
    assert result.detail == (f"The dispatchers do not know this inbox's key for alice: {FIX} "
                             "(The engine said: unauthorized: unknown principal.)")


def test_a_bad_signature_is_another_key_for_the_principal() -> None:
    result = answer_result(refused("unauthorized: bad signature"), principal="alice")
    assert result.detail == (f"The dispatchers' key for alice is not the one this inbox signs with: {FIX} "
                             "(The engine said: unauthorized: bad signature.)")


def test_without_the_principal_it_speaks_to_the_person() -> None:
    detail = answer_result(refused("unauthorized: unknown principal")).detail or ""
    assert detail.startswith("The dispatchers do not know this inbox's key for you: they must be started")


@pytest.mark.parametrize(("code", "message"), [
    ("unauthorized", "unauthorized: the entry is older than the idempotency window (or from the future)"),
    ("unauthorized", "unauthorized: signing is required: the entry has no `sig`"),
    ("unauthorized", "unauthorized: unknown principal, and more"),
    ("forbidden", "unknown principal"),  # another code: not about keys, whatever its words
    ("invalid_resume", "unauthorized: unknown principal"),
], ids=["stale", "unsigned", "other-words", "forbidden", "invalid-resume"])
def test_other_refusals_keep_the_engines_words(code: str, message: str) -> None:
    assert answer_result(refused(message, code), principal="alice").detail == message


def test_a_refusal_without_a_message_stays_without() -> None:
    outcome = ResumeOutcome(status=ResumeStatus.REFUSED, entry="1-0", code="unauthorized")
    assert answer_result(outcome, principal="alice").detail is None


@pytest.mark.parametrize(("dispatcher_keys", "fix"), [
    ({"bob": "bob-key-0123456789"}, "do not know this inbox's key for alice"),
    ({"alice": "another-key-0123456789"}, "is not the one this inbox signs with"),
], ids=["unknown-principal", "bad-signature"])
def test_the_words_match_what_a_dispatcher_refuses_with(dispatcher_keys: dict[str, str], fix: str) -> None:
    """The dispatcher's own refusal of an entry signed with the inbox's key, as its
    `input.refused` message reads (dispatcher/entries.py), is the one shown with the fix: a
    rewording on either side fails here."""
    keyring = Keyring({p: (k,) for p, k in dispatcher_keys.items()}, required=True)
    decoder = EntryDecoder(AppInfo(), keyring=keyring)
    raw = b'{"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": true}}'
    fields = {"session": "s-1", "id": "s-1/int-1", "input": raw,
              **signed_fields("alice-key-0123456789", "alice", "s-1", "s-1/int-1", raw)}
    refusal = decoder.prepare("parley:inputs", True, "1-0", fields)
    assert isinstance(refusal, Refused) and refusal.code == RefusalCode.UNAUTHORIZED
    shown = answer_result(refused(str(refusal.error), refusal.code.value), principal="alice").detail or ""
    assert fix in shown
