"""What is wrong with a decision an app returned, in one line a person can act on.

pydantic's own report of a bad decision names its internals (union tags, error types, a link
to its documentation); an app author needs the action, the field and the fix. `explain` turns
a `ValidationError` of `Decision` into that line, with a "did you mean" for a misspelt action
type or field name.
"""

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


def explain(exc: ValidationError, actions: dict[str, type[BaseModel]]) -> str:
    """One line for every error of `exc`, joined by "; ". `actions`: each action type's model."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        line = _one(error, actions)
        if line not in lines:
            lines.append(line)
    return "; ".join(lines)


def returned(value: Any) -> str:
    """Why a value that is no decision at all (a string, a number) is none."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return (f"decide returned a {type(value).__name__} ({shown}): return `proposed`, a `Decision`, "
            'a list of actions or {"actions": [...]}')


def did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _one(error: Any, actions: dict[str, type[BaseModel]]) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    types = list(actions)
    if not loc or loc[0] != "actions":
        if kind == "extra_forbidden":
            return f"a decision holds `actions` only, not {loc[-1]!r}" if loc else error["msg"]
        return f"decision: {error['msg']}"
    if len(loc) == 1:
        return f"`actions` must be a list of actions, not {_got(error)}"
    where = f"actions[{loc[1]}]"
    if len(loc) == 2:
        if kind == "union_tag_invalid":
            tag = str(error.get("ctx", {}).get("tag", ""))
            return (f"{where}: unknown action type {tag!r}{did_you_mean(tag, types)}; "
                    f"the types are {', '.join(types)}")
        if kind == "union_tag_not_found":
            return f"{where}: an action needs a `type`, one of {', '.join(types)}"
        return f"{where}: an action is a dict (or an action object) with a `type`, not {_got(error)}"
    tag, path = str(loc[2]), [str(p) for p in loc[3:]]
    model = actions.get(tag)
    fields = [f for f in (model.model_fields if model else {}) if f != "type"]
    where = f"{where} ({tag})"
    if not path:
        return f"{where}: {error['msg']}"
    name = path[0]
    shown = ".".join(path)
    if kind == "missing":
        return f"{where}: `{shown}` is required"
    if kind == "extra_forbidden" and len(path) == 1:
        return (f"{where}: unknown field {name!r}{did_you_mean(name, fields)}; "
                f"its fields are {', '.join(fields)}")
    return f"{where}: `{shown}`: {error['msg']} (got {_got(error)})"


def _got(error: Any) -> str:
    value = error.get("input")
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{type(value).__name__} {shown}"
