"""The tests' forked `parley` processes behave as cold ones would (tests/forkserver.py): their
own pid, environment, directory, stdio, exit code and death by signal, and no module path
of the zygote's that a cold process would not have."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forkserver

pytestmark = pytest.mark.skipif(not forkserver.FORKING, reason="PARLEY_TEST_EXEC=1: every process is cold")

PROBE = """import os, sys
print(os.getpid(), os.getppid(), os.getcwd(), sys.argv[1:], os.environ.get("PROBE"), sep="|")
print("to stderr", file=sys.stderr)
raise SystemExit(int(sys.argv[1]))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    """A module `probe` in its own folder, importable only through PYTHONPATH."""
    folder = tmp_path / "lib"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    return folder


def test_a_forked_command_has_its_own_pid_env_directory_argv_output_and_exit_code(
        probe: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(probe), "PROBE": "given", "PATH": "/usr/bin:/bin"}
    done = forkserver.run("probe", ["3", "more"], env, cwd=tmp_path, text=True)
    pid, _parent, cwd, argv, value = done.stdout.strip().split("|")
    assert done.returncode == 3 and done.stderr == "to stderr\n"
    assert int(pid) not in (os.getpid(), 0) and cwd == str(tmp_path)
    assert argv == "['3', 'more']" and value == "given"
    assert forkserver.run("probe", ["0"], env, cwd=tmp_path).returncode == 0


def test_a_forked_command_sees_no_path_of_the_zygote_a_cold_one_would_not(tmp_path: Path) -> None:
    """From another directory and without PYTHONPATH, the repository's own packages are not
    importable by path (the zygote runs from the repository): as for a cold `python -m`."""
    code = "import importlib.util, sys; print(importlib.util.find_spec('examples') is None, sys.path[0])"
    (tmp_path / "probe_path.py").write_text(code)
    env = {"PATH": "/usr/bin:/bin"}
    forked = forkserver.run("probe_path", [], {**env, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path, text=True)
    cold = subprocess.run([sys.executable, "-m", "probe_path"], env={**env, "PYTHONPATH": str(tmp_path)},
                          cwd=tmp_path, capture_output=True, text=True, check=True)
    assert forked.stdout == cold.stdout == f"True {tmp_path}\n", (forked, cold)


def test_a_forked_process_is_waited_signalled_and_killed_like_a_popen(probe: Path, tmp_path: Path) -> None:
    (probe / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    log = tmp_path / "out.log"
    proc = forkserver.start("sleeper", [], {"PYTHONPATH": str(probe)}, stdout=log)
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL and proc.returncode == -signal.SIGKILL
    proc.kill()  # a process already reaped is never signalled again


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(probe: Path) -> None:
    (probe / "broken.py").write_text("raise ValueError('boom')\n")
    done = forkserver.run("broken", [], {"PYTHONPATH": str(probe)}, text=True)
    assert done.returncode == 1 and "ValueError: boom" in done.stderr and "Traceback" in done.stderr


def test_a_forked_command_starts_with_parley_and_its_libraries_loaded(probe: Path) -> None:
    """What the fork server is for: the imports a cold `parley` pays for are made (the CPU
    it saves is in the suite's figures, not asserted here)."""
    names = "{'rq', 'redis', 'pydantic', 'parley.dispatcher.store', 'parley.workers.worker'}"
    (probe / "loaded.py").write_text(f"import sys\nprint(sorted({names} & set(sys.modules)))\n")
    done = forkserver.run("loaded", [], {"PYTHONPATH": str(probe)}, text=True)
    assert done.stdout.strip() == str(sorted(["rq", "redis", "pydantic", "parley.dispatcher.store",
                                              "parley.workers.worker"])), done
