"""The answer form of an interrupt, generated from its `response_schema` and read back (pure,
no I/O): a form is FormFields (model.py); `answer_form(schema)` makes it (generate.py), and
templates/_form.html renders it; `read_answer(schema, items)` turns a submitted form back into
the JSON payload (read.py) and checks it against the schema, with each error beside its field
(check.py); field names and the engine's JSON paths map to each other (names.py). With no
schema the form is Approve / Decline: `APPROVE` / `DECLINE` are the payloads.
"""

from parley.web.forms.check import MAX_ERRORS_LOOKED_AT, MAX_MESSAGE_CHARS
from parley.web.forms.generate import MAX_DEPTH, MULTILINE_ABOVE, answer_form, json_text
from parley.web.forms.model import (
    APPROVE,
    DECLINE,
    MAX_ARRAY_ITEMS,
    ROOT,
    AnswerForm,
    FieldKind,
    FormField,
    ReadAnswer,
)
from parley.web.forms.names import field_of_path, key_of_segment
from parley.web.forms.read import MAX_VALUE_BYTES, read_answer

__all__ = [
    "APPROVE",
    "DECLINE",
    "MAX_ARRAY_ITEMS",
    "MAX_DEPTH",
    "MAX_ERRORS_LOOKED_AT",
    "MAX_MESSAGE_CHARS",
    "MAX_VALUE_BYTES",
    "MULTILINE_ABOVE",
    "ROOT",
    "AnswerForm",
    "FieldKind",
    "FormField",
    "ReadAnswer",
    "answer_form",
    "field_of_path",
    "json_text",
    "key_of_segment",
    "read_answer",
]
