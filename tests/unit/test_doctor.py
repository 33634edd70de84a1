"""parley/fleet/doctor.py: what `parley doctor` concludes from what a Redis says of itself."""

from parley.fleet.doctor import (
    SAFE_DEFAULT_USER,
    DefaultUser,
    Level,
    ServerFacts,
    default_user_finding,
    examine,
    failed,
    replays_every_transaction,
)

WHOLE = DefaultUser("+@all", "~*", "&*")


def test_a_default_user_with_every_right_replays_every_transaction() -> None:
    assert replays_every_transaction(WHOLE)
    assert default_user_finding(WHOLE).level is Level.OK


def test_the_default_user_the_acl_file_shipped_before_loses_transactions() -> None:
    old = DefaultUser("-@all", "", "")
    assert not replays_every_transaction(old)
    finding = default_user_finding(old)
    assert finding.level is Level.FAIL and SAFE_DEFAULT_USER in finding.text


def test_any_right_taken_away_is_a_failure() -> None:
    for user in (DefaultUser("+@all -debug", "~*", "&*"), DefaultUser("+@all", "~parley:*", "&*"),
                 DefaultUser("+@all", "~*", ""), DefaultUser("+@read +@write", "~*", "&*")):
        assert not replays_every_transaction(user), user


def test_from_reply_reads_redis_py_s_split_of_the_rules() -> None:
    reply = {"flags": ["off"], "commands": ["-debug"], "categories": ["+@all"], "keys": ["~*"],
             "channels": ["&*"]}
    assert DefaultUser.from_reply(reply) == DefaultUser("+@all -debug", "~*", "&*")
    assert DefaultUser.from_reply({"categories": ["+@all"], "commands": [], "keys": ["~*"],
                                   "channels": ["&*"]}) == WHOLE


def test_what_the_login_may_not_read_is_unknown_never_ok() -> None:
    findings = examine(ServerFacts(name="r"))
    assert {f.level for f in findings} == {Level.UNKNOWN}
    assert not failed(findings)


def test_persistence_and_eviction_rules() -> None:
    def levels(**facts: str) -> dict[str, Level]:
        return {f.check: f.level for f in examine(ServerFacts(name="r", default_user=WHOLE, **facts))}

    assert levels(appendonly="yes", appendfsync="always", maxmemory_policy="noeviction") == {
        "default user": Level.OK, "appendonly": Level.OK, "appendfsync": Level.OK,
        "maxmemory-policy": Level.OK}
    assert levels(appendonly="yes", appendfsync="everysec")["appendfsync"] is Level.WARN
    assert levels(appendonly="yes", appendfsync="no")["appendfsync"] is Level.FAIL
    assert levels(appendonly="no")["appendonly"] is Level.FAIL
    assert levels(maxmemory_policy="allkeys-lru")["maxmemory-policy"] is Level.FAIL


def test_a_cluster_node_fails_first() -> None:
    findings = examine(ServerFacts(name="r", cluster_enabled=True, default_user=WHOLE))
    assert findings[0].check == "cluster" and findings[0].level is Level.FAIL and failed(findings)
