"""What the app's code raised, as the outcome carries it: the app's frames, never Parley's."""

from parley.workers import app_errors
from parley.workers.jobs import _run  # noqa: F401 - the job runner whose frames are left out


def _apps_helper() -> None:
    raise KeyError("amount")


def _apps_decide() -> None:
    _apps_helper()


def test_an_exception_is_described_by_its_type_message_and_the_apps_frames() -> None:
    try:
        _apps_decide()
    except KeyError as exc:
        failure = app_errors.describe(exc)
    assert (failure.type, failure.message) == ("KeyError", "'amount'")
    assert [f.split(" in ")[1] for f in failure.frames] == [
        "test_an_exception_is_described_by_its_type_message_and_the_apps_frames",
        "_apps_decide", "_apps_helper"]
    assert failure.frames[-1].startswith("tests/unit/test_app_errors.py:8 ")
    assert app_errors.one_line(failure) == f"KeyError: 'amount' (at {failure.frames[-1]})"


def test_parleys_own_frames_are_left_out_and_long_ones_cut() -> None:
    from parley.schemas.actions import decision_from_app

    try:
        decision_from_app("x" * 2000)
    except ValueError as exc:
        failure = app_errors.describe(exc)
    assert all("schemas/actions.py" not in f for f in failure.frames)
    assert len(failure.frames) == 1 and "test_parleys_own_frames" in failure.frames[0]
    long = app_errors.describe(ValueError("y" * 2000))
    assert len(long.message) == app_errors.MAX_MESSAGE and long.message.endswith("...")
