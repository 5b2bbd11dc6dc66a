"""Job trace format: generator statistics, round trip, and importer errors."""

from __future__ import annotations

import itertools
import statistics

import pytest

from testbed.errors import InputError
from testbed.spec import parse_scenario
from testbed.traces import JOB_TRACE_COLUMNS, format_job_trace, generate_jobs, parse_job_trace


def test_generator_poisson_mean(ppjobs) -> None:  # type: ignore[no-untyped-def]
    ppjobs["workload"]["jobs"] = 4000
    sc = parse_scenario(ppjobs)
    jobs = generate_jobs(sc.workload)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(jobs)]
    mean = statistics.fmean(gaps)
    # Exponential gaps: mean within 5 % (4000 samples: sd of the mean ~1.6 %).
    assert abs(mean - 900) / 900 < 0.05
    share = sum(j.model == "llama2-13b" for j in jobs) / len(jobs)
    assert abs(share - 1 / 3) < 0.04  # weights 1 : 0.5


def test_round_trip(ppjobs) -> None:  # type: ignore[no-untyped-def]
    jobs = generate_jobs(parse_scenario(ppjobs).workload)
    assert parse_job_trace(format_job_trace(jobs)) == jobs


@pytest.mark.parametrize("text,fragment", [
    ("job_id,arrival_s\n", "missing column 'model'"),
    (",".join(JOB_TRACE_COLUMNS) + "\n", "no jobs"),
    (",".join(JOB_TRACE_COLUMNS) + "\n0,1.0,gpt3-6.7b,x,8,8,10\n", "row 2: stages"),
    (",".join(JOB_TRACE_COLUMNS) + "\n0,-1,gpt3-6.7b,4,8,8,10\n", "row 2: arrival_s"),
    (",".join(JOB_TRACE_COLUMNS) + "\n0,1,gpt3-6.7b,4,8,8,10\n0,2,gpt3-6.7b,4,8,8,10\n",
     "duplicate job_id"),
    (",".join(JOB_TRACE_COLUMNS) + "\n0,5,gpt3-6.7b,4,8,8,10\n1,2,gpt3-6.7b,4,8,8,10\n",
     "back in time"),
    (",".join(JOB_TRACE_COLUMNS) + "\n0,1,Bad Model;rm,4,8,8,10\n", "bad model name"),
])
def test_importer_errors(text: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_job_trace(text, origin="t.csv")
    assert fragment in info.value.message
