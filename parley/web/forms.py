"""The answer form of an interrupt, generated from its `response_schema` (pure, no I/O).

`answer_form(schema)` describes the fields to render (templates/_form.html renders them);
`read_answer(schema, items)` turns a submitted form back into the JSON payload and checks it
against the schema (Draft 2020-12, as the engine does), with each error keyed by the field's
HTML name so the page shows it beside that field before anything is sent. With no schema the
form is Approve / Decline: `APPROVE` / `DECLINE` are the payloads.

Field names: the root is `answer`; an object's property `city` is `answer.city`; an array's
items are `answer.tags.0`, `answer.tags.1`, ... (nested the same way). Their JSON paths, as the
engine reports a refusal's `path`, are `$`, `$.city`, `$.tags[0]`.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

APPROVE: dict[str, Any] = {"approved": True}
DECLINE: dict[str, Any] = {"approved": False}
ROOT = "answer"


class FieldKind(StrEnum):
    STRING = "string"
    NUMBER = "number"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    #: `enum` (or `const`): one of the listed values, as a select
    ENUM = "enum"
    OBJECT = "object"
    ARRAY = "array"
    #: anything the generator does not render field by field: a JSON text area
    JSON = "json"


@dataclass(frozen=True)
class FormField:
    #: the HTML name (`answer`, `answer.city`, `answer.tags.0`)
    name: str
    #: the JSON path of its value (`$`, `$.city`, `$.tags[0]`)
    path: str
    label: str
    kind: FieldKind
    required: bool = False
    description: str | None = None
    #: ENUM: the values, in the schema's order
    options: tuple[Any, ...] = ()
    #: OBJECT: its properties' fields, in the schema's order
    children: tuple["FormField", ...] = ()
    #: ARRAY: the field of one item (named with index 0; the template renumbers)
    item: "FormField | None" = None
    #: HTML constraint attributes checked by the browser too (minlength, maxlength, min, max,
    #: step, pattern)
    attrs: dict[str, str] = field(default_factory=dict)
    default: Any = None


@dataclass(frozen=True)
class AnswerForm:
    #: None: no schema, Approve / Decline
    root: FormField | None


@dataclass(frozen=True)
class ReadAnswer:
    #: the payload (meaningful only when `errors` is empty)
    value: Any
    #: field name -> message, for the fields whose value is missing, unreadable or fails the
    #: schema; `answer` for an error about the whole payload
    errors: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.errors


def answer_form(schema: dict[str, Any] | None) -> AnswerForm:
    """The fields of a form for `schema` (None: Approve / Decline)."""
    raise NotImplementedError


def read_answer(schema: dict[str, Any], items: Sequence[tuple[str, str]]) -> ReadAnswer:
    """The payload of a submitted form (its (name, value) pairs, in order), checked."""
    raise NotImplementedError


def field_of_path(path: str | None) -> str:
    """The field name of an engine refusal's JSON `path` (`$.tags[0]` -> `answer.tags.0`)."""
    raise NotImplementedError
