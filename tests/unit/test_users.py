"""The inbox's users file (parley/web/users.py): scrypt hashes and tokens, the file's strict
shape, and checks that cost the same whoever is asked about."""

import base64
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from parley.web.users import Users, UsersFileError, hash_password, token_credential, token_sha256

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def alice_hash() -> str:
    return hash_password(PASSWORD)


def scrypt_string(n: int, r: int, p: int, salt: bytes = b"0123456789abcdef",
                  password: str = PASSWORD, digest: bytes | None = None) -> str:
    if digest is None:
        digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2**27, dklen=32)
    b64 = base64.b64encode
    return f"scrypt${n}${r}${p}${b64(salt).decode()}${b64(digest).decode()}"


def users_text(**entries: Any) -> str:
    return json.dumps(entries)


def test_a_password_hash_is_self_describing_and_salted(alice_hash: str) -> None:
    kind, n, r, p, salt, digest = alice_hash.split("$")
    assert (kind, n, r, p) == ("scrypt", "16384", "8", "1")
    assert len(base64.b64decode(salt)) == 16 and len(base64.b64decode(digest)) == 32
    assert PASSWORD not in alice_hash
    assert hash_password(PASSWORD) != alice_hash  # a fresh salt each time


def test_a_password_checks_and_a_wrong_one_does_not(alice_hash: str) -> None:
    users = Users.parse(users_text(alice={"password": alice_hash}))
    assert users.check("alice", PASSWORD)
    assert not users.check("alice", PASSWORD + " ")
    assert not users.check("alice", PASSWORD.upper())
    assert not users.check("alice", "")
    assert not users.check("bob", PASSWORD)  # unknown principal, even with a right password


def test_an_empty_password_cannot_be_hashed() -> None:
    with pytest.raises(ValueError, match="empty password"):
        hash_password("")


def test_checking_reads_the_parameters_from_the_stored_hash() -> None:
    stronger = scrypt_string(2**15, 8, 2)
    users = Users.parse(users_text(carol={"password": stronger}))
    assert users.check("carol", PASSWORD)
    assert not users.check("carol", "something else")


def test_an_empty_secret_never_signs_in_even_against_a_hash_of_nothing() -> None:
    users = Users.parse(users_text(alice={"password": scrypt_string(2**4, 1, 1, password="")}))
    assert not users.check("alice", "")


def test_token_entries_compare_the_sha256_of_the_secret() -> None:
    token = "a-long-random-token-from-parley-inbox-user"
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert token_sha256(token) == digest
    users = Users.parse(users_text(robot={"token_sha256": digest}, loud={"token_sha256": digest.upper()}))
    assert users.check("robot", token) and users.check("loud", token)  # hex in either case
    assert not users.check("robot", token[:-1])
    assert not users.check("robot", digest)  # the digest is not the token
    assert not users.check("robot", "")
    assert users.credentials["robot"] == token_credential(token)


