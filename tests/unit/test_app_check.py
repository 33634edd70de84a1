"""`parley app check`: every problem of an app in one run, without Redis, and its exit code."""

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from parley.cli.app_problems import check_app
from parley.cli.main import cli

BAD_APP = '''
decide = 5
decide_on = {"tool.exeucte"}
instructions = ["be nice"]
def good(x: int) -> int:
    """Fine."""
    return x
def nodoc(x: int) -> int:
    return x
def bad(x: int) -> int:
    """A mark of the wrong kind."""
    return x
bad.timeout_s = 0
def pay(x: int) -> int:
    """An approval whose schema no answer can satisfy."""
    return x
pay.needs_approval = {"response_schema": {"type": "object", "properties": {"approved": {"type": "boolean"}},
                      "required": ["approved"], "minProperties": "x"}}
def sub(task: str) -> str:
    """A sub-agent that is not there."""
sub.agent = "no_such_module_for_app_check"
tools = [good, nodoc, bad, pay, sub]
'''


@pytest.fixture
def bad_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "app_check_bad.py").write_text(BAD_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "app_check_bad"
    sys.modules.pop("app_check_bad", None)


def test_every_problem_is_listed_not_just_the_first(bad_app: str):
    found = check_app(bad_app)
    errors = [p.message for p in found.problems if p.level == "error"]
    warnings = [p.message for p in found.problems if p.level == "warning"]
    assert not found.ok
    assert any("`decide` is not callable" in e for e in errors)
    assert any("`instructions` must be a string" in e for e in errors)
    assert any("'tool.exeucte' (did you mean 'tool.execute'?)" in e for e in errors)
    assert any("tool 'bad': `timeout_s` must be a number of seconds > 0" in e for e in errors)
    assert any("tool 'pay'" in e and "response_schema" in e for e in errors)
    assert any("tool 'sub': its sub-agent does not load" in e for e in errors)
    assert any("tool 'nodoc' has no docstring" in w for w in warnings)
    assert any("no `llm`" in w for w in warnings)
    assert found.app is not None and set(found.app.tools) == {"good", "nodoc", "pay", "sub"}


def test_the_command_prints_each_problem_and_exits_1(bad_app: str):
    result = CliRunner().invoke(cli, ["app", "check", "--app", bad_app])
    assert result.exit_code == 1
    assert result.output.count("error: ") >= 6 and "6 error(s)" in result.output


def test_a_sound_app_exits_0_with_what_it_is():
    result = CliRunner().invoke(cli, ["app", "check", "--app", "examples.seed_app"])
    assert result.exit_code == 0, result.output
    assert "app 'examples.seed_app' loads" in result.output
    assert "tool pay: needs approval (anyone)" in result.output
    assert "error" not in result.output


def test_an_app_that_does_not_import_is_one_error_saying_where_it_looked():
    result = CliRunner().invoke(cli, ["app", "check", "--app", "no_such_app_anywhere"])
    assert result.exit_code == 1
    assert "cannot import app module 'no_such_app_anywhere'" in result.output
    assert "looked in the working directory" in result.output
