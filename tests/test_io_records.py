"""testbed.io.records: a worker's JSON-lines records read without following a link,
blocking on a FIFO or reading past the bound; a line cut short left out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.errors import InputError
from testbed.io.records import read_json_lines
from testbed.orchestrate.results import read_records


def test_objects_in_order_a_cut_line_and_non_objects_left_out(tmp_path: Path) -> None:
    p = tmp_path / "stage0.jsonl"
    p.write_text('{"type": "start"}\n[1, 2]\n{"type": "iteration", "iteration": 0}\n{"ty')
    assert read_json_lines(p) == [{"type": "start"}, {"type": "iteration", "iteration": 0}]
    assert read_records(p) == read_json_lines(p)
    assert read_json_lines(tmp_path / "none.jsonl") == []


def test_a_link_a_fifo_and_an_oversized_file_are_refused_naming_the_field(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    real.write_text('{"a": 1}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with pytest.raises(InputError, match=r"worker records.*symbolic link"):
        read_records(link)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="records"):
        read_json_lines(fifo)  # no writer: it must not block
    with pytest.raises(InputError, match="larger than 4 bytes"):
        read_json_lines(real, cap_bytes=4)


def test_the_fidelity_probe_reads_the_same_way(tmp_path: Path) -> None:
    from testbed.emu.fidelity_probe import _read_lines, _window_and_usage

    p = tmp_path / "stage0.jsonl"
    p.write_text('{"type": "start", "ready_s": 1.5}\n{"type": "done", "end_s": 4.0, '
                 '"usage": {"cpu_s": 1}}\n')
    assert _window_and_usage(str(p)) == (1.5, 4.0, {"cpu_s": 1})
    link = tmp_path / "l.jsonl"
    link.symlink_to(p)
    assert _read_lines(str(link)) == []
    assert _window_and_usage(str(link)) == (None, None, None)
