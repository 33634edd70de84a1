"""The docs keep up with the code.

- docs/protocol.md names every input, event, trigger and action type the code defines, every
  field of their models, and every refusal and ignore code;
- docs/rules.md has a section for each interrupt rule (I1-I13, I6a), each naming at least one
  test as `tests/<file>.py::<name>`, and every test it names exists;
- the README, docs/, deploy/ docs and `parley --help` (every subcommand) never send a user to
  a contract outside the project;
- local links of README.md and docs/*.md lead to files that exist.
"""

import ast
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import BaseModel

from parley.cli import cli
from parley.schemas import actions, events, inputs, triggers
from parley.schemas.codes import IgnoreCode, RefusalCode

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"
RULES = ROOT / "docs" / "rules.md"
RULE_IDS = [f"I{n}" for n in range(1, 14)] + ["I6a"]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "deploy").rglob("*.md"))]
# What users never get: the internal contract the project was specified from.
# (a YAML `spec:` key in a manifest is not a pointer to our spec)
OUTSIDE = re.compile(r"\bspec\b(?!:\s*$)|shared/|planning repo", re.IGNORECASE)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def codes() -> set[str]:
    """Every refusal and ignore code: the members of the enums the core and the events use."""
    return {c.value for c in RefusalCode} | {c.value for c in IgnoreCode}


def union_models(annotated: Any) -> list[type[BaseModel]]:
    """The models of a discriminated union `Annotated[A | B | ..., Field(...)]`."""
    union = typing.get_args(annotated)[0]
    return [m for m in typing.get_args(union) if isinstance(m, type) and issubclass(m, BaseModel)]


def type_of(model: type[BaseModel]) -> str:
    (value,) = typing.get_args(model.model_fields["type"].annotation)
    return str(value)


def quoted_words(path: Path) -> set[str]:
    """Every name written in backticks in a doc (`x`, `x?`, `{a, b?}`, `x.y`)."""
    spans = re.findall(r"`([^`\n]+)`", path.read_text())
    return {w for span in spans for w in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", span)}


# ---- docs/protocol.md ------------------------------------------------------------------------


INPUT_MODELS = union_models(inputs.Input)
EVENT_MODELS = union_models(events.Event)
ACTION_MODELS = union_models(actions.Action)


def test_the_models_are_found() -> None:
    assert {type_of(m) for m in INPUT_MODELS} == set(inputs.INPUT_TYPES)
    assert len(EVENT_MODELS) >= 18 and len(ACTION_MODELS) >= 6
    assert {"branch_parked", "turn_in_progress", "duplicate_message_id", "already_settled"} <= codes()


@pytest.mark.parametrize(("kind", "names"), [
    ("input", sorted(inputs.INPUT_TYPES)),
    ("event", sorted(type_of(m) for m in EVENT_MODELS)),
    ("trigger", sorted(triggers.TRIGGER_TYPES)),
    ("action", sorted(type_of(m) for m in ACTION_MODELS)),
    ("code", sorted(codes())),
])
def test_protocol_names_every_type_and_code(kind: str, names: list[str]) -> None:
    written = quoted_words(PROTOCOL)
    missing = [n for n in names if n not in written]
    assert not missing, f"docs/protocol.md does not name these {kind}s: {missing}"


@pytest.mark.parametrize("model", [*INPUT_MODELS, *EVENT_MODELS, *ACTION_MODELS, triggers.Trigger],
                         ids=lambda m: m.__name__)
def test_protocol_names_every_field(model: type[BaseModel]) -> None:
    written = quoted_words(PROTOCOL)
    missing = [f for f in model.model_fields if f not in written]
    assert not missing, f"docs/protocol.md does not name these fields of {model.__name__}: {missing}"


def test_protocol_lists_the_codes_in_its_order_of_checks() -> None:
    text = PROTOCOL.read_text()
    start = text.index("## Order of checks")
    section = text[start:text.index("\n## ", start + 1)]
    missing = [c for c in sorted(codes()) if f"`{c}`" not in section]
    assert not missing, f"the order of checks leaves out {missing}"


# ---- docs/rules.md ---------------------------------------------------------------------------


def rule_sections() -> dict[str, str]:
    """Rule id -> the text of its `## I<n> ...` section."""
    parts = re.split(r"^## ", RULES.read_text(), flags=re.MULTILINE)[1:]
    sections: dict[str, str] = {}
    for part in parts:
        match = re.match(r"(I\d+a?)\b", part)
        if match:
            sections[match.group(1)] = part
    return sections


def module_names(path: Path) -> set[str]:
    """Names a test file defines at module level (functions, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("rule", RULE_IDS)
def test_every_rule_has_a_section_with_tests(rule: str) -> None:
    sections = rule_sections()
    assert rule in sections, f"docs/rules.md has no section `## {rule} ...`"
    refs = TEST_REF.findall(sections[rule])
    assert refs, f"docs/rules.md: {rule} names no test (`tests/<file>.py::<test>`)"


def test_every_test_named_in_the_rules_exists() -> None:
    refs = TEST_REF.findall(RULES.read_text())
    assert refs
    defined: dict[str, set[str]] = {}
    missing = []
    for file, name in refs:
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
            continue
        if file not in defined:
            defined[file] = module_names(path)
        if not name.startswith("test_") or name not in defined[file]:
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/rules.md names tests that do not exist: {missing}"


# ---- no contract outside the project ---------------------------------------------------------


def test_user_docs_never_point_outside_the_project() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in USER_DOCS
             for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "\n".join(found)


def help_texts(command: click.Command, parent: click.Context | None = None) -> Iterator[tuple[str, str]]:
    ctx = click.Context(command, info_name=command.name or "parley", parent=parent)
    yield ctx.command_path, command.get_help(ctx)
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            yield from help_texts(sub, ctx)


def test_cli_help_never_points_outside_the_project() -> None:
    texts = dict(help_texts(cli))
    assert len(texts) >= 10, sorted(texts)
    found = [f"{path}: {line.strip()}" for path, text in texts.items()
             for line in text.splitlines() if OUTSIDE.search(line)]
    assert not found, "\n".join(found)


def test_local_links_lead_to_files() -> None:
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken
