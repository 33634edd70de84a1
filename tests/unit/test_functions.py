"""The submit function library's loader (dispatcher/functions.py): which version the library
declares, and finding it in a FUNCTION LIST reply, without Redis."""

import pytest

from parley.dispatcher.functions import LIBRARY, library_code, loaded_code, version_of


def test_the_library_declares_its_name_and_a_version() -> None:
    code = library_code()
    assert code.startswith(f"#!lua name={LIBRARY}\n")
    assert version_of(code) >= 1
    assert version_of("#!lua name=parley\nlocal VERSION = 12\n") == 12


def test_a_library_without_a_version_line_is_refused() -> None:
    with pytest.raises(ValueError, match="no `local VERSION = N`"):
        version_of("#!lua name=parley\nlocal V = 1\n")


def test_loaded_code_reads_resp2_and_resp3_replies_and_ignores_other_libraries() -> None:
    resp2 = [[b"library_name", b"other", b"engine", b"LUA", b"functions", [], b"library_code", b"x"],
             [b"library_name", b"parley", b"engine", b"LUA", b"functions", [], b"library_code", b"code"]]
    assert loaded_code(resp2) == "code"
    resp3 = [{"library_name": "parley", "engine": "LUA", "functions": [], "library_code": "c3"}]
    assert loaded_code(resp3) == "c3"
    assert loaded_code([]) is None
    assert loaded_code(resp2[:1]) is None
