"""tests/waiting.py: wait_until returns the predicate's value, names what it waited for, and
scales its deadline by LIGHTPIPE_TEST_TIME_SCALE, else by the machine's measured slowness."""

from __future__ import annotations

import pytest

from tests.waiting import SCALE_ENV, scaled, wait_until


def test_returns_the_first_truthy_value() -> None:
    calls = iter([None, 0, [], "ready"])
    assert wait_until(lambda: next(calls), "the fourth answer", interval_s=0) == "ready"


def test_times_out_naming_what_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCALE_ENV, "0.001")
    with pytest.raises(pytest.fail.Exception, match="waiting for the door to open"):
        wait_until(lambda: False, "the door to open", timeout_s=1, interval_s=0)


def test_alive_stops_the_wait_with_its_reason() -> None:
    seen: list[int] = []

    def alive() -> str | None:
        seen.append(1)
        return "the server exited (rc 3)" if len(seen) >= 2 else None

    with pytest.raises(pytest.fail.Exception, match=r"server exited \(rc 3\)"):
        wait_until(lambda: False, "the server", timeout_s=3600, interval_s=0, alive=alive)
    assert len(seen) == 2


def test_scale_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed import envprobe

    monkeypatch.delenv(SCALE_ENV, raising=False)
    monkeypatch.setattr(envprobe, "machine_slowness", lambda: 1.7)
    assert scaled(30) == pytest.approx(51)  # a machine 1.7x slower than the reference
    monkeypatch.setattr(envprobe, "machine_slowness", lambda: 0.5)
    assert scaled(30) == 30  # never shorter than written
    monkeypatch.setenv(SCALE_ENV, "2.5")
    assert scaled(30) == 75
    for bad in ("fast", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(SCALE_ENV, bad)
        with pytest.raises(ValueError, match=SCALE_ENV):
            scaled(30)
