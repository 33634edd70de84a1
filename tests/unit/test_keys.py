"""The key layout (schemas/keys.py): which prefixes can work, and which streams are a
deployment's results streams."""

import pytest

from parley.schemas.keys import Keys


@pytest.mark.parametrize("prefix", ["parley", "acme:parley", "a.b_c-d:e:f", "x" * 64, "Tenant-7:prod.eu"])
def test_prefixes_that_work(prefix: str) -> None:
    keys = Keys(prefix)
    assert keys.inputs() == f"{prefix}:inputs" and keys.events("s") == f"{prefix}:{{s}}:events"


@pytest.mark.parametrize(("prefix", "why"), [
    ("", "empty"),
    ("acme parley", "whitespace breaks logs and commands"),
    ("acme:{tenant}", "a hash tag would put every key in one cluster slot"),
    ("acme:", "an empty name"),
    (":acme", "an empty name"),
    ("acme::parley", "an empty name"),
    ("acme*", "a glob character breaks ACL key patterns"),
    ("acme[1]", "a glob character breaks ACL key patterns"),
    ("acme\\x", "a glob character breaks ACL key patterns"),
    ("x" * 65, "too long"),
    ("acmé", "not ASCII"),
])
def test_prefixes_that_cannot_work_are_refused_with_the_rule(prefix: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"invalid key prefix .*letters, digits") as info:
        Keys(prefix)
    assert repr(prefix) in str(info.value), why


@pytest.mark.parametrize("prefix", ["parley", "acme:parley"])
def test_results_streams_of_a_prefix(prefix: str) -> None:
    keys = Keys(prefix)
    for stream in (keys.results(), keys.results(0, 4), keys.results(1023, 1024)):
        assert keys.is_results_stream(stream), stream
    for stream in (keys.events("s"), keys.inputs(), f"{prefix}:results:", f"{prefix}:results:x",
                   f"{prefix}:results:1:2", f"other:{prefix}:results", f"{prefix}:results:\u0661",
                   "acme:results" if prefix == "parley" else "parley:results", "", f"{prefix}:running"):
        assert not keys.is_results_stream(stream), stream


def test_a_sub_agents_parent_link_may_name_the_results_stream_of_a_prefix_with_colons() -> None:
    from parley.schemas.inputs import ParentLink

    link = {"session": "s-1", "call_id": "call-1", "attempt": 1, "app": "tests.apps.agents:researcher"}
    for stream in (Keys("acme:parley").results(), Keys("acme:parley").results(3, 4), "parley:results"):
        assert ParentLink.model_validate({**link, "reply_to": stream}).reply_to == stream
    for stream in ("acme:parley:{s-1}:events", "acme::results", "acme:parley:results:x"):
        with pytest.raises(ValueError, match="reply_to"):
            ParentLink.model_validate({**link, "reply_to": stream})
