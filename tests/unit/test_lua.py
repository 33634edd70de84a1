"""parley/runtime/lua.py: a script's `-- requires:` header decides what is put in front of it."""

import re
from pathlib import Path

import pytest

from parley.dispatcher.scripts import LUA as DISPATCHER_LUA
from parley.runtime.lua import LuaError, load_order, requirements

ROOT = Path(__file__).resolve().parents[2]


def reader(sources: dict[str, str]):  # type: ignore[no-untyped-def]
    def read(name: str) -> str:
        if name not in sources:
            raise FileNotFoundError(name)
        return sources[name]
    return read


def test_requirements_are_read_from_the_header_lines() -> None:
    assert requirements("-- requires: a, b\n-- requires: c\nreturn 1") == ["a", "b", "c"]
    assert requirements("-- KEYS[1] the meta hash\nreturn 1") == []


def test_libraries_come_before_what_needs_them_each_once() -> None:
    sources = {"main": "-- requires: b, a\n", "a": "-- requires: base\n", "b": "-- requires: base\n",
               "base": ""}
    assert load_order("main", reader(sources)) == ["base", "b", "a", "main"]


def test_a_missing_library_and_a_cycle_are_clear_errors() -> None:
    with pytest.raises(LuaError, match=r"main\.lua requires gone"):
        load_order("main", reader({"main": "-- requires: gone\n"}))
    with pytest.raises(LuaError, match="need each other: a -> b -> a"):
        load_order("a", reader({"a": "-- requires: b\n", "b": "-- requires: a\n"}))


@pytest.mark.parametrize("folder", ["dispatcher/lua", "workers/lua"])
def test_every_script_of_a_folder_resolves(folder: str) -> None:
    from parley.runtime.lua import LuaFolder

    lua = LuaFolder(ROOT / folder)
    for path in sorted((ROOT / folder).glob("*.lua")):
        source = lua.source(path.stem)
        for library in requirements(path.read_text()):
            assert lua.read(library) in source  # its library in front of it, whole


def test_the_commit_script_carries_the_in_flight_numbering() -> None:
    assert "local function record_inflight" in DISPATCHER_LUA.source("commit")


def test_lua_is_read_only_by_the_folders_loaders() -> None:
    """No module reads a .lua file but through a LuaFolder (one way to load Lua, not three)."""
    readers = {}
    sources = [*ROOT.glob("parley/**/*.py"), *ROOT.glob("dispatcher/**/*.py"), *ROOT.glob("workers/**/*.py")]
    for path in sources:
        text = path.read_text()
        if re.search(r"\.lua[\"')]", text) and ("read_text" in text or "joinpath" in text):
            readers[str(path.relative_to(ROOT))] = True
    assert set(readers) <= {"parley/runtime/lua.py"}, readers
