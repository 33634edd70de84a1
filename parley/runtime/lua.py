"""Lua scripts kept as files, one loader per folder: a script names the libraries it is built on
in its header, and the loader puts them in front of it, each once, those a library needs before
it. So no module prepends a library by hand, and a script's needs are read where it is written.

    -- requires: inflight_lib, index_lib

A library is a `.lua` file of the same folder that defines `local function`s and runs nothing.
Resolution is pure (`load_order`, unit-tested with a dict of sources); `LuaFolder` reads files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script

_REQUIRES = re.compile(r"^--\s*requires:\s*(.+?)\s*$", re.MULTILINE)


class LuaError(ValueError):
    """A script names a library that is not there, or libraries that need each other."""


def requirements(source: str) -> list[str]:
    """The libraries a script's `-- requires:` lines name, in their order."""
    return [name.strip() for line in _REQUIRES.findall(source) for name in line.split(",") if name.strip()]


def load_order(name: str, read: Callable[[str], str]) -> list[str]:
    """`name` and every library it needs, transitively, each once, each after what it needs:
    the order their sources are joined in."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(current: str) -> None:
        if current in order:
            return
        if current in visiting:
            raise LuaError(f"Lua libraries need each other: {' -> '.join([*visiting, current])}")
        visiting.append(current)
        try:
            source = read(current)
        except FileNotFoundError:
            raise LuaError(f"{visiting[-2] if len(visiting) > 1 else current}.lua requires "
                           f"{current}, which is not there") from None
        for library in requirements(source):
            visit(library)
        visiting.pop()
        order.append(current)

    visit(name)
    return order


class LuaFolder:
    """The `.lua` files of one folder."""

    def __init__(self, directory: Path):
        self.directory = directory

    @classmethod
    def of_package(cls, package: str, folder: str = "lua") -> LuaFolder:
        """The `folder` of an installed package, found without importing it (a producer reads the
        dispatcher's export script and runs none of the engine's code)."""
        spec = find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise LuaError(f"{package} is not installed: its Lua scripts cannot be read")
        return cls(Path(next(iter(spec.submodule_search_locations))) / folder)

    def read(self, name: str) -> str:
        return (self.directory / f"{name}.lua").read_text()

    def source(self, name: str) -> str:
        """The script `name` with its libraries in front: what Redis is given."""
        return _joined(self.directory, name)

    def register(self, redis: Redis, name: str) -> Script:
        """Registered once: EVALSHA, loaded again by redis-py if Redis lost its script cache."""
        return redis.register_script(self.source(name))


@cache
def _joined(directory: Path, name: str) -> str:
    folder = LuaFolder(directory)
    return "".join(folder.read(part) for part in load_order(name, folder.read))
