"""Layers import one way (docs/design.md): the CLI face on top; dispatcher and workers below
it; metrics, logging and retry below those; the wire contract (schemas) at the bottom. Read
from the source with `ast`, so nothing is imported and a lazy import inside a function counts."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def all_imports_of(path: Path) -> set[str]:
    """Every module a file imports, of any package, at any depth; for `from m import n`, both
    `m` and `m.n` (n may be a submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imports_of(path: Path) -> set[str]:
    """Every `parley...` module a file imports (relative imports are not used)."""
    return {name for name in all_imports_of(path) if name == "parley" or name.startswith("parley.")}


def files(*parts: str) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        target = ROOT / part
        out += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return out


def offenders(sources: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in sources:
        # a module or anything under it: `parley.cli` forbids parley.cli.x, not parley.client
        hits = sorted(m for m in imports_of(path)
                      if any(m == f or m.startswith(f + ".") for f in forbidden))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    return bad


#: the floors of `parley`, top to bottom (docs/design.md, "The code"): each may import only
#: what stands below it (and itself); the dispatcher and the workers stand on the runtime floor
FACE = ("parley.cli", "parley.web", "parley.agui")
FLEET = ("parley.fleet",)
ENGINE = ("parley.dispatcher", "parley.workers")
CLIENT = ("parley.client", "parley.aclient")
RUNTIME = ("parley.runtime",)


@pytest.mark.parametrize(("sources", "forbidden"), [
    # the face (the command line, the inbox page) is the top: nothing imports it
    (("parley/client", "parley/fleet", "parley/runtime", "dispatcher", "workers", "schemas"), FACE),
    # the engine imports nothing of `parley` but the runtime floor
    (("dispatcher", "workers"), (*FACE, *FLEET, *CLIENT)),
    # the runtime floor: usable by every process, importing none of them
    (("parley/runtime",), (*FACE, *FLEET, *ENGINE, *CLIENT)),
    # a producer needs neither the dispatcher nor the workers installed and imported
    (("parley/client", "parley/aclient.py"), (*FACE, *FLEET, *ENGINE)),
    # the inbox page is a producer's view too: no engine inside it
    (("parley/web",), ("parley.cli", *FLEET, *ENGINE)),
    # so is the AG-UI endpoint
    (("parley/agui",), ("parley.cli", "parley.web", *FLEET, *ENGINE)),
    # the wire contract is the bottom layer
    (("schemas",), (*FACE, *FLEET, *ENGINE, *CLIENT, *RUNTIME)),
    # workers never touch session state, so they need nothing of the dispatcher
    (("workers",), ("parley.dispatcher",)),
], ids=["face-on-top", "engine-on-runtime", "runtime-floor", "client", "inbox-page", "agui-endpoint",
        "schemas",
        "workers-not-dispatcher"])
def test_layers_import_downward_only(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    assert offenders(files(*sources), forbidden) == {}


def test_the_retry_module_imports_nothing_of_parley() -> None:
    assert imports_of(ROOT / "parley/runtime/retry.py") == set()


def test_the_core_is_pure() -> None:
    """The core takes time as an argument and returns values: no Redis, RQ, clock, randomness,
    environment, logging or metrics, and nothing of the shell around it."""
    impure = ("redis", "rq", "time", "random", "os", "socket", "threading", "logging", "datetime",
              "parley.runtime", "parley.cli", "parley.workers", "parley.client", "parley.fleet")
    bad = {}
    for path in files("dispatcher/core"):
        hits = sorted(m for m in all_imports_of(path)
                      if m.split(".")[0] in impure or m.startswith(impure)
                      or (m.startswith("parley.dispatcher") and not m.startswith("parley.dispatcher.core")))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert bad == {}
    assert len(files("dispatcher/core")) > 5  # the folder is there and read
