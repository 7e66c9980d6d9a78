"""Pickling: host Buffers travel with their bytes, dtype and shape; CuFiles reopen by
path without truncating; GPU buffers and closed files refuse clearly. Checked with pickle
round trips and a real multiprocessing worker started with "spawn"."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pytest
from conftest import random_bytes

import kvikpy

PROTOCOLS = range(2, pickle.HIGHEST_PROTOCOL + 1)


@pytest.fixture
def floats(tmp_path):
    a = np.random.default_rng(3).random((6, 5)).astype(np.float32)
    p = tmp_path / "floats.bin"
    a.tofile(p)
    return p, a


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_host_buffer_round_trips_with_dtype_and_shape(floats, protocol):
    p, a = floats
    buf = kvikpy.read(p, device="cpu", dtype="float32", shape=(6, 5))
    back = pickle.loads(pickle.dumps(buf, protocol=protocol))
    assert isinstance(back, kvikpy.Buffer)
    assert (back.dtype, back.shape, back.nbytes, back.device) == (np.float32, (6, 5), 120, "cpu")
    assert np.array_equal(back.to_numpy(), a)
    assert back.ptr != buf.ptr  # its own memory
    np.from_dlpack(back)[0, 0] = -1.0
    assert buf.to_numpy()[0, 0] == a[0, 0]


def test_protocol_5_sends_the_bytes_out_of_band(floats):
    p, a = floats
    buf = kvikpy.read(p, device="cpu", dtype="float32")
    buffers = []
    data = pickle.dumps(buf, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 200 and len(buffers) == 1  # the 120 bytes are not in the stream
    assert buffers[0].raw().nbytes == a.nbytes
    back = pickle.loads(data, buffers=buffers)
    assert np.array_equal(back.to_numpy(), a.ravel())


def test_a_view_pickles_only_its_bytes(tmp_path):
    data = random_bytes(10_000, seed=4)
    p = tmp_path / "a"
    p.write_bytes(data)
    batch = kvikpy.read_many([p, p], device="cpu")
    back = pickle.loads(pickle.dumps(batch[1]))
    assert back.nbytes == len(data) and bytes(back) == data


def test_a_bfloat16_buffer_keeps_its_type(tmp_path):
    p = tmp_path / "bf"
    p.write_bytes(random_bytes(64, seed=5))
    buf = kvikpy.read(p, device="cpu", dtype="bfloat16", shape=(4, 8))
    back = pickle.loads(pickle.dumps(buf))
    assert (back.typestr, back.shape, repr(back)) == (buf.typestr, (4, 8), repr(buf))
    assert back.__dlpack__  # still exports
    assert bytes(back) == p.read_bytes()


@pytest.mark.gpu
def test_a_pinned_buffer_comes_back_as_ordinary_host_memory():
    buf = kvikpy._lib.Buffer.allocate(4096, None, True)
    back = pickle.loads(pickle.dumps(buf))
    assert buf.is_pinned and not back.is_pinned and back.nbytes == 4096


def test_a_closed_cufile_refuses(tmp_path):
    p = tmp_path / "c"
    p.write_bytes(b"abc")
    f = kvikpy.CuFile(p)
    f.close()
    with pytest.raises(TypeError, match="closed"):
        pickle.dumps(f)


@pytest.mark.parametrize(
    ("mode", "reopened"),
    [("r", "r"), ("rb", "rb"), ("r+", "r+"), ("w", "r+"), ("w+", "r+"), ("wb", "r+b")],
)
def test_a_cufile_reopens_by_path_and_never_truncates(tmp_path, monkeypatch, mode, reopened):
    text = b"written before pickling"
    (tmp_path / "f.bin").write_bytes(b"an older, longer content to be replaced")
    monkeypatch.chdir(tmp_path)
    with kvikpy.CuFile("f.bin", mode) as f:
        if mode.startswith("w"):  # truncated by this open, then written
            f.write(text)
        data = pickle.dumps(f)
    if not mode.startswith("w"):
        (tmp_path / "f.bin").write_bytes(text)
    monkeypatch.chdir("/")  # a worker elsewhere: the path was made absolute
    with pickle.loads(data) as g:
        assert g.path == str(tmp_path / "f.bin") and g.mode == reopened
        assert g.nbytes() == len(text)
        got = bytearray(7)
        assert g.read(got) == 7 and bytes(got) == b"written"


def test_a_cufile_opened_w_in_the_parent_and_closed_keeps_its_bytes(tmp_path):
    p = tmp_path / "w.bin"
    f = kvikpy.CuFile(p, "w")
    f.write(b"12345678")
    data = pickle.dumps(f)
    f.close()
    g = pickle.loads(data)
    assert g.write(b"AB", file_offset=8) == 2
    g.close()
    assert p.read_bytes() == b"12345678AB"


WORKER = """
import json, multiprocessing as mp, sys
import numpy as np
import kvikpy

def work(buf, f, offset):
    arr = buf.to_numpy()
    n = f.write(arr, file_offset=offset)  # into a file the parent opened with "w"
    return {"sum": float(arr.sum()), "shape": list(buf.shape), "dtype": str(buf.dtype),
            "written": n, "mode": f.mode}

if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    buf = kvikpy.read(src, device="cpu", dtype="float64", shape=(-1, 4))
    with kvikpy.CuFile(out, "w") as f:
        f.write(b"head" * 8)
        with mp.get_context("spawn").Pool(2) as pool:
            results = pool.starmap(work, [(buf, f, 32), (buf, f, 32 + buf.nbytes)])
    print(json.dumps(results))
"""


def test_buffers_and_files_travel_to_a_spawned_worker(tmp_path):
    import subprocess

    a = np.arange(32, dtype=np.float64)
    src = tmp_path / "src.bin"
    a.tofile(src)
    out = tmp_path / "out.bin"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    r = subprocess.run(
        [sys.executable, str(script), str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    for res in results:
        assert res == {
            "sum": float(a.sum()),
            "shape": [8, 4],
            "dtype": "float64",
            "written": a.nbytes,
            "mode": "r+",
        }
    # The parent's header survived both workers' reopenings: nothing truncated the file.
    assert out.read_bytes() == b"head" * 8 + a.tobytes() + a.tobytes()


@pytest.mark.gpu
def test_a_gpu_buffer_refuses_with_what_to_do_instead(tmp_path):
    p = tmp_path / "g"
    p.write_bytes(random_bytes(4096, seed=6))
    buf = kvikpy.read(p, device="cuda")
    with pytest.raises(TypeError, match="to_numpy"):
        pickle.dumps(buf)
    back = pickle.loads(pickle.dumps(buf.to_numpy()))
    assert back.tobytes() == p.read_bytes()