def count_scrypt(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each hashlib.scrypt call's n, counted as checks happen."""
    calls: list[int] = []
    real: Callable[..., bytes] = hashlib.scrypt

    def counted(*args: Any, **kwargs: Any) -> bytes:
        calls.append(kwargs["n"])
        return real(*args, **kwargs)

    monkeypatch.setattr(hashlib, "scrypt", counted)
    return calls


def test_every_check_costs_one_scrypt_so_timing_tells_nobody_who_exists(
        alice_hash: str, monkeypatch: pytest.MonkeyPatch) -> None:
    users = Users.parse(users_text(alice={"password": alice_hash},
                                   robot={"token_sha256": token_sha256("t" * 43)}))
    calls = count_scrypt(monkeypatch)
    for principal, secret in [("alice", PASSWORD), ("alice", "wrong"), ("robot", "t" * 43),
                              ("robot", "wrong"), ("nobody", "wrong"), ("nobody", "")]:
        calls.clear()
        users.check(principal, secret)
        assert calls == [2**14], (principal, secret)


def test_the_file_round_trips_and_load_reads_a_path(alice_hash: str, tmp_path: Path) -> None:
    users = Users({"alice": alice_hash}).with_credential("robot", token_credential("tok" * 15))
    path = tmp_path / "users.json"
    path.write_bytes(users.to_json())
    assert json.loads(path.read_text()) == {"alice": {"password": alice_hash},
                                            "robot": {"token_sha256": token_sha256("tok" * 15)}}
    loaded = Users.load(str(path))
    assert loaded == users
    assert loaded.check("alice", PASSWORD) and loaded.check("robot", "tok" * 15)


def test_load_lets_os_errors_through_and_names_the_path_in_shape_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Users.load(str(tmp_path / "missing.json"))
    path = tmp_path / "users.json"
    path.write_text("[]")
    with pytest.raises(UsersFileError, match=f"^{path}: expected a JSON object"):
        Users.load(str(path))


GOOD_HASH = scrypt_string(2**4, 1, 1)
GOOD_DIGEST = "ab" * 32


@pytest.mark.parametrize(("text", "message"), [
    ("{", "users file: not JSON"),
    (b"\xff\xfe{}", "users file: not JSON"),
    ("[]", "users file: expected a JSON object"),
    ('"alice"', "users file: expected a JSON object"),
    ("{}", "users file: names nobody"),
    (users_text(alice="plain-password"), "principal 'alice': expected an object"),
    (users_text(alice=[GOOD_HASH]), "principal 'alice': expected an object"),
    (users_text(alice={}), "principal 'alice': expected exactly one .* not neither"),
    (users_text(alice={"password": GOOD_HASH, "token_sha256": GOOD_DIGEST}),
     "principal 'alice': expected exactly one .* not both"),
    (users_text(alice={"password": GOOD_HASH, "role": "admin"}), "principal 'alice': unknown field.*'role'"),
    (users_text(alice={"password": None}), "principal 'alice': 'password' must be a string"),
    (users_text(alice={"password": "hunter22"}), r"principal 'alice': expected scrypt\$<n>"),
    (users_text(alice={"password": "bcrypt$16384$8$1$AAAAAAAAAAA=$AAAAAAAAAAAAAAAAAAAAAA=="}),
     r"principal 'alice': expected scrypt\$<n>"),
    (users_text(alice={"password": GOOD_HASH.replace("$1$", "$one$", 1)}), "must be integers"),
    (users_text(alice={"password": GOOD_HASH[:-4] + "!!!!"}),
     "principal 'alice': the scrypt hash is not base64"),
    (users_text(alice={"password": scrypt_string(16, 1, 1, salt=b"short")}), "the scrypt salt has 5 bytes"),
    (users_text(alice={"password": scrypt_string(16, 1, 1, digest=b"x" * 8)}), "the scrypt hash has 8 bytes"),
    (users_text(alice={"token_sha256": "ab" * 31}),
     "principal 'alice': 'token_sha256' must be a SHA-256 digest"),
    (users_text(alice={"token_sha256": "zz" * 32}), "must be a SHA-256 digest"),
    (users_text(alice={"token_sha256": 12}), "must be a SHA-256 digest"),
    (users_text(**{"": {"token_sha256": GOOD_DIGEST}}), "principal '': a principal is a non-empty string"),
    (users_text(**{"al\nice": {"token_sha256": GOOD_DIGEST}}), "no control characters"),
    (users_text(**{" alice": {"token_sha256": GOOD_DIGEST}}), "no spaces at either end"),
    (users_text(**{"parley.engine": {"token_sha256": GOOD_DIGEST}}),
     "principal 'parley.engine': 'parley.engine' is the dispatchers' own principal"),
    (f'{{"alice": {{"token_sha256": "{GOOD_DIGEST}"}}, "alice": {{"token_sha256": "{GOOD_DIGEST}"}}}}',
     "users file: 'alice' appears twice"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_a_malformed_file_is_refused_naming_the_principal_and_the_fault(text: str | bytes,
                                                                        message: str) -> None:
    with pytest.raises(UsersFileError, match=message):
        Users.parse(text)


@pytest.mark.parametrize(("n", "r", "p", "message"), [
    (2**21, 1, 1, "n=2097152: expected a power of two from 2 to 1048576"),
    (2**40, 8, 1, "expected a power of two"),
    (3000, 8, 1, "n=3000: expected a power of two"),
    (1, 8, 1, "n=1: expected a power of two"),
    (2**14, 0, 1, "r=0: expected 1 to 32"),
    (2**14, 1000, 1, "r=1000: expected 1 to 32"),
    (2**14, 8, 0, "p=0: expected 1 to 16"),
    (2**14, 8, 10**9, "p=1000000000: expected 1 to 16"),
    (2**20, 8, 1, "costs too much per check"),  # 1 GiB of memory
    (2**17, 8, 16, "costs too much per check"),  # 128 MiB, 16 times over
], ids=lambda v: v if isinstance(v, str) else None)
def test_hostile_scrypt_parameters_are_refused_when_the_file_is_read(n: int, r: int, p: int,
                                                                     message: str) -> None:
    salt, digest = base64.b64encode(b"0" * 16).decode(), base64.b64encode(b"1" * 32).decode()
    started = time.monotonic()
    with pytest.raises(UsersFileError, match=f"principal 'mallory': scrypt .*{message}"):
        Users.parse(users_text(mallory={"password": f"scrypt${n}${r}${p}${salt}${digest}"}))
    assert time.monotonic() - started < 0.5  # refused from the string, nothing computed


def test_users_made_directly_are_checked_too(alice_hash: str) -> None:
    with pytest.raises(UsersFileError, match="principal 'alice': expected scrypt"):
        Users({"alice": "not-a-hash"})
    with pytest.raises(UsersFileError, match=r"'parley\.engine' is the dispatchers' own principal"):
        Users({"alice": alice_hash}).with_credential("parley.engine", alice_hash)


def test_repr_names_the_principals_and_shows_no_hash(alice_hash: str) -> None:
    users = Users({"alice": alice_hash, "robot": token_credential("secret-token-value")})
    shown = f"{users!r} {users} {[users]}"
    assert "alice" in shown and "robot" in shown
    assert alice_hash.split("$")[-1] not in shown and alice_hash.split("$")[-2] not in shown
    assert token_sha256("secret-token-value") not in shown and "scrypt" not in shown
