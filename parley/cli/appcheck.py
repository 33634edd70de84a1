"""`parley app check`: load an app without Redis and list every problem it has."""

import click


@click.group("app")
def app() -> None:
    """Look at an app without running it."""


@app.command("check")
@click.option("--app", "spec", envvar="PARLEY_APP", required=True, help="The app, module[:attr].")
def check(spec: str) -> None:
    """Load the app as a worker and a dispatcher would and print every problem found, one per
    line (`error:` stops a process from starting, `warning:` would show later). Exits 1 on any
    error, 0 otherwise. Needs no Redis."""
    from parley.cli.app_problems import check_app, summary

    found = check_app(spec)
    for problem in found.problems:
        click.echo(problem.line(), err=problem.level == "error")
    if not found.ok:
        errors = sum(p.level == "error" for p in found.problems)
        raise click.ClickException(f"{errors} error(s) in app {spec!r}")
    assert found.app is not None
    for line in summary(found.app):
        click.echo(line)
