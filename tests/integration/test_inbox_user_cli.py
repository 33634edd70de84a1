"""`parley inbox-user FILE PRINCIPAL` (parley/cli/inbox_users.py): adds or replaces one person in
the inbox's users file, written whole and atomically, mode 0600, keeping everyone else."""

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from parley.cli.inbox_users import inbox_user
from parley.web.users import Users, token_sha256


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(inbox_user, list(args), input=input)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def leftovers(directory: Path, keep: str = "users.json") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != keep)


def test_a_missing_file_is_created_mode_0600_with_the_prompted_password(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    result = run(str(path), "alice", input="first-password\nfirst-password\n")
    assert result.exit_code == 0, result.output
    assert "Password:" in result.output and "Repeat for confirmation:" in result.output
    assert "first-password" not in result.output  # never echoed
    assert "alice: added with a password" in result.stderr
    assert mode_of(path) == 0o600
    users = Users.load(str(path))
    assert users.check("alice", "first-password") and not users.check("alice", "other-password")
    assert "first-password" not in path.read_text()
    assert leftovers(tmp_path) == []  # no temporary file left beside it


def test_replacing_a_principal_keeps_everyone_else(tmp_path: Path) -> None:
    path = str(tmp_path / "users.json")
    assert run(path, "alice", "--password-stdin", input="alice-old-pw\n").exit_code == 0
    assert run(path, "bob", "--password-stdin", input="bob-password\n").exit_code == 0
    token = run(path, "robot", "--token").stdout.strip()
    result = run(path, "alice", "--password-stdin", input="alice-new-pw\n")
    assert result.exit_code == 0, result.output
    assert "alice: replaced with a password" in result.stderr
    users = Users.load(path)
    assert sorted(users.credentials) == ["alice", "bob", "robot"]
    assert users.check("alice", "alice-new-pw") and not users.check("alice", "alice-old-pw")
    assert users.check("bob", "bob-password") and users.check("robot", token)


def test_a_token_is_printed_once_and_only_its_digest_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    result = run(str(path), "robot", "--token")
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert result.stdout == token + "\n"  # stdout is the token alone, for a script to capture
    assert len(token) >= 43
    assert "Store the token now" in result.stderr and token not in result.stderr
    assert json.loads(path.read_text()) == {"robot": {"token_sha256": token_sha256(token)}}
    assert token not in path.read_text()
    assert Users.load(str(path)).check("robot", token)
    again = run(str(path), "robot", "--token").stdout.strip()
    assert again != token
    users = Users.load(str(path))
    assert users.check("robot", again) and not users.check("robot", token)


def test_password_stdin_reads_one_line(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    result = run(str(path), "alice", "--password-stdin", input="  spaces kept  \r\nsecond line\n")
    assert result.exit_code == 0, result.output
    assert "Password" not in result.output  # no prompt
    users = Users.load(str(path))
    assert users.check("alice", "  spaces kept  ")
    assert not users.check("alice", "second line")
    # without a final newline too
    assert run(str(path), "bob", "--password-stdin", input="no-newline-pw").exit_code == 0
    assert Users.load(str(path)).check("bob", "no-newline-pw")


@pytest.mark.parametrize(("args", "input", "message"), [
    (["--password-stdin"], "short\n", "the password is shorter than 8 characters"),
    (["--password-stdin"], "1234567\n", "the password is shorter than 8 characters"),
    (["--password-stdin"], "\n", "the password is empty"),
    (["--password-stdin"], "", "the password is empty"),
    ([], "short\nshort\n", "the password is shorter than 8 characters"),
    ([], "\n\n", "the password is empty"),
], ids=["stdin-short", "stdin-7", "stdin-empty", "stdin-eof", "prompt-short", "prompt-empty"])
def test_an_empty_or_short_password_is_refused_and_nothing_written(
        tmp_path: Path, args: list[str], input: str, message: str) -> None:
    path = tmp_path / "users.json"
    result = run(str(path), "alice", *args, input=input)
    assert result.exit_code == 1
    assert f"Error: {message} (nothing was changed)" in result.stderr
    assert not path.exists()


def test_a_mismatched_confirmation_asks_again_and_never_writes_the_first(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    gave_up = run(str(path), "alice", input="password-one\npassword-two\n")
    assert gave_up.exit_code == 1  # asked again, then standard input ended: aborted
    assert "do not match" in gave_up.output
    assert not path.exists()
    retried = run(str(path), "alice", input="password-one\npassword-two\npassword-3\npassword-3\n")
    assert retried.exit_code == 0, retried.output
    users = Users.load(str(path))
    assert users.check("alice", "password-3") and not users.check("alice", "password-one")


def test_an_existing_file_becomes_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    assert run(str(path), "alice", "--password-stdin", input="alice-password\n").exit_code == 0
    path.chmod(0o644)
    assert run(str(path), "bob", "--password-stdin", input="bob-password\n").exit_code == 0
    assert mode_of(path) == 0o600


def test_an_empty_existing_file_is_taken_as_nobody_yet(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text("")
    assert run(str(path), "alice", "--password-stdin", input="alice-password\n").exit_code == 0
    assert Users.load(str(path)).check("alice", "alice-password")


def test_a_malformed_file_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text('{"bob": {"password": "plain text"}}')
    result = run(str(path), "alice", "--password-stdin", input="alice-password\n")
    assert result.exit_code == 1
    assert f"Error: {path}: principal 'bob': expected scrypt" in result.stderr
    assert "fix or remove it first (nothing was changed)" in result.stderr
    assert path.read_text() == '{"bob": {"password": "plain text"}}'
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("where", "error"), [
    ("missing-dir/users.json", "cannot write {path}: No such file or directory"),
    ("a-file/users.json", "cannot read {path}: Not a directory"),
])
def test_an_unusable_path_is_an_error_and_leaves_nothing(tmp_path: Path, where: str, error: str) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    path = tmp_path / where
    result = run(str(path), "alice", "--password-stdin", input="alice-password\n")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {error.format(path=path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.mkdir()  # a directory where the file should be: read fails even for root
    result = run(str(path), "alice", "--password-stdin", input="alice-password\n")
    assert result.exit_code == 2
    assert f"Invalid value for 'FILE': File '{path}' is a directory." in result.stderr
    assert list(path.iterdir()) == []


def test_through_a_symbolic_link_the_target_is_rewritten(tmp_path: Path) -> None:
    target = tmp_path / "real-users.json"
    link = tmp_path / "users.json"
    assert run(str(target), "bob", "--password-stdin", input="bob-password\n").exit_code == 0
    link.symlink_to(target.name)
    assert run(str(link), "alice", "--password-stdin", input="alice-password\n").exit_code == 0
    assert link.is_symlink()
    users = Users.load(str(target))
    assert users.check("alice", "alice-password") and users.check("bob", "bob-password")


@pytest.mark.parametrize(("principal", "message"), [
    ("parley.engine", "'parley.engine' is the dispatchers' own principal"),
    ("", "a principal is a non-empty string"),
    ("al\tice", "no control characters"),
])
def test_a_principal_that_cannot_be_one_is_refused_before_any_prompt(
        tmp_path: Path, principal: str, message: str) -> None:
    path = tmp_path / "users.json"
    result = run(str(path), principal, input="never-read-pw\nnever-read-pw\n")
    assert result.exit_code == 2
    assert message in result.stderr and "Password" not in result.output
    assert not path.exists()


def test_token_and_password_stdin_exclude_each_other(tmp_path: Path) -> None:
    result = run(str(tmp_path / "users.json"), "alice", "--token", "--password-stdin", input="x" * 10)
    assert result.exit_code == 2
    assert "--token and --password-stdin exclude each other" in result.stderr
    assert not (tmp_path / "users.json").exists()


def test_rewriting_another_users_file_keeps_its_owner(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Root adding a person must not leave the inbox's own user unable to read its file: the
    rewritten file gets the previous one's owner (here the file is ours, and we pretend to be
    someone else, so the test needs no root)."""
    path = tmp_path / "users.json"
    assert run(str(path), "alice", "--password-stdin", input="alice-password\n").exit_code == 0
    owner = (path.stat().st_uid, path.stat().st_gid)
    given: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "getuid", lambda: owner[0] + 1)
    monkeypatch.setattr(os, "fchown", lambda _fd, uid, gid: given.append((uid, gid)))
    assert run(str(path), "bob", "--password-stdin", input="bob-password\n").exit_code == 0
    assert given == [owner]

    def refused(_fd: int, _uid: int, _gid: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", refused)
    result = run(str(path), "carol", "--password-stdin", input="carol-password\n")
    assert result.exit_code == 0, result.output
    assert f"warning: {path} was owned by uid {owner[0]}, gid {owner[1]}; it is now yours" in result.stderr
    assert Users.load(str(path)).check("carol", "carol-password")
