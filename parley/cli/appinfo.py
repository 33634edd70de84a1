"""What the dispatcher is told of an app: its shape (decide_on, tool kinds), never its code."""

from parley.dispatcher.core import AppInfo, ToolInfo
from parley.workers.app import App


def app_info(app: App) -> AppInfo:
    return AppInfo(
        has_decide=app.decide is not None,
        decide_on=app.decide_on,
        tools={name: ToolInfo(deferred=bool(getattr(fn, "deferred", False)),
                              idempotent=bool(getattr(fn, "idempotent", False)),
                              agent=getattr(fn, "agent", None),
                              timeout_s=getattr(fn, "timeout_s", None))
               for name, fn in app.tools.items()},
    )
