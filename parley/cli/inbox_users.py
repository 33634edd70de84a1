"""`parley inbox-user FILE PRINCIPAL`: add or replace a person in the inbox's users file
(parley/web/users.py, docs/inbox.md "Who may sign in").

The file is rewritten whole, atomically (a temporary file beside it, then os.replace), so the
inbox never reads half a file, and a file that fails to parse is never overwritten: the other
people in it would be lost. It is written mode 0600: it holds no secret in the clear, but the
hashes are nobody else's business.
"""

import os
import secrets
import sys
import tempfile
from pathlib import Path

import click

from parley.web.users import Users, UsersFileError, check_principal, hash_password, token_credential

#: the shortest password accepted
MIN_PASSWORD = 8


def _read_users(path: Path) -> tuple[Users | None, os.stat_result | None]:
    """The users the file holds now (None: no file yet, or an empty one) and its stat."""
    try:
        text = path.read_bytes()
        stat = path.stat()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror or exc}") from None
    if not text.strip():  # e.g. made beforehand with `install -m 600 /dev/null FILE`
        return None, stat
    try:
        return Users.parse(text, str(path)), stat
    except UsersFileError as exc:
        raise click.ClickException(f"{exc}; fix or remove it first (nothing was changed)") from None


def _write_atomically(path: Path, data: bytes, previous: os.stat_result | None) -> None:
    """`data` as the file at `path`, mode 0600, replacing it in one step; the previous file's
    owner is kept (root adding a user must not leave the inbox's own user unable to read it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o600)
            if previous is not None and (previous.st_uid, previous.st_gid) != (os.getuid(), os.getgid()):
                try:
                    os.fchown(out.fileno(), previous.st_uid, previous.st_gid)
                except PermissionError:
                    click.echo(f"warning: {path} was owned by uid {previous.st_uid}, gid "
                               f"{previous.st_gid}; it is now yours", err=True)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _password_from(stdin: bool) -> str:
    if stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True,
                                default="", show_default=False)
    if not password:
        raise click.ClickException("the password is empty (nothing was changed)")
    if len(password) < MIN_PASSWORD:
        raise click.ClickException(f"the password is shorter than {MIN_PASSWORD} characters "
                                   "(nothing was changed)")
    return password


@click.command("inbox-user")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("principal")
@click.option("--token", is_flag=True,
              help="Give the principal a new random token instead of a password: it is printed "
                   "once, and only its SHA-256 is stored.")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from one line of standard input instead of prompting.")
def inbox_user(file: str, principal: str, token: bool, password_stdin: bool) -> None:
    """Add PRINCIPAL to the inbox's users FILE, or replace its entry (FILE is created when
    missing). Prompts for the password twice, or with --token prints a new token.

    PRINCIPAL is the name the page signs resumes as: the same as in the dispatchers' keys file.
    """
    if token and password_stdin:
        raise click.UsageError("--token and --password-stdin exclude each other: a token is "
                               "generated, not read")
    try:  # before asking for a password that could not be used
        check_principal(principal)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="PRINCIPAL") from None
    # Through a symbolic link, the file it names is rewritten, and the link kept.
    path = Path(os.path.realpath(file))
    users, stat = _read_users(path)
    if token:
        secret = secrets.token_urlsafe(32)
        credential = token_credential(secret)
    else:
        credential = hash_password(_password_from(password_stdin))
    known = users.credentials if users is not None else {}
    updated = Users(dict(known)).with_credential(principal, credential)
    try:
        _write_atomically(path, updated.to_json(), stat)
    except OSError as exc:
        raise click.ClickException(f"cannot write {file}: {exc.strerror or exc}") from None
    verb = "replaced" if principal in known else "added"
    what = "a token" if token else "a password"
    click.echo(f"{principal}: {verb} with {what} in {file}", err=True)
    if token:
        # stdout holds the token alone, so a script can capture it; it is never shown again
        click.echo(secret)
        click.echo("Store the token now: it is not kept and cannot be shown again.", err=True)

