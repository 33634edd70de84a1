"""parley/runtime/lazy.py: a package's exports imported when first used, once."""

import sys
from typing import Any

import pytest

from parley.runtime.lazy import lazy_exports


def test_an_export_is_imported_when_first_used_and_kept() -> None:
    namespace: dict[str, Any] = {"__name__": "pkg"}
    getattr_, dir_ = lazy_exports("pkg", {"dedent": "textwrap"}, namespace)
    assert "dedent" not in namespace and dir_() == ["__name__", "dedent"]
    value = getattr_("dedent")
    assert value is sys.modules["textwrap"].dedent and namespace["dedent"] is value


def test_an_unknown_name_is_an_attribute_error_naming_the_package() -> None:
    getattr_, _dir = lazy_exports("pkg", {}, {})
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        getattr_("nope")


@pytest.mark.parametrize("package, name", [("parley", "Client"), ("parley.client", "AsyncClient"),
                                           ("parley.workers.llm", "ScriptedModel")])
def test_the_packages_export_their_names_and_refuse_others(package: str, name: str) -> None:
    module = __import__(package, fromlist=["_"])
    assert name in dir(module) and getattr(module, name).__name__ == name
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'Nope'"):
        module.Nope  # noqa: B018 - the lookup is the test
