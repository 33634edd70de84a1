"""Names a package exports without importing their modules until first used (PEP 562).

A package's `__init__` names where each export lives; importing one part of the package
(`parley.client.producer`, `parley.workers.llm.limits`) then loads none of the others, so
each process pays at start only for what it uses.
"""

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package`, whose `namespace` is its
    `globals()`: `homes` maps each exported name to the module that defines it (or to
    `module:attr`, a name exported under another than its own)."""

    def getattr_(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = homes[name].partition(":")
        value = getattr(import_module(module), attr or name)
        namespace[name] = value  # once: later lookups do not come here
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
