"""`parley inbox`'s start-up refusals: each says what is wrong, and nothing is served."""

import json
from pathlib import Path

from click.testing import CliRunner, Result

from parley.cli import cli
from parley.web.users import hash_password


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def files(tmp_path: Path, users: object) -> tuple[str, str]:
    (tmp_path / "users.json").write_text(json.dumps(users))
    (tmp_path / "keys.json").write_text(json.dumps({"alice": "k" * 32}))
    return str(tmp_path / "users.json"), str(tmp_path / "keys.json")


def test_a_malformed_users_file_is_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    users, keys = files(tmp_path, {"alice": {"password": "plain text"}})
    result = run("inbox", "--users-file", users, "--keys-file", keys)
    assert result.exit_code == 1 and "alice" in result.output and "Error" in result.output


def test_a_malformed_keys_file_is_refused(tmp_path: Path) -> None:
    users, keys = files(tmp_path, {"alice": {"password": hash_password("alice-password")}})
    Path(keys).write_text("[1, 2]")
    result = run("inbox", "--users-file", users, "--keys-file", keys)
    assert result.exit_code == 1 and "keys" in result.output


def test_files_are_required_and_must_exist(tmp_path: Path) -> None:
    _users, keys = files(tmp_path, {"alice": {"password": hash_password("alice-password")}})
    assert run("inbox", "--keys-file", keys).exit_code == 2
    missing = run("inbox", "--users-file", str(tmp_path / "nope.json"), "--keys-file", keys)
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_several_shards_need_a_producer(tmp_path: Path) -> None:
    users, keys = files(tmp_path, {"alice": {"password": hash_password("alice-password")}})
    result = run("--redis-url", "redis://127.0.0.1:1/0", "--redis-url", "redis://127.0.0.1:2/0",
                 "inbox", "--users-file", users, "--keys-file", keys)
    assert result.exit_code == 2 and "producer" in result.output
