"""The person's side of an interrupt on real processes: the seed app through a budget stop,
a typed question refused then answered, and `parley resume --wait` for each outcome."""


import pytest
import redis

from parley.client import Client
from parley.schemas.resumes import ResumeStatus
from tests.conftest import Procs, of_type, send, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e

SEED = "Email bob@example.com: the launch moved to Friday."


def resume_cli(procs: Procs, session: str, iid: str, payload: str, *extra: str) -> tuple[int, str]:
    out = run_parley(["--redis-url", procs.url, "resume", "--wait",
                          *extra, session, iid, payload], text=True, timeout=60)
    return out.returncode, out.stdout.strip()


def asking(procs: Procs, r: redis.Redis, client: Client, app: str, session: str) -> None:
    """A dispatcher and a worker of `app`, and `session` asking its seed question."""
    procs.dispatcher(app)
    procs.worker(app)
    send(r, session, {"type": "message.create", "content": SEED})
    wait_for(client, session, lambda e: e["type"] == "interrupt.raised")


def test_seed_app_survives_a_budget_stop_and_a_resume_with_a_higher_limit(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    send(r, "b", {"type": "session.create", "budget": {"llm_calls": 1}})
    send(r, "b", {"type": "message.create", "content": SEED})
    wait_for(client, "b", lambda e: e["type"] == "interrupt.raised")
    assert client.resume("b", "int-1", {"approved": True}, wait=True).status is ResumeStatus.DELIVERED
    # the reply after the tool result would be a second model call: the budget stops it
    stop = wait_for(client, "b", lambda e: e["type"] == "interrupt.raised" and e["reason"] == "budget")[-1]
    assert "anchor" not in stop and stop["payload"]["exceeded"] == "llm_calls"  # global
    outcome = client.resume("b", stop["interrupt_id"], {"budget": {"llm_calls": 5}}, wait=True)
    assert outcome.status is ResumeStatus.DELIVERED
    assert outcome.event is not None and outcome.event["reason"] == "budget"
    events = wait_for(client, "b", lambda e: e["type"] == "turn.completed")
    assert of_type(events, "decision.failed") == []
    assert of_type(events, "message.created")[-1]["message"]["content"] == "Done. send_email: sent"


def test_a_typed_question_refuses_a_wrong_answer_then_takes_a_right_one(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    asking(procs, r, client, "tests.apps.typed_seed", "t")
    code, out = resume_cli(procs, "t", "int-1", '{"approved": "yes"}')
    assert code == 4 and out.startswith("refused invalid_resume")
    assert "'yes' is not of type 'boolean'" in out and "(at $.approved)" in out
    view = client.show("t")
    assert view is not None and view["parked"] is True  # still open
    code, out = resume_cli(procs, "t", "int-1", '{"approved": true}')
    assert code == 0 and out.startswith("delivered")
    events = wait_for(client, "t", lambda e: e["type"] == "turn.completed")
    assert of_type(events, "message.created")[-1]["message"]["content"] == "Done. send_email: sent"
    code, out = resume_cli(procs, "t", "int-1", '{"approved": true}')
    assert (code, out.split(" (")[0]) == (5, "ignored already_resumed")


def test_resume_wait_says_not_delivered_when_the_branch_is_not_active(
        procs: Procs, r: redis.Redis, client: Client) -> None:
    asking(procs, r, client, "examples.seed_app", "n")
    send(r, "n", {"type": "message.create", "content": "never mind", "parent_id": None})  # an edit
    wait_for(client, "n", lambda e: e["type"] == "turn.completed")
    code, out = resume_cli(procs, "n", "int-1", '{"approved": true}')
    assert code == 3 and out.startswith("not delivered") and "branch.switch" in out


def test_resume_wait_times_out_without_a_dispatcher(procs: Procs, client: Client) -> None:
    code, out = resume_cli(procs, "x", "int-1", "{}", "--timeout", "0.3")
    assert code == 6 and out.startswith("timeout")
