"""A module a planted job hash names as its callback: importing or calling it must never happen."""

import os

os.environ["PARLEY_PLANTED_CALLBACK_IMPORTED"] = "1"


def boom(*args: object, **kwargs: object) -> None:
    job = args[0]
    job.connection.set("planted-callback-ran", 1)  # type: ignore[attr-defined]
