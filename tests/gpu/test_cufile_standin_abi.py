"""kvikpy's cuFile stand-in (a test double of libcufile, not NVIDIA's library) on real GPU
memory, through its C API with ctypes: synchronous reads and writes with a device offset and
at end of file, stream-ordered reads and writes on a torch stream, batch reads.

Each check runs in a fresh interpreter (tests/cufile_standin.py), so the stand-in never
enters the test process. Skipped when the stand-in is not built or there is no GPU.
"""

from __future__ import annotations

from pathlib import Path

import cufile_standin
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.gpu  # the stand-in needs a GPU, not GPUDirect Storage

LIBRARY = cufile_standin.path()


@pytest.mark.skipif(
    LIBRARY is None, reason="the cuFile stand-in is not built (make cufile-standin)"
)
@pytest.mark.parametrize("scenario", ["device", "async", "batch"])
def test_standin_on_gpu_memory(tmp_path: Path, scenario: str) -> None:
    assert LIBRARY is not None
    result = cufile_standin.run(scenario, LIBRARY, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        result.stdout + result.stderr
    )
