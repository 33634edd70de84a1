"""`parley inbox`: serve the approvers' web page (docs/inbox.md)."""

import click

from parley.web.config import DEFAULT_PAGE_SIZE


@click.command("inbox")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True,
              help="The port to serve on.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on (0.0.0.0 in a container).")
@click.option("--users-file", envvar="PARLEY_INBOX_USERS", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="Who may sign in (env PARLEY_INBOX_USERS): written by `parley inbox-user`; read "
                   "again when it changes.")
@click.option("--keys-file", envvar="PARLEY_KEYS_FILE", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="The principals' signing keys, the dispatchers' keys file (env PARLEY_KEYS_FILE): "
                   "each answer is signed with the signed-in principal's key; read again when it "
                   "changes.")
@click.option("--session-secret", envvar="PARLEY_INBOX_SECRET", default=None,
              help="Signs the sign-in cookie (env PARLEY_INBOX_SECRET); replicas behind one address "
                   "must share it. Default: random per process (a restart signs everyone out).")
@click.option("--session-hours", type=click.FloatRange(0.05, 24 * 30), default=12, show_default=True,
              help="How long a sign-in lasts.")
@click.option("--secure-cookies/--no-secure-cookies", default=None, envvar="PARLEY_INBOX_SECURE_COOKIES",
              help="Send the sign-in cookie over HTTPS only (env PARLEY_INBOX_SECURE_COOKIES). "
                   "Default: on, unless --host is a loopback address (plain HTTP on this machine).")
@click.option("--page-size", type=click.IntRange(1, 1000), default=DEFAULT_PAGE_SIZE, show_default=True,
              help="Rows per page of the list.")
@click.option("--resume-timeout", type=click.FloatRange(0.5, 120), default=10, show_default=True,
              help="Seconds an answer waits for the engine to say what became of it.")
@click.pass_context
def inbox(ctx: click.Context, port: int, host: str, users_file: str, keys_file: str,
          session_secret: str | None, session_hours: float, secure_cookies: bool | None, page_size: int,
          resume_timeout: float) -> None:
    """Serve the inbox: a web page where people sign in, see the open interrupts across every
    session and shard live, and answer them (docs/inbox.md)."""
    import uvicorn

    from parley.client.shards import connect_checked
    from parley.schemas.keys import Keys
    from parley.schemas.signing import Keyring, KeysFileError
    from parley.web.app import create_app
    from parley.web.config import InboxConfig, secure_cookies_for
    from parley.web.keycheck import check_keys
    from parley.web.serve import StoppingServer
    from parley.web.users import UsersFileError

    obj = ctx.find_root().obj
    if len(obj["urls"]) > 1 and obj["producer"] is None:
        raise click.UsageError("a deployment of several shards takes answers through the submit "
                               "function: name the producer (--producer or PARLEY_PRODUCER)")
    # every shard reachable at start (as for the other commands: a wrong address or password is
    # one line and exit 69, not a page that fails later); an outage after start is a 503 page
    shards = []
    for url in obj["urls"]:
        obj["url"] = url  # the one named if it cannot be used
        shards.append(connect_checked(url, socket_connect_timeout=5))
        shards[-1].ping()  # and not a Redis Cluster node
    obj["url"] = obj["urls"][0]
    config = InboxConfig(redis_urls=tuple(obj["urls"]), users_file=users_file, keys_file=keys_file,
                         prefix=obj["prefix"], producer=obj["producer"], session_secret=session_secret,
                         session_max_age_s=int(session_hours * 3600),
                         secure_cookies=secure_cookies_for(host, secure_cookies),
                         page_size=page_size, resume_timeout_s=resume_timeout)
    try:
        app = create_app(config)
        signs_with = Keyring.load(keys_file).keys
    except (UsersFileError, KeysFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    # do the dispatchers have our keys? one WARNING line per problem; the page starts anyway
    check_keys(shards, Keys(obj["prefix"]), signs_with)
    if session_secret is None:
        click.echo("parley inbox: no --session-secret: sign-ins last until this process stops", err=True)
    if config.secure_cookies:
        click.echo("parley inbox: the sign-in cookie is Secure: serve the page over HTTPS (TLS in "
                   "front of it), or pass --no-secure-cookies on a network you trust", err=True)
    else:
        click.echo("parley inbox: the sign-in cookie is Secure only on requests that came over HTTPS "
                   "(a TLS proxy's X-Forwarded-Proto): plain HTTP is for this machine only", err=True)
    click.echo(f"parley inbox: serving on http://{host}:{port}/", err=True)
    # Open event streams never end by themselves: a stop gives them 5 s, then closes them.
    server = StoppingServer(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                           proxy_headers=True, timeout_graceful_shutdown=5))
    server.run()
    if not server.started:
        raise click.ClickException(f"could not serve on {host}:{port} (see the error above)")
