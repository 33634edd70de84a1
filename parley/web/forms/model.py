"""What an answer form is made of: its fields (`FormField`, of a `FieldKind`), the form
(`AnswerForm`), a submitted form read back (`ReadAnswer`), and the payloads of a form without a
schema (`APPROVE` / `DECLINE`). Plain values: generate.py makes them, templates/_form.html
renders them, read.py fills a `ReadAnswer`."""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

APPROVE: dict[str, Any] = {"approved": True}
DECLINE: dict[str, Any] = {"approved": False}
ROOT = "answer"

#: the most items an array field reads when its schema sets no smaller `maxItems`: a submitted
#: name like `answer.tags.999999999` must not make a huge list
MAX_ARRAY_ITEMS = 1000


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
    #: an object's property: its name in the schema ("" for the root and array items)
    key: str = ""
    #: the last part of `name` (`city`, `0`, `due%20date`): templates build an item's names
    #: from its array's name and these
    segment: str = ROOT
    #: STRING / NUMBER / INTEGER: the input's `type` (text, email, date, url, number)
    input_type: str = "text"
    #: STRING: a textarea
    multiline: bool = False
    #: the browser's `required` attribute: a required field none of whose enclosing fields may
    #: be left empty (not inside an optional object, nor an array item, nor a boolean)
    html_required: bool = False
    #: ENUM: the option values as sent (the JSON text of each of `options`)
    option_values: tuple[str, ...] = ()
    #: ENUM: what each option shows
    option_labels: tuple[str, ...] = ()
    #: ARRAY: items rendered at least, and at most (None: MAX_ARRAY_ITEMS)
    min_items: int = 0
    max_items: int | None = None
    #: BOOLEAN: a checkbox (unticked is `false`); else a no answer / Yes / No select, so an
    #: optional boolean can be answered `false` and left out too
    checkbox: bool = False


@dataclass(frozen=True)
class AnswerForm:
    #: None: no schema, Approve / Decline
    root: FormField | None
    #: the raw values of a fresh form (from the schema's `default`s), in the shape of
    #: `ReadAnswer.values`: what the template shows when given no submitted values
    initial: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadAnswer:
    #: the payload (meaningful only when `errors` is empty)
    value: Any
    #: field name -> message, for the fields whose value is missing, unreadable or fails the
    #: schema; `answer` for an error about the whole payload
    errors: dict[str, str]
    #: what was submitted, to fill the form again after an error: field name -> raw string, and
    #: an array's name -> its items' names as submitted (templates/_form.html `values`)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def item_cap(array: FormField) -> int:
    """The most items an ARRAY field reads: its `maxItems`, at most MAX_ARRAY_ITEMS."""
    return MAX_ARRAY_ITEMS if array.max_items is None else min(array.max_items, MAX_ARRAY_ITEMS)
