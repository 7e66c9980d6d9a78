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


def test_the_timeline_picks_the_first_middle_and_last_round_in_milliseconds():
    from benchmarks.distributed import timeline

    rounds = [
        {"reads_done": 0.001, "gathered": 0.0025},
        {"reads_done": 0.002, "gathered": 0.0031},
        {"reads_done": 0.004, "gathered": 0.0052},
    ]
    t = timeline(rounds)
    assert t["rounds"] == 3
    assert t["reads_done"] == [1.0, 2.0, 4.0]
    assert t["gathered"] == [2.5, 3.1, 5.2]
    assert t["first_middle_last"] == {"reads_done": [1.0, 2.0, 4.0], "gathered": [2.5, 3.1, 5.2]}
    assert t["last_gather_after_last_reads"] == 1.2
    # One round is its own first, middle and last; no rounds (nothing shared) is said so.
    one = timeline(rounds[:1])
    assert one["first_middle_last"] == {"reads_done": [1.0], "gathered": [2.5]}
    assert timeline([]) == {"rounds": 0}
