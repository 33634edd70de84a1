"""What the inbox's routes share, built once by `create_app` (parley/web/app.py) and kept on
`app.state.inbox`; an endpoint reaches it with `inbox_of(request)`."""

from dataclasses import dataclass

from redis.asyncio import Redis
from starlette.requests import Request
from starlette.templating import Jinja2Templates

from parley.aclient import AsyncClient
from parley.client.inbox import OpenInterrupt
from parley.schemas.keys import Keys
from parley.schemas.signing import Keyring
from parley.web.config import InboxConfig
from parley.web.files import Reloading
from parley.web.live import FeedHub
from parley.web.signins import SignIns
from parley.web.throttle import Throttle
from parley.web.users import Users


@dataclass
class Inbox:
    """What the routes share, built at start-up."""

    config: InboxConfig
    #: the shards' asyncio clients, in order (the health check pings each; the app closes them)
    shards: list[Redis]
    #: the deployment's key names (`keys` are the principals' signing keys)
    redis_keys: Keys
    client: AsyncClient
    users: Reloading[Users]
    keys: Reloading[Keyring]
    hub: FeedHub
    templates: Jinja2Templates
    signins: SignIns
    throttle: Throttle

    async def principal(self, request: Request) -> str | None:
        """The signed-in principal: None without a sign-in, or when its record is gone (signed
        out, expired), or the users file no longer has the credential it signed in with (a
        new password, a removal)."""
        principal, sid = request.session.get("principal"), request.session.get("sid")
        if not isinstance(principal, str) or not isinstance(sid, str):
            return None
        signin = await self.signins.find(sid)
        if signin is None or not signin.holds(principal, self.users.current().credentials):
            return None
        return principal

    def signing_key(self, principal: str) -> str | None:
        listed = self.keys.current().secrets_of(principal)
        return listed[0] if listed else None

    def may_answer(self, principal: str, row: OpenInterrupt) -> bool:
        """`resumable_by` allows the principal (null: anyone), and the page can sign as it."""
        return ((row.resumable_by is None or principal in row.resumable_by)
                and self.signing_key(principal) is not None)


def inbox_of(request: Request) -> Inbox:
    inbox: Inbox = request.app.state.inbox
    return inbox
