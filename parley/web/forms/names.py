"""Field names and JSON paths, and the one from the other.

The root's field is `answer`; an object's property `city` is `answer.city`; an array's items
are `answer.tags.0`, `answer.tags.1`, ... (nested the same way). Their JSON paths, as the
engine reports a refusal's `path`, are `$`, `$.city`, `$.tags[0]`. A property name with
characters other than ASCII letters, digits, `_` and `-` is percent-encoded in the field name
(`due date` -> `answer.due%20date`), so a name is always unambiguous and usable as an HTML id.
"""

import re
from urllib.parse import unquote

from parley.web.forms.model import ROOT, AnswerForm, FieldKind

#: a name segment keeps these characters; the others are percent-encoded
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_-]*$")
#: jsonschema writes a property as `.name` when it matches this, else `['name']`
_PLAIN_PROPERTY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")


def field_of_path(path: str | None, form: AnswerForm | None = None) -> str:
    """The field name of an engine refusal's JSON `path` (`$.tags[0]` -> `answer.tags.0`).

    With `form`, the deepest field of that form the path reaches (a path inside a JSON text
    area is that text area's name). A path that cannot be read is the whole answer's."""
    parts = _parse_json_path(path) if path else []
    if parts is None:
        return ROOT
    name = ROOT
    node = form.root if form is not None else None
    for part in parts:
        if form is not None:
            if node is None:
                break
            if node.kind is FieldKind.OBJECT and isinstance(part, str):
                node = next((c for c in node.children if c.key == part), None)
                if node is None:
                    break
            elif node.kind is FieldKind.ARRAY and isinstance(part, int):
                node = node.item
            else:
                break
        name += "." + (str(part) if isinstance(part, int) else segment_of(part))
    return name


def _parse_json_path(path: str) -> list[str | int] | None:
    """`$.a[0]['b c']` as jsonschema writes it -> ["a", 0, "b c"] (None: not such a path)."""
    if not path.startswith("$"):
        return None
    parts: list[str | int] = []
    i, end = 1, len(path)
    while i < end:
        if path[i] == ".":
            match = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*").match(path, i + 1)
            if match is None:
                return None
            parts.append(match.group())
            i = match.end()
        elif path.startswith("['", i):
            key, i = [], i + 2
            while i < end and path[i] != "'":
                if path[i] == "\\" and i + 1 < end:
                    i += 1
                key.append(path[i])
                i += 1
            if not path.startswith("']", i):
                return None
            parts.append("".join(key))
            i += 2
        elif path[i] == "[":
            match = re.compile(r"\[([0-9]{1,9})\]").match(path, i)
            if match is None:
                return None
            parts.append(int(match.group(1)))
            i = match.end()
        else:
            return None
    return parts


def segment_of(key: str) -> str:
    """A property name as a part of a field name: `.` and `%` (and anything but letters,
    digits, `_`, `-`) percent-encoded, so names split on `.` and work as HTML ids."""
    if _SAFE_SEGMENT.match(key):
        return key
    return "".join(c if _SAFE_SEGMENT.match(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in key)


def key_of_segment(segment: str) -> str:
    """The property name a field name's segment stands for (`due%20date` -> `due date`)."""
    return unquote(segment)


def json_path_child(path: str, key: str) -> str:
    """The JSON path of property `key` of the value at `path`, as jsonschema writes it."""
    if _PLAIN_PROPERTY.match(key):
        return f"{path}.{key}"
    return "{}['{}']".format(path, key.replace("\\", "\\\\").replace("'", "\\'"))
