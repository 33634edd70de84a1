"""`parley demo` (what `make demo` runs): the seed scenario end to end on a private Redis."""

import subprocess
import sys
from pathlib import Path

from parley.runtime.procs import parley_command

ROOT = Path(__file__).resolve().parents[2]


def demo(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(parley_command("demo", *args), cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL)


def test_demo_approved_sends_the_email() -> None:
    run = demo("--yes")
    assert run.returncode == 0, run.stdout + run.stderr
    # no PARLEY_REDIS_URL: its own Redis, never one that happens to listen on localhost:6379
    assert "started a private redis-server" in run.stdout
    assert "! interrupt int-1 (confirm): Send the email?" in run.stdout
    assert "> human: yes" in run.stdout
    assert "[call-1] sent" in run.stdout  # the tool's result in the transcript
    assert "stopped everything the demo started" in run.stdout


def test_demo_declined_reports_the_tool_error() -> None:
    run = demo("--no")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "> human: no" in run.stdout and "[call-1 error] declined" in run.stdout


def test_demo_outside_a_checkout_says_where_the_seed_app_is(tmp_path: Path) -> None:
    """Installed without the repository, the seed app is not importable: a clear error at once,
    and no process or redis-server left behind."""
    run = demo("--yes", cwd=tmp_path)
    assert run.returncode != 0
    assert "cannot import app module 'examples.seed_app'" in run.stderr
    assert "examples/ folder" in run.stderr and "--app" in run.stderr
    assert "started a private redis-server" not in run.stdout


def test_demo_without_redis_server_says_so_and_fails(tmp_path: Path) -> None:
    """Issue 32: every CLI error exits non-zero, this one included (it was a traceback)."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}  # no /usr/bin: no redis-server
    run = subprocess.run(parley_command("demo", "--yes"), cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=90, stdin=subprocess.DEVNULL)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "cannot start a private redis-server: redis-server is not installed" in run.stderr
    assert "Traceback" not in run.stderr
