"""What a `parley` command loads before it runs: each command's module when it is named, and no
heavy package a command does not use (every process of a fleet, and every CLI call, pays for
what is imported at start)."""

import subprocess
import sys

import click
import pytest

from parley.cli.main import COMMANDS, cli

#: loaded by some commands only: the client's runners and readers (send, show...), the typed
#: answers' validator (a dispatcher's first typed question), the model adapter's HTTP client,
#: RQ and the metrics (dispatcher, worker), the web page (inbox)
NOT_AT_IMPORT = ("parley.client.sync", "parley.client.inbox", "jsonschema", "httpx", "rq",
                 "prometheus_client", "starlette", "parley.dispatcher.core", "parley.cli.processes")


def loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_importing_the_cli_loads_no_command_and_no_heavy_package() -> None:
    loaded = loaded_after("import parley.cli")
    assert [m for m in NOT_AT_IMPORT if m in loaded] == []


def test_a_dispatcher_does_not_load_the_clients_readers_nor_the_adapters_http_client() -> None:
    loaded = loaded_after("from parley.cli.main import cli\nimport click\n"
                          "cli.get_command(click.Context(cli), 'dispatcher')")
    assert "parley.cli.processes" in loaded  # the command itself, loaded by its name
    assert [m for m in ("parley.client.inbox", "httpx", "jsonschema", "starlette") if m in loaded] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_loads_under_its_name(name: str) -> None:
    with click.Context(cli) as ctx:
        command = cli.get_command(ctx, name)
    assert isinstance(command, click.Command) and command.name == name


def test_an_unknown_command_is_none_and_the_list_is_the_table() -> None:
    with click.Context(cli) as ctx:
        assert cli.get_command(ctx, "dispatch") is None
        assert cli.list_commands(ctx) == sorted(COMMANDS)
