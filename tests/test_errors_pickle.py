"""LightPipe's errors survive pickling (a sweep worker's error must reach the parent)."""

from __future__ import annotations

import pickle

from testbed.errors import InputError, RuntimeFailure, SpecError
from testbed.schedule.model import ScheduleError


def test_errors_round_trip_through_pickle() -> None:
    for err in (
        InputError("jobs[0].slots", "must be an integer", source="spec.yaml"),
        SpecError("name", "too long"),
        ScheduleError("deadlock at F3", path="schedule[2]"),
        RuntimeFailure("ovs-vswitchd died"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert back.exit_code == err.exit_code
        if isinstance(err, InputError):
            assert (back.path, back.message, back.source) == (err.path, err.message, err.source)
            assert back.line() == err.line()
