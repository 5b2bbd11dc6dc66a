"""The run's own log (testbed.runs.log): INFO lines kept whatever the console shows."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path

import pytest

from testbed.runs.log import LOG_NAME, run_log


@pytest.fixture
def console() -> io.StringIO:
    """A console handler on the root logger at WARNING, as the CLI sets it up."""
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.WARNING)
    root.addHandler(h)
    yield buf
    root.removeHandler(h)
    root.setLevel(old)


def test_info_goes_to_the_file_and_not_to_the_console(tmp_path: Path,
                                                      console: io.StringIO) -> None:
    log = logging.getLogger("testbed.some.module")
    with run_log(tmp_path) as path:
        assert path == tmp_path / LOG_NAME
        log.info("a step: %d", 7)
        log.warning("a warning")
        log.debug("a detail")
    log.info("after the run")
    text = (tmp_path / LOG_NAME).read_text()
    lines = text.splitlines()
    assert "run: log of pid" in lines[0] and lines[-1].endswith("run: log ends")
    assert any(x.endswith("INFO testbed.some.module [MainThread]: a step: 7") for x in lines)
    assert any("WARNING testbed.some.module" in x and "a warning" in x for x in lines)
    assert "a detail" not in text and "after the run" not in text
    assert console.getvalue() == "a warning\n"  # the console kept its level
    assert logging.getLogger().level == logging.WARNING
    assert all(h.level == logging.NOTSET for h in logging.getLogger().handlers
               if isinstance(h, logging.StreamHandler) and h.stream is console)


def test_a_planted_link_is_not_followed(tmp_path: Path, console: io.StringIO) -> None:
    """Root writing a run's log never follows a link planted in its place."""
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOG_NAME).symlink_to(victim)
    with run_log(run) as path:
        logging.getLogger("testbed.x").info("secret step")
    assert path is None and victim.read_text() == "keep\n"
    assert "no run log" in console.getvalue()


def test_the_log_is_capped_and_says_so(tmp_path: Path, console: io.StringIO) -> None:
    for cap in (1000, 2000, 2345):  # wherever the cap falls in a line
        run = tmp_path / str(cap)
        run.mkdir()
        with run_log(run, max_bytes=cap):
            for k in range(200):
                logging.getLogger("testbed.x").info("line %d of a chatty run", k)
        text = (run / LOG_NAME).read_text()
        assert len(text) <= cap and text.endswith(f"(log cut at {cap} bytes)\n")
        assert text.count("(log cut at") == 1


def test_a_forked_child_does_not_write_the_parents_log(tmp_path: Path,
                                                       console: io.StringIO) -> None:
    with run_log(tmp_path):
        pid = os.fork()
        if pid == 0:
            logging.getLogger("testbed.x").info("from the child")
            os._exit(0)
        os.waitpid(pid, 0)
    assert "from the child" not in (tmp_path / LOG_NAME).read_text()


def test_every_run_directory_has_its_log(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from .test_rough_edges import small_quickstart

    out = tmp_path / "run"
    assert cli("sim", str(small_quickstart(tmp_path, 100)), "--out", str(out), "-q").code == 0
    text = (out / LOG_NAME).read_text()
    assert "sim run of quickstart: log of pid" in text
    assert "sim run of quickstart: log ends" in text
    assert "`lightpipe.log`: the run's log" in (out / "README.md").read_text()
