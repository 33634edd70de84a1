"""The face of Parley: the `parley` command, the demo, and the processes they start."""

from parley.cli.main import cli, main

__all__ = ["cli", "main"]
