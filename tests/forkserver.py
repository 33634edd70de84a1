"""The tests' `parley` processes, forked from a warm interpreter instead of started cold.

Why: the suite starts about 450 `parley` processes (dispatchers, workers, inboxes, one-shot
commands), and a cold `python -m parley` spends 0.5-0.8 s of CPU importing Python, redis-py,
rq, pydantic and prometheus before its first command: half of the suite's CPU on 2 cores.
Here one warm interpreter per pytest process (the "zygote", this module run as a program)
imports those once and forks a child per request. Each child is still its own process, a
real one: it gets its own pid, environment, working directory, stdin/stdout/stderr and
`sys.argv`, runs `python -m MODULE` through `runpy` exactly as the interpreter would, exits
with the code the command exits with, and dies to `kill -9` like any process. What it
skips is only the interpreter's start and the imports the zygote already made.

How a child's exit code reaches the test: the zygote forks twice (its child forks the
command and exits), so the command is orphaned and re-parented to the nearest "child
subreaper" (Linux `prctl(PR_SET_CHILD_SUBREAPER)`), which is the pytest process. The pytest
process can then `waitpid` it like any child of its own: `Forked` offers the part of
`subprocess.Popen` the tests use (pid, poll, wait, send_signal, terminate, kill,
returncode).

`PARLEY_TEST_EXEC=1` (or a system without the subreaper call) starts every process cold
with `subprocess`, as before; `tests/unit/test_cli_startup.py` and the packaging tests
always do, since what they check is the cold start itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
PR_SET_CHILD_SUBREAPER = 36
# what the zygote imports before its first fork besides parley's own modules (all of them)
WARM_MODULES = ("redis", "rq", "pydantic", "prometheus_client", "orjson", "click", "jsonschema", "httpx",
)


class Forked:
    """A process the zygote forked, re-parented to this one: the `subprocess.Popen` calls the
    tests make, on a pid this process can `waitpid`."""

    def __init__(self, pid: int, args: list[str]):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done == self.pid:
                self._reaped(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            readable, _, _ = select.select([self._pidfd], [], [], timeout)
            if not readable:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            _, status = os.waitpid(self.pid, 0)
            self._reaped(status)
        assert self.returncode is not None
        return self.returncode

    def _reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        os.close(self._pidfd)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid that is no longer ours
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """This pytest process's end of the zygote: one request (a JSON line) in, one pid out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            log = open(Path(tempfile.gettempdir()) / f"parley-zygote-{os.getpid()}.log", "ab")  # noqa: SIM115
            # ROOT is the zygote's sys.path[0] (`-m` from ROOT), taken out again in each fork
            self._proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver"], cwd=ROOT,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
            log.close()
        return self._proc

    def fork(self, module: str, argv: list[str], env: dict[str, str], cwd: str | None,
             stdin: str | None, stdout: str | None, stderr: str | None) -> Forked:
        request = {"module": module, "argv": argv, "env": env, "cwd": cwd or os.getcwd(),
                   "stdin": stdin, "stdout": stdout, "stderr": stderr}
        with self._lock:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(orjson.dumps(request) + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the test zygote died; see its log in the temp directory")
        return Forked(int(line), [module, *argv])


_zygote = Zygote()


def _subreaper() -> bool:
    if os.environ.get("PARLEY_TEST_EXEC") == "1" or not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


# never in the zygote itself (run as __main__): its forks must not be re-parented to it
FORKING = __name__ != "__main__" and _subreaper()


def _path(target: Any) -> str | None:
    """A file target as the zygote takes it: a path, or None for /dev/null."""
    if target is None or target == subprocess.DEVNULL:
        return None
    return str(target)


def start(module: str, argv: list[str], env: dict[str, str], *, cwd: str | Path | None = None,
          stdout: Path | None = None, stderr_to_stdout: bool = True) -> Forked | subprocess.Popen[bytes]:
    """`python -m MODULE ARGV...` with the environment `env` (whole, not added to ours), its
    output appended to the file `stdout` (stderr too unless told otherwise; None: discarded)."""
    if FORKING:
        out = _path(stdout)
        return _zygote.fork(module, argv, env, str(cwd) if cwd else None, None, out,
                            out if stderr_to_stdout else None)
    handle: IO[bytes] | int = open(stdout, "ab") if stdout else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen([sys.executable, "-m", module, *argv], env=env, cwd=cwd, stdout=handle,
                                stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.DEVNULL)
    finally:
        if not isinstance(handle, int):
            handle.close()


def run(module: str, argv: list[str], env: dict[str, str], *, cwd: str | Path | None = None,
        input: str | bytes | None = None, text: bool = False, timeout: float = 60,
        check: bool = False) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run([python, -m, MODULE, *ARGV], capture_output=True, ...)`, forked."""
    if not FORKING:
        return subprocess.run([sys.executable, "-m", module, *argv], env=env, cwd=cwd, input=input,
                              capture_output=True, text=text, timeout=timeout, check=check)
    with tempfile.TemporaryDirectory(prefix="parley-run-") as scratch:
        out, err, given = (Path(scratch) / name for name in ("out", "err", "in"))
        given.write_bytes(input.encode() if isinstance(input, str) else (input or b""))
        proc = _zygote.fork(module, argv, env, str(cwd) if cwd else None, str(given), str(out), str(err))
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        stdout, stderr = out.read_bytes(), err.read_bytes()
    result: subprocess.CompletedProcess[Any] = subprocess.CompletedProcess(
        proc.args, code, stdout.decode() if text else stdout, stderr.decode() if text else stderr)
    if check:
        result.check_returncode()
    return result


def start_parley(args: list[str], env: dict[str, str], log_path: Path | None = None
                 ) -> Forked | subprocess.Popen[bytes]:
    """`parley.runtime.procs.start_parley`, forked: `parley ARGS...` with `env` added to ours."""
    return start("parley", args, {**os.environ, **env}, stdout=log_path)


def run_parley(args: list[str], env: dict[str, str] | None = None, **options: Any
               ) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run([python, -m, parley, *ARGS], capture_output=True, ...)`, forked; `env`
    is the whole environment (None: ours)."""
    return run("parley", args, dict(os.environ) if env is None else env, **options)


# ----- the zygote itself: `python -m tests.forkserver` -----

def _redirect(fd: int, path: str | None, flags: int) -> None:
    target = os.open(path or os.devnull, flags, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _become(request: dict[str, Any]) -> None:
    """In the forked command: its own stdio, environment, directory and argv; then the module
    runs as `python -m` would run it, and this process ends the way that command ends."""
    _redirect(0, request["stdin"], os.O_RDONLY)
    _redirect(1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    if request["stderr"] == request["stdout"]:
        os.dup2(1, 2)
    else:
        _redirect(2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # sys.path as `python -m` makes it: the working directory, PYTHONPATH's entries, then the
    # interpreter's own (the zygote's, without its working directory and PYTHONPATH)
    extra = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *INTERPRETER_PATH]
    import random

    random.seed()  # a fresh sequence, as a cold process would have
    sys.argv = ["-m", *request["argv"]]
    os._exit(_exit_code(request["module"]))


def _exit_code(module: str) -> int:
    """Run `module` as `__main__` and return the exit code the interpreter would exit with,
    after what its exit would do: join threads, run atexit functions, flush stdio. The
    interpreter's own teardown of every warm module is skipped: it would only copy the
    zygote's memory page by page."""
    import atexit
    import runpy
    import traceback

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # the interpreter ends by the signal itself: exit code -2
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 1
    except BaseException:  # as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does: join the threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream, as at exit
            stream.flush()
    return code


def _warm() -> None:
    """Import every module of `parley` (but its `__main__`) and WARM_MODULES, once: module
    imports have no side effects here (metrics live in parley's own registry, nothing
    connects or starts a thread at import), so a command forked later finds them loaded."""
    import importlib

    names = [".".join((Path(folder) / file).relative_to(ROOT).with_suffix("").parts)
             # followlinks: parley/dispatcher, parley/workers and parley/schemas are links
             for folder, _dirs, files in os.walk(ROOT / "parley", followlinks=True)
             for file in files if file.endswith(".py")]
    for name in [*WARM_MODULES, *sorted(names)]:
        name = name.removesuffix(".__init__")
        if name.endswith("__main__"):
            continue
        with contextlib.suppress(ImportError):  # an optional extra not installed: imported when used
            importlib.import_module(name)


# the zygote's sys.path without what its working directory and PYTHONPATH added
_ZYGOTE_PYTHONPATH = {os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e}
INTERPRETER_PATH = [p for p in sys.path[1:] if p not in _ZYGOTE_PYTHONPATH]


def serve() -> dict[str, Any] | None:
    """The zygote's loop. Returns the request in the forked command (which then runs it), or
    None in the zygote when its parent closes the pipe."""
    _warm()
    import gc

    gc.freeze()  # the warm objects are never collected: a fork's GC leaves their pages shared
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    _redirect(0, None, os.O_RDONLY)
    _redirect(1, None, os.O_WRONLY)
    for line in requests:
        request = orjson.loads(line)
        told, tell = os.pipe()
        middle = os.fork()
        if middle == 0:
            command = os.fork()
            if command == 0:
                for fd in (told, tell):
                    os.close(fd)
                requests.close()
                replies.close()
                return dict(request)
            os.write(tell, f"{command}\n".encode())
            os._exit(0)
        os.close(tell)
        # the pid goes to the test only once `middle` is gone, so that the command is already
        # re-parented to the test's process when it first calls waitpid
        os.waitpid(middle, 0)
        with os.fdopen(told, "rb") as pid:
            replies.write(pid.read())
        replies.flush()
    return None


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    started = serve()
    if started is not None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _become(started)
