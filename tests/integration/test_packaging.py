"""What gets installed: one import package, `parley`, usable next to a project's own packages.

The repository keeps the folders schemas/, dispatcher/ and workers/; the wheel installs them as
parley.schemas, parley.dispatcher and parley.workers. A project with packages of the same
names (a FastAPI-style `schemas`, its own `workers`) must be able to import Parley's client
and run Parley's worker and dispatcher on an app that imports its own packages."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from parley.runtime.procs import RedisServer, stop_processes

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "parley", "schemas", "dispatcher", "workers", "examples"]
# Folders of the repository and where they land in the wheel.
INSTALLED_AS = {"parley": "parley", "schemas": "parley/schemas", "dispatcher": "parley/dispatcher",
                "workers": "parley/workers"}
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the sources (the build writes build/ and *.egg-info)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    # No build isolation: setuptools comes from the dev install, so no index is needed.
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "-w", str(work / "out"), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = (work / "out").glob("parley-*.whl")
    return path, built.stdout + built.stderr


def test_the_wheel_installs_one_top_level_package(wheel: tuple[Path, str]) -> None:
    path, _log = wheel
    names = zipfile.ZipFile(path).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"parley"}
    assert "parley/schemas/keys.py" in names and "parley/workers/jobs.py" in names
    assert not [n for n in names if "examples" in n]


def test_the_wheel_holds_every_module_and_lua_script(wheel: tuple[Path, str]) -> None:
    """A subpackage left out of pyproject's `packages` would install broken: compare the trees."""
    path, _log = wheel
    names = set(zipfile.ZipFile(path).namelist())
    expected = {f"{INSTALLED_AS[folder]}/{file.relative_to(ROOT / folder).as_posix()}"
                for folder in INSTALLED_AS
                for file in (ROOT / folder).rglob("*")
                if file.suffix in {".py", ".lua"} and "__pycache__" not in file.parts}
    assert expected - names == set()
    assert any(n.endswith("lua/commit.lua") for n in names)


def test_the_build_prints_no_setuptools_warnings(wheel: tuple[Path, str]) -> None:
    _path, log = wheel
    noisy = re.compile(r"would be ignored|SetuptoolsWarning|SetuptoolsDeprecationWarning|"
                       r"InformationOnly|is deprecated", re.IGNORECASE)
    assert [line for line in log.splitlines() if noisy.search(line)] == []


def test_parley_runs_next_to_a_project_with_its_own_schemas_workers_and_dispatcher(
        tmp_path: Path) -> None:
    """From a project whose own packages are named schemas, workers and dispatcher: the app
    imports them, `parley dispatcher` and `parley worker` run it, `from parley import Client`
    drives a session to the tool's result (the tool's answer comes from the project's code)."""
    project = tmp_path / "project"
    for package, body in {
        "schemas": "class Greeting:\n    text = 'hello from the project'\n",
        "workers": "def shout(text: str) -> str:\n    return text.upper()\n",
        "dispatcher": "ROUTE = 'project-dispatcher'\n",
    }.items():
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(body)
    (project / "myapp.py").write_text(
        "from dispatcher import ROUTE\n"
        "from schemas import Greeting\n"
        "from workers import shout\n"
        "from parley import ScriptedModel\n\n"
        "def greet(name: str) -> str:\n"
        "    '''Greet someone.'''\n"
        "    return shout(f'{Greeting.text}, {name} ({ROUTE})')\n\n"
        "tools = [greet]\n"
        "llm = ScriptedModel().when(r'greet (?P<name>\\w+)', 'greet')\n")
    (project / "producer.py").write_text(
        "import sys, time\n"
        "import redis\n"
        "from parley import Client\n"
        "client = Client(redis.Redis.from_url(sys.argv[1]))\n"
        "client.send('s-pkg', {'type': 'message.create', 'content': 'greet ada'})\n"
        "for _id, event in client.events('s-pkg', until=time.monotonic() + 30):\n"
        "    if event['type'] == 'turn.completed':\n"
        "        break\n"
        "view = client.show('s-pkg')\n"
        "print([m['content'] for m in view['messages'] if m['role'] == 'tool'])\n")
    server = RedisServer(tmp_path / "redis").start()
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "PARLEY_REDIS_URL": server.url, "PARLEY_APP": "myapp",
           "HOME": str(tmp_path)}  # no PYTHONPATH: only the project and the installed parley
    logs = {kind: open(tmp_path / f"{kind}.log", "wb") for kind in ("dispatcher", "worker")}  # noqa: SIM115
    procs = [subprocess.Popen([str(BIN / "parley"), kind], cwd=project, env=env, stdout=log,
                              stderr=subprocess.STDOUT) for kind, log in logs.items()]
    try:
        produced = subprocess.run([str(BIN / "python"), "producer.py", server.url], cwd=project,
                                  env=env, capture_output=True, text=True, timeout=60)
    finally:
        codes = stop_processes(procs)
        server.stop(kill=True)
        for log in logs.values():
            log.close()
    output = "\n".join(f"--- {k}\n{(tmp_path / f'{k}.log').read_text()[-3000:]}" for k in logs)
    assert produced.returncode == 0, produced.stderr + output
    assert "HELLO FROM THE PROJECT, ADA (PROJECT-DISPATCHER)" in produced.stdout, produced.stdout + output
    assert codes == [0, 0], output


def loaded_after(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules starting with `prefixes` that a fresh interpreter holds after `statement`."""
    code = (f"import sys\n{statement}\n"
            f"print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return list(eval(run.stdout))  # a printed list of module names


def test_a_producer_loads_neither_the_dispatcher_nor_the_workers() -> None:
    """Layers at run time, not only in the source: the client pulls in no engine code and no
    HTTP client of the model adapters."""
    heavy = ("parley.dispatcher", "parley.workers", "parley.cli.", "httpx", "rq")
    assert loaded_after("from parley import Client", heavy) == []
    assert loaded_after("import parley.client", heavy) == []
    assert loaded_after("from parley import AsyncClient", heavy) == []
    assert loaded_after("import parley.aclient", heavy) == []
    # and each client loads only its own Redis: a sync producer never loads redis.asyncio's client
    assert "parley.aclient" not in loaded_after("from parley import Client", ("parley.aclient",))


def test_the_core_loads_no_io_library() -> None:
    assert loaded_after("import parley.dispatcher.core",
                        ("redis", "rq", "httpx", "parley.workers", "parley.client", "parley.cli.")) == []


def test_the_public_names_resolve() -> None:
    names = loaded_after("from parley import AsyncClient, Client, Decision, InvalidInput, OpenAICompatible\n"
                         "from parley import ScriptedModel, Trigger\n"
                         "import parley\n"
                         "assert set(parley.__all__) <= set(dir(parley))\n"
                         "try:\n    parley.Nope\nexcept AttributeError:\n    pass\n"
                         "else:\n    raise SystemExit('parley.Nope resolved')",
                         ("parley.workers.llm",))
    assert "parley.workers.llm" in names
