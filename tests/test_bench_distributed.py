"""The distributed benchmark's job plan: its --also rows (environment variants)."""

import pytest

from benchmarks.distributed import plan_jobs


def test_also_adds_a_row_with_its_environment():
    jobs = plan_jobs(
        ["kvikpy", "kvikpy-reads"],
        ["small:kvikpy-reads:KVIKPY_GPU_THREADS=16,KVIKPY_READ_CHUNK_SIZE=1048576"],
    )
    assert jobs == [
        ("kvikpy", "kvikpy", {}),
        ("kvikpy-reads", "kvikpy-reads", {}),
        (
            "kvikpy-reads, small",
            "kvikpy-reads",
            {"KVIKPY_GPU_THREADS": "16", "KVIKPY_READ_CHUNK_SIZE": "1048576"},
        ),
    ]
    # A value may hold '=' and ':' (a path list).
    (_, _, env) = plan_jobs(["kvikpy"], ["p:kvikpy:PYTHONPATH=/a:/b,X=y=z"])[1]
    assert env == {"PYTHONPATH": "/a:/b", "X": "y=z"}


@pytest.mark.parametrize(
    "bad",
    ["small", "small:kvikpy", "small:kvikpy:", "small:instanttensor:A=1", ":kvikpy:A=1",
     "small:kvikpy:A", "small:kvikpy:=1"],
)  # fmt: skip
def test_also_refuses_what_it_cannot_run(bad):
    with pytest.raises(ValueError, match="LABEL:LIB:VAR=VALUE") as e:
        plan_jobs(["kvikpy"], [bad])
    assert repr(bad) in str(e.value) and "(kvikpy)" in str(e.value)
