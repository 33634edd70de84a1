"""The workers' Lua scripts (workers/lua/): the folder's one loader. A script's header names
the libraries it is built on (`-- requires: ...`, parley/runtime/lua.py)."""

from pathlib import Path

from parley.runtime.lua import LuaFolder

LUA = LuaFolder(Path(__file__).resolve().parent / "lua")
