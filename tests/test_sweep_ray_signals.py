"""Ray in this process leaves its SIGINT/SIGTERM handlers as they were (a module of its
own: test_sweep_ray's module-wide Ray instance would make a session here refuse)."""

from __future__ import annotations

import signal

import pytest

from testbed.experiments import sweep_ray


@pytest.mark.slow
def test_a_local_session_leaves_ctrl_c_and_sigterm_to_this_process() -> None:
    """ray.shutdown sets SIGTERM back to the default in the kernel while Python still
    names Ray's handler: after a session, this process's own handlers are back in both."""
    pytest.importorskip("ray")
    from tests.sigstate import mismatches

    def own(signum: int, frame: object) -> None:  # a handler that is this process's own
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with sweep_ray.session("local", 1) as runner:
            assert runner is not None
        assert signal.getsignal(signal.SIGTERM) is own
        assert mismatches() == []
    finally:
        signal.signal(signal.SIGTERM, previous)
