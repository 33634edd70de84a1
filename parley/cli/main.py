"""The `parley` command: its group, the options every command shares, and how what reaches the
top becomes one line and an exit code (docs/operations.md, "Exit codes").

The commands live by kind: long-running processes (`processes.py`: dispatcher, worker,
notify), inputs to a session (`inputs.py`: send, resume, close, switch, input), reads
(`reads.py`: show, watch, interrupts, sessions, export), and one module each for `demo`,
`doctor`, `agui`, `inbox`, `inbox-user`, `partitions` and `producers`. `main()` is the console script.
"""

from importlib import import_module
from typing import Any

import click
import redis

from parley.client.producer import InvalidInput, SubmitRefused, SubmitUnavailable
from parley.runtime import logs
from parley.runtime.redis_errors import cluster_message, is_cluster_reply
from parley.schemas.shards import PlacementError

DEFAULT_URL = "redis://localhost:6379/0"


def _valid_prefix(_ctx: click.Context, _param: click.Parameter, prefix: str) -> str:
    """Every process checks the prefix as it starts, before it connects: a prefix that cannot
    work (schemas/keys.py) would otherwise show up only as jobs failing later."""
    from parley.schemas.keys import check_prefix

    try:
        return check_prefix(prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _valid_producer(_ctx: click.Context, _param: click.Parameter, name: str | None) -> str | None:
    from parley.client.producer import check_producer

    try:
        return None if name is None else check_producer(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


#: exit code of any command that cannot use Redis (down, a wrong address, a refused password);
#: sysexits.h's EX_UNAVAILABLE, apart from click's 1 (an error) and 2 (a usage error)
REDIS_UNAVAILABLE = 69
#: exit code of send/resume/close/switch/input when the submit function refuses the input
#: (`too_large`, `rate_limited`, `session_full`, `wrong_tenant`, `invalid_input`): nothing was written
SUBMIT_REFUSED = 7
#: exit code when Redis holds no submit function yet: sysexits.h's EX_TEMPFAIL, try again soon
SUBMIT_UNAVAILABLE = 75
#: exit code when a Redis URL names a Redis Cluster node, not supported: sysexits.h's EX_CONFIG
REDIS_CLUSTER = 78
#: exit code when the Redis login may not run a command the CLI needs: sysexits.h's EX_NOPERM
NO_PERMISSION = 77
# Errors that say "this Redis cannot be used", not "this command went wrong": an
# AuthenticationError is a ConnectionError; the wrong-number-of-args kind is a Redis before 6
# given a user name.
REDIS_UNUSABLE = (redis.ConnectionError, redis.TimeoutError,
                  redis.exceptions.AuthenticationWrongNumberOfArgsError)


def masked_url(url: str) -> str:
    """`url` as it may be shown: its password (in the address or a `password=` query) as ***."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)],
                          safe="*")
        # by hand: urlunsplit drops the `//` of `unix:///path` (an empty host)
        return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    except ValueError:  # not a URL redis-py reads either: show nothing of it
        return "<an invalid URL>"


#: each command's name -> the module and attribute that define it. A command's module is
#: imported when the command runs (or `--help` lists it): `parley send` does not load the
#: dispatcher or the web page, and a dispatcher's start does not load the client's readers.
COMMANDS = {
    "dispatcher": "parley.cli.processes:dispatcher", "worker": "parley.cli.processes:worker",
    "notify": "parley.cli.processes:notify",
    "send": "parley.cli.inputs:send", "resume": "parley.cli.inputs:resume",
    "close": "parley.cli.inputs:close", "switch": "parley.cli.inputs:switch",
    "input": "parley.cli.inputs:input_",
    "show": "parley.cli.reads:show", "export": "parley.cli.reads:export_",
    "watch": "parley.cli.reads:watch", "interrupts": "parley.cli.reads:interrupts",
    "sessions": "parley.cli.reads:sessions",
    "demo": "parley.cli.demo:demo", "doctor": "parley.cli.doctor:doctor",
    "app": "parley.cli.appcheck:app",
    "producers": "parley.cli.producers:producers", "partitions": "parley.cli.partitions:partitions",
    "agui": "parley.cli.agui:agui",
    "inbox": "parley.cli.inbox:inbox", "inbox-user": "parley.cli.inbox_users:inbox_user",
}


class ParleyGroup(click.Group):
    """The `parley` group: a Redis any command cannot use is one line and `REDIS_UNAVAILABLE`,
    not a traceback (those are for bugs). Outages a running dispatcher or worker meets are
    waited out by their own loops; this catches what reaches the top, e.g. at start.

    Its commands are loaded by name, when used (`COMMANDS`; click's "lazily loading
    subcommands")."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            command = getattr(import_module(module), attr)
            assert isinstance(command, click.Command) and command.name == cmd_name, COMMANDS[cmd_name]
            self.add_command(command)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        from parley.client.shards import ClusterNotSupported

        try:
            return super().invoke(ctx)
        except ClusterNotSupported as exc:  # found at connect (INFO cluster)
            click.echo(cluster_message([masked_url(exc.url)]), err=True)
            raise click.exceptions.Exit(REDIS_CLUSTER) from None
        except REDIS_UNUSABLE as exc:
            url = ctx.obj["url"] if isinstance(ctx.obj, dict) else "?"
            click.echo(f"parley: cannot use Redis at {masked_url(url)}: {exc}", err=True)
            raise click.exceptions.Exit(REDIS_UNAVAILABLE) from None
        except InvalidInput as exc:  # the client checks an input before sending: nothing was sent
            raise click.ClickException(str(exc)) from None
        except SubmitRefused as exc:
            click.echo(f"parley: refused {exc.code}: {exc.message}", err=True)
            raise click.exceptions.Exit(SUBMIT_REFUSED) from None
        except SubmitUnavailable as exc:
            click.echo(f"parley: {exc}", err=True)
            raise click.exceptions.Exit(SUBMIT_UNAVAILABLE) from None
        except PlacementError as exc:  # the shards disagree, or hold no placement yet
            raise click.ClickException(f"placement: {exc}") from None
        except redis.exceptions.NoPermissionError as exc:  # the login's ACL refused a command
            url = ctx.obj["url"] if isinstance(ctx.obj, dict) else "?"
            click.echo(f"parley: the Redis login of {masked_url(url)} may not do this: {exc}", err=True)
            raise click.exceptions.Exit(NO_PERMISSION) from None
        except redis.ResponseError as exc:  # last: some of the above are ResponseErrors
            if not is_cluster_reply(exc):  # found by a login that may not run INFO
                raise
            urls = ctx.obj["urls"] if isinstance(ctx.obj, dict) else ["?"]
            click.echo(cluster_message([masked_url(u) for u in urls]), err=True)
            raise click.exceptions.Exit(REDIS_CLUSTER) from None


@click.group(cls=ParleyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True,
              help="Say which Redis (password masked) and key prefix the command uses, on stderr.")
@click.option("--redis-url", "redis_urls", multiple=True, envvar=["PARLEY_REDIS_URLS", "PARLEY_REDIS_URL"],
              default=[DEFAULT_URL], show_default=True,
              help="Redis to use; credentials go in the URL. Repeat it, in order, for a deployment "
                   "of several shards (env PARLEY_REDIS_URLS, URLs separated by spaces; or "
                   "PARLEY_REDIS_URL). A redis+sentinel://host:port[,host:port]/service[/db] URL "
                   "follows a Sentinel-managed primary.")
@click.option("--prefix", envvar="PARLEY_PREFIX", default="parley", show_default=True,
              callback=_valid_prefix,
              help="Key prefix of every Parley key (env PARLEY_PREFIX): names of letters, digits, "
                   "'.', '_', '-' joined by single colons, e.g. acme:parley.")
@click.option("--log-level", envvar="PARLEY_LOG_LEVEL", default="INFO", show_default=True)
@click.option("--principal", envvar="PARLEY_PRINCIPAL", default=None,
              help="Sign inputs sent by send/resume/close/switch/input as this principal "
                   "(env PARLEY_PRINCIPAL).")
@click.option("--signing-key", envvar="PARLEY_SIGNING_KEY", default=None,
              help="The principal's secret (env PARLEY_SIGNING_KEY; prefer the environment to argv).")
@click.option("--producer", envvar="PARLEY_PRODUCER", default=None, callback=_valid_producer,
              help="Submit inputs (send/resume/close/switch/input) as this registered producer, "
                   "through the submit function (env PARLEY_PRODUCER); needed where users.acl is "
                   "loaded. Default: write parley:inputs directly (development).")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, redis_urls: tuple[str, ...], prefix: str, log_level: str,
        principal: str | None, signing_key: str | None, producer: str | None) -> None:
    """Parley: agent sessions on RQ worker fleets, with durable interrupts.

    Inputs, events and codes: docs/protocol.md. Interrupt rules: docs/rules.md.
    """
    logs.setup(log_level)
    if (principal is None) != (signing_key is None):
        raise click.UsageError("--principal and --signing-key go together")
    urls = list(redis_urls) or [DEFAULT_URL]
    ctx.obj = {"url": urls[0], "urls": urls, "prefix": prefix, "principal": principal, "key": signing_key,
               "producer": producer}
    if verbose:
        shown = ", ".join(masked_url(u) for u in urls)
        click.echo(f"parley: redis {shown}, prefix {prefix}", err=True)


def main() -> None:
    cli(auto_envvar_prefix=None)
