"""The list page's query string, read and written (pure): its filters, order and cursor."""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from urllib.parse import urlencode

from parley.client.inbox import InterruptFilter

#: a filter's text at most (a reason is 1-256 characters; a session id at most 256)
MAX_FILTER = 256


class Order(StrEnum):
    OLDEST = "oldest"
    NEWEST = "newest"


class QueryError(ValueError):
    """A query string the list cannot use; the message says which parameter and why."""


@dataclass(frozen=True)
class ListQuery:
    order: Order = Order.OLDEST
    reason: str | None = None
    session_prefix: str | None = None
    #: only interrupts the signed-in person may answer
    mine: bool = False
    cursor: str | None = None
    #: words to find in the reason, the session id or the payload (InterruptFilter.text)
    search: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> "ListQuery":
        order = params.get("order") or Order.OLDEST.value
        if order not in Order.__members__.values():
            raise QueryError(f"order must be oldest or newest, not {order[:40]!r}")
        reason = params.get("reason") or None
        prefix = params.get("session") or None
        search = (params.get("q") or "").strip() or None
        for name, value in (("reason", reason), ("session", prefix), ("q", search)):
            if value is not None and len(value) > MAX_FILTER:
                raise QueryError(f"{name} is at most {MAX_FILTER} characters")
        return cls(Order(order), reason, prefix, params.get("mine") in ("1", "on", "true"),
                   params.get("cursor") or None, search)

    @property
    def filtered(self) -> bool:
        """Some filter leaves questions out (the list says "match these filters")."""
        return bool(self.reason or self.session_prefix or self.mine or self.search)

    def interrupt_filter(self, principal: str) -> InterruptFilter:
        return InterruptFilter(reason=self.reason, session_prefix=self.session_prefix,
                               principal=principal if self.mine else None,
                               newest_first=self.order is Order.NEWEST, text=self.search)

    def query_string(self, cursor: str | None = None) -> str:
        """This query (without its cursor, or with `cursor`) as a query string, `?` included
        when not empty."""
        params = {k: v for k, v in self.fields(replace(self, cursor=cursor)).items() if v}
        return "?" + urlencode(params) if params else ""

    @staticmethod
    def fields(q: "ListQuery") -> dict[str, str]:
        return {"order": "" if q.order is Order.OLDEST else q.order.value, "q": q.search or "",
                "reason": q.reason or "", "session": q.session_prefix or "", "mine": "1" if q.mine else "",
                "cursor": q.cursor or ""}
