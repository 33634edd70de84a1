"""`parley agui`: serve Parley sessions to AG-UI front ends (docs/agui.md)."""

import ipaddress

import click


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("agui")
@click.option("--port", type=click.IntRange(1, 65535), default=8090, show_default=True,
              help="The port to serve on.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on (0.0.0.0 in a container; then --token is required).")
@click.option("--token", envvar="PARLEY_AGUI_TOKEN", default=None,
              help="The bearer token every run must carry (env PARLEY_AGUI_TOKEN; prefer the "
                   "environment to argv). Required unless serving on loopback.")
@click.option("--settle", type=click.FloatRange(0.01, 10), default=0.2, show_default=True,
              help="Seconds the session must stay quiet, with an interrupt open, for a run to end "
                   "with an interrupt outcome.")
@click.option("--run-timeout", type=click.FloatRange(1, 3600), default=300, show_default=True,
              help="Seconds after which a run that nothing ended stops (RUN_ERROR run_timeout); the "
                   "session goes on.")
@click.pass_context
def agui(ctx: click.Context, port: int, host: str, token: str | None, settle: float,
         run_timeout: float) -> None:
    """Serve the AG-UI endpoint: POST a run input to http://HOST:PORT/ and read the run's AG-UI
    events (server-sent events). A thread is a session; resumes are signed with --principal /
    --signing-key (docs/agui.md)."""
    try:
        from parley.agui.endpoint import AguiConfig, create_app
    except ImportError as exc:  # the extra is not installed
        raise click.ClickException(f"the AG-UI endpoint needs the `agui` extra: pip install 'parley[agui]' "
                                   f"({exc})") from None
    import uvicorn

    from parley.client import AsyncClient
    from parley.client.shards import connect_async, connect_checked
    from parley.schemas.keyprints import AGUI
    from parley.schemas.keys import Keys
    from parley.web.keycheck import check_keys
    from parley.web.serve import StoppingServer

    obj = ctx.find_root().obj
    if token is None and not is_loopback(host):
        raise click.UsageError(f"--host {host} serves beyond this machine: give a --token (or "
                               "PARLEY_AGUI_TOKEN) that every run must carry")
    if len(obj["urls"]) > 1 and obj["producer"] is None:
        raise click.UsageError("a deployment of several shards takes inputs through the submit "
                               "function: name the producer (--producer or PARLEY_PRODUCER)")
    shards = []
    for url in obj["urls"]:  # every shard reachable at start: a wrong address is exit 69 now
        obj["url"] = url
        shards.append(connect_checked(url, socket_connect_timeout=5))
        shards[-1].ping()
    obj["url"] = obj["urls"][0]
    # do the dispatchers have the key resumes are signed with? (as the inbox checks its own)
    check_keys(shards, Keys(obj["prefix"]), {obj["principal"]: (obj["key"],)} if obj["principal"] else {},
               AGUI)
    client = AsyncClient([connect_async(url) for url in obj["urls"]], obj["prefix"], obj["producer"])
    config = AguiConfig(principal=obj["principal"], signing_key=obj["key"], token=token, settle_s=settle,
                        run_timeout_s=run_timeout)
    signer = f"signed as {obj['principal']!r}" if obj["principal"] else "unsigned"
    click.echo(f"parley agui: serving on http://{host}:{port}/ (resumes {signer})", err=True)
    server = StoppingServer(uvicorn.Config(create_app(client, config), host=host, port=port,
                                           log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5))
    server.run()
    if not server.started:
        raise click.ClickException(f"could not serve on {host}:{port} (see the error above)")
