"""docs/write-an-app.md is true: its code blocks, put together as the page says (each block
whose first line is `# NAME.py` goes on the end of that file), make an app whose own tests pass;
the output the page shows for `parley app check` and for a failing tool is what Parley prints."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from parley.cli.main import cli
from parley.cli.transcript import _text
from parley.testing import AppRunner

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "write-an-app.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", PAGE, re.DOTALL)


def files() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for lang, body in BLOCKS:
        first = body.splitlines()[0] if body else ""
        name = re.fullmatch(r"# (\w+\.py)", first)
        if lang == "python" and name:
            out.setdefault(name.group(1), []).append(body)
    return out


@pytest.fixture
def app_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, parts in files().items():
        (tmp_path / name).write_text("\n\n".join(parts))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("refunds", None)


def test_the_page_builds_an_app_and_its_tests() -> None:
    assert set(files()) == {"refunds.py", "test_refunds.py"}
    assert len(files()["refunds.py"]) == 3 and len(files()["test_refunds.py"]) == 3


def test_the_pages_tests_pass_against_the_pages_app(app_folder: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_refunds.py"],
                          cwd=app_folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout


def test_the_check_output_shown_is_what_the_first_app_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    (tmp_path / "refunds.py").write_text(files()["refunds.py"][0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        result = CliRunner().invoke(cli, ["app", "check", "--app", "refunds"])
    finally:
        sys.modules.pop("refunds", None)
    assert result.exit_code == 0, result.output
    shown = next(body for lang, body in BLOCKS if not lang and body.startswith("app 'refunds' loads"))
    assert result.output == shown


def test_the_failing_tool_line_shown_is_what_parley_show_prints(app_folder: Path) -> None:
    run = AppRunner("refunds").session()
    run.send("Please refund A-9999")
    run.resume(run.questions[0], {"approved": True})
    [tool_message] = [m for m in run.messages if m["role"] == "tool"]
    line = f"   {tool_message['id']} tool      " + "".join(_text(tool_message))
    assert line in PAGE
