"""The command line: ``python -m kvikpy bench`` / ``info``, in a subprocess and in-process."""

from __future__ import annotations

import json
import sys
import tomllib
import zlib
from pathlib import Path

import pytest
from conftest import random_bytes, run_cli, run_python

import kvikpy
from kvikpy import _lib
from kvikpy._cli import main, parse_size
from kvikpy._display import NO_GPU_IO

ROOT = Path(__file__).resolve().parent.parent

BENCH_KEYS = {
    "path",
    "size",
    "device",
    "threads",
    "task_size",
    "repeat",
    "first_gbps",
    "median_gbps",
    "min_gbps",
    "max_gbps",
    "first_s",
    "times_s",
    "setup_read",
    "verified",
    "crc32",
    "file_crc32",
    "kvikpy",
}
INFO_KEYS = {
    "staging",
    "kvikpy",
    "python",
    "python_implementation",
    "executable",
    "platform",
    "cuda_available",
    "cuda_unavailable_reason",
    "device_count",
    "devices",
    "compat_mode_preferred",
    "gpu_io",
    "io_threads",
    "cufile",
    "gds",
    "settings",
    "library",
}


@pytest.fixture
def data_file(file_with) -> tuple[Path, bytes]:
    """A 3 MiB + 5 file of random (non-zero) bytes."""
    data = random_bytes((3 << 20) + 5, seed=301)
    return file_with(data), data


def test_bench_json_in_a_subprocess(data_file):
    path, data = data_file
    r = run_cli("bench", str(path), "--device", "cpu", "--threads", "3", "--repeat", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    result = json.loads(r.stdout)
    assert set(result) == BENCH_KEYS
    assert result["path"] == str(path)
    assert result["size"] == len(data) == path.stat().st_size
    assert result["device"] == "cpu"
    assert result["threads"] == 3
    assert result["repeat"] == 4 and len(result["times_s"]) == 4
    assert result["verified"] is True
    assert result["crc32"] == result["file_crc32"] == f"{zlib.crc32(data):08x}"
    assert result["kvikpy"] == kvikpy.__version__
    assert 0 < result["min_gbps"] <= result["median_gbps"] <= result["max_gbps"]
    assert result["first_gbps"] > 0 and result["first_s"] > 0
    assert all(t > 0 for t in result["times_s"])
    fastest = len(data) / min(result["times_s"]) / 1e9
    assert result["max_gbps"] == pytest.approx(fastest)


def test_bench_line_in_a_subprocess(data_file):
    path, _ = data_file
    r = run_cli("bench", str(path), "--device", "cpu", "--repeat", "2", "--task-size", "1MiB")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith(f"{path}: 3.0 MiB into cpu, ")
    assert "1.0 MiB tasks" in line
    assert "first read " in line and "then median " in line and "over 2 reads" in line
    assert line.endswith(f"bytes verified (crc32 {zlib.crc32(path.read_bytes()):08x})")


def test_bench_in_process_honours_the_settings_and_restores_them(data_file, capsys):
    path, data = data_file
    before = kvikpy.defaults.get("num_threads"), kvikpy.defaults.get("task_size")
    args = ["bench", str(path), "--threads", "3", "--task-size", "65536", "--repeat", "1"]
    assert main([*args, "--json"]) == 0
    # The last read ran on a pool of 3 threads; the settings are back as they were.
    assert _lib.thread_pool_size() == 3
    assert (kvikpy.defaults.get("num_threads"), kvikpy.defaults.get("task_size")) == before
    out, err = capsys.readouterr()
    assert err == ""
    result = json.loads(out)
    assert (result["threads"], result["task_size"], result["size"]) == (3, 65536, len(data))
    assert result["device"] == ("cuda:0" if kvikpy.cuda_available() else "cpu")  # auto
    assert result["verified"] is True
    assert len(result["times_s"]) == 1


def test_bench_defaults_report_the_current_settings(data_file, capsys):
    path, _ = data_file
    with kvikpy.defaults.set({"num_threads": 2, "task_size": 1 << 20}):
        assert main(["bench", str(path), "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["threads"], result["task_size"], result["repeat"]) == (2, 1 << 20, 5)


def test_bench_no_verify(data_file, capsys):
    path, _ = data_file
    args = ["bench", str(path), "--device", "cpu", "--repeat", "1", "--no-verify"]
    assert main(args) == 0
    assert capsys.readouterr().out.rstrip().endswith("bytes not checked")
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verified"] is None and result["crc32"] is None


def test_bench_reports_bytes_that_differ(data_file, capsys, monkeypatch):
    """A read that returned wrong bytes is reported, and the exit status is 1."""
    from kvikpy._cli import bench

    path, _ = data_file
    monkeypatch.setattr(bench, "crc32_of_buffer", lambda buf, size: 0x12345678)
    assert main(["bench", str(path), "--device", "cpu", "--repeat", "1"]) == 1
    out, err = capsys.readouterr()
    assert "BYTES DIFFER from the file (crc32 12345678 read" in out
    assert err == "kvikpy bench: error: the bytes read differ from the file\n"


def test_the_setup_read_leaves_nothing_behind_and_is_optional(data_file, capsys, monkeypatch):
    """One-time setup is paid by reading a sparse file in /dev/shm, which is removed after;
    where that directory is unusable the benchmark runs without it."""
    from kvikpy._cli import bench

    path, _ = data_file
    shm = Path(bench.SETUP_DIR)
    before = set(shm.iterdir()) if shm.is_dir() else set()
    assert main(["bench", str(path), "--device", "cpu", "--repeat", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup_read"] is shm.is_dir()
    if shm.is_dir():
        assert not {p for p in set(shm.iterdir()) - before if "kvikpy-bench-" in p.name}
    monkeypatch.setattr(bench, "SETUP_DIR", str(path.parent / "no-such-dir"))
    assert main(["bench", str(path), "--device", "cpu", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["setup_read"] is False and result["verified"] is True


def test_checksums_cover_several_chunks(file_with, monkeypatch):
    """The chunked CRCs of buffer and file agree with a one-shot CRC across chunk edges."""
    import numpy as np

    from kvikpy._cli import common

    monkeypatch.setattr(common, "VERIFY_CHUNK", 4096)
    data = random_bytes(5 * 4096 + 123, seed=302)
    path = file_with(data)
    assert common.crc32_of_file(str(path)) == (zlib.crc32(data), len(data))
    buf = np.frombuffer(data, dtype=np.uint8)
    assert common.crc32_of_buffer(buf, len(data)) == zlib.crc32(data)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "missing: no such file"),
        ("directory", "directory is a directory; bench reads one file"),
        ("empty", "empty is empty; there is nothing to time"),
    ],
)
def test_bench_bad_paths_exit_1_with_one_line(tmp_path, capsys, kind, message):
    path = tmp_path / kind
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    assert main(["bench", str(path), "--device", "cpu"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("kvikpy bench: error: ") and message in err
    assert err.count("\n") == 1


def test_bench_missing_file_in_a_subprocess(tmp_path):
    r = run_cli("bench", str(tmp_path / "nope.bin"))
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr == f"kvikpy bench: error: {tmp_path / 'nope.bin'}: no such file\n"
    assert "Traceback" not in r.stderr


def test_bench_special_file_is_refused(capsys):
    assert main(["bench", "/dev/null"]) == 1
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["--threads", "many"], "argument --threads: expected a whole number"),
        (["--repeat", "0"], "argument --repeat: must be at least 1"),
        (["--task-size", "4 lots"], "argument --task-size: expected a size in bytes"),
        (["--task-size", "0"], "argument --task-size: must be at least 1 byte"),
        (["--device", "gpu"], "argument --device: expected auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:x"], "argument --device: expected auto, cpu, cuda or cuda:N"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bench_bad_arguments_exit_2(data_file, capsys, args, message):
    path, _ = data_file
    assert main(["bench", str(path), *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: kvikpy")
    assert f"error: {message}" in err
    assert "Traceback" not in err


def test_no_command_or_an_unknown_one_exits_2(capsys):
    assert main([]) == 2
    assert "the following arguments are required" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_help_and_version_exit_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"kvikpy {kvikpy.__version__}\n"
    assert main(["bench", "--help"]) == 0
    assert "--task-size BYTES" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4194304", 4194304),
        ("4MiB", 4 << 20),
        ("4M", 4 << 20),
        ("4mb", 4 << 20),
        ("64k", 64 << 10),
        ("1GiB", 1 << 30),
        ("512B", 512),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.skipif(kvikpy.cuda_available(), reason="CUDA is available here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_bench_cuda_without_cuda_exits_1(data_file, capsys, device):
    path, _ = data_file
    assert main(["bench", str(path), "--device", device]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"kvikpy bench: error: --device {device} needs a GPU, but CUDA is")
    assert err.rstrip().endswith("use --device cpu to read into host memory")
    assert err.count("\n") == 1


@pytest.mark.skipif(kvikpy.cuda_available(), reason="CUDA is available here")
def test_bench_cuda_without_cuda_in_a_subprocess(data_file):
    path, _ = data_file
    r = run_cli("bench", str(path), "--device", "cuda", "--json")
    assert r.returncode == 1
    assert r.stdout == ""
    assert "needs a GPU, but CUDA is not available" in r.stderr
    assert "Traceback" not in r.stderr


def test_info_json_in_a_subprocess():
    r = run_cli("info", "--json", KVIKIO_NTHREADS="5")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == INFO_KEYS
    assert d["kvikpy"] == kvikpy.__version__
    assert d["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert d["cuda_available"] == kvikpy.cuda_available()
    assert d["device_count"] == (kvikpy.device_count() if d["cuda_available"] else 0)
    assert d["devices"] == [f"cuda:{i}" for i in range(d["device_count"])]
    assert (d["cuda_unavailable_reason"] is None) == d["cuda_available"]
    assert d["io_threads"].startswith("5 for host transfers")
    assert ("per GPU" in d["io_threads"]) == (d["device_count"] > 0)
    assert set(d["settings"]) == set(_lib.setting_names())
    assert d["settings"]["num_threads"] == 5  # the environment variable is seen
    assert d["settings"]["compat_mode"] in {"ON", "OFF", "AUTO"}
    assert Path(d["library"]).resolve() == Path(_lib.__file__).resolve()
    # 5 I/O threads, each with one 16 MiB host bounce buffer: a host load's part is 80 MiB.
    assert d["staging"]["uncapped"]["host"] == 5 * (16 << 20)
    assert d["staging"]["host_load"]["bounce"] == 5 * (16 << 20)


def test_info_text_in_process(capsys):
    with kvikpy.defaults.set("task_size", 1 << 20):
        assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kvikpy    {kvikpy.__version__}\n")
    for label in ("python ", "platform ", "cuda ", "staging ", "library ", "settings"):
        assert f"\n{label}" in out
    assert "  task_size" in out and "1048576" in out


@pytest.mark.parametrize("mode", ["ON", "OFF", "AUTO"])
def test_info_explains_the_gpu_path_without_libcufile(mode):
    """Without libcufile (this machine, CI): info says GDS is unusable, why, and what each
    compat_mode then does."""
    if kvikpy.info()["gds"]["library"] is not None:
        pytest.skip("libcufile loads here")
    r = run_cli("info", KVIKIO_COMPAT_MODE=mode)
    assert r.returncode == 0, r.stderr
    # Without CUDA there is no GPU path to describe; with it, POSIX and bounce buffers.
    gpu_io = "POSIX, pinned bounce buffers" if kvikpy.cuda_available() else NO_GPU_IO
    assert f"gpu I/O   {gpu_io}" in r.stdout
    assert "cuFile    not usable: libcufile is not installed" in r.stdout
    expected = {
        "ON": "compat_mode=ON reads and writes through POSIX",
        "OFF": "compat_mode=OFF fails to open files (kvikpy.CuFileError)",
        "AUTO": "so compat_mode=AUTO reads and writes through POSIX",
    }[mode]
    assert expected in r.stdout
    d = json.loads(run_cli("info", "--json", KVIKIO_COMPAT_MODE=mode).stdout)
    assert d["gpu_io"] == gpu_io
    assert d["gds"]["usable"] is False
    assert d["gds"]["reason"].startswith("libcufile is not installed")
    assert d["gds"]["libcufile_version"] is None and d["gds"]["properties"] is None


def test_cufile_reprs_say_which_path_and_why(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789abcdef")
    with kvikpy.defaults.set(compat_mode=kvikpy.CompatMode.ON), kvikpy.CuFile(path) as f:
        html = f._repr_html_()
    assert "POSIX, pinned bounce buffers; compat_mode is ON" in html
    assert "GPUDirect" not in html


def test_a_malformed_environment_variable_is_one_line():
    r = run_cli("info", KVIKIO_NTHREADS="abc")
    assert r.returncode == 1
    assert r.stderr.startswith("kvikpy info: error: ")
    assert "KVIKIO_NTHREADS" in r.stderr
    assert r.stderr.count("\n") == 1


def test_console_script_points_at_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["kvikpy"].partition(":")
    assert (module, name) == ("kvikpy.__main__", "main")
    import kvikpy.__main__

    assert kvikpy.__main__.main is main


def test_the_cli_keeps_import_kvikpy_light():
    """``import kvikpy`` does not load the command line (argparse, json...)."""
    r = run_python("import sys, kvikpy; print('kvikpy._cli' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_read_json_reports_what_arrived(data_file, capsys):
    path, data = data_file
    assert (
        main(["read", str(path), "--device", "cpu", "--offset", "3", "--size", "1KiB", "--json"])
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["size"] == 1024 and r["offset"] == 3 and r["device"] == "cpu"
    assert r["crc32"] == f"{zlib.crc32(data[3:1027]):08x}"
    assert r["head"] == data[3:19].hex(" ")
    assert r["seconds"] > 0


def test_read_line_in_a_subprocess(data_file):
    path, data = data_file
    out = run_cli("read", str(path), "--device", "cpu", "--head", "4")
    assert out.returncode == 0, out.stderr
    assert f"({len(data):,} bytes)" in out.stdout
    assert f"crc32 {zlib.crc32(data):08x}" in out.stdout
    assert out.stdout.strip().endswith(data[:4].hex(" "))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offset", "99999999"], "past the end"),
        (["--size", "99999999"], "past the end"),
    ],
)
def test_read_bad_ranges_exit_1(data_file, capsys, args, message):
    path, _ = data_file
    assert main(["read", str(path), "--device", "cpu", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvikpy read: error:") and message in err


def test_read_bad_paths_exit_1(tmp_path, capsys):
    assert main(["read", str(tmp_path / "missing")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["read", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


def test_io_threads_rule_counts_one_pool_per_gpu():
    from kvikpy import _display

    assert _display.io_threads(16, 0, 0) == "16 for host transfers"
    four = _display.io_threads(16, 8, 4)
    assert "8 per GPU" in four and "up to 48 in all with all 4 GPUs in use)" in four
    shared = [(2, 1 << 20, 4), (3, 1 << 20, 2), (4, 1 << 20, 2)]
    bounded = _display.io_threads(16, 16, 4, 32, shared)
    assert bounded.endswith(
        "up to 80 in all with all 4 GPUs in use, at most 32 of the GPUs' threads moving bytes "
        "at once, shared among the GPUs in use); reads onto two or more GPUs at once move "
        "in 1 MiB pieces through 4 pinned buffers per read onto 2 GPUs, 2 onto 3 to 4 "
        "(unless KVIKPY_READ_CHUNK_SIZE sets them)"
    )
    # A budget no pool can reach is not mentioned, nor pieces the engine does not cut.
    one = _display.io_threads(16, 16, 1, 32)
    assert "moving" not in one and one.endswith("up to 32 in all with its GPU in use)")
    wide = _display.io_threads(16, 16, 4, 64, shared[:1])
    assert "moving" not in wide
    assert wide.endswith("move in 1 MiB pieces through 4 pinned buffers per read onto 2 GPUs "
                         "(unless KVIKPY_READ_CHUNK_SIZE sets them)")  # fmt: skip
    assert "pieces" not in _display.io_threads(16, 16, 4, 64)
    mixed = _display.io_threads(16, 16, 8, 128, [(2, 4 << 20, 2), (3, 1 << 20, 2), (5, 1 << 20, 2)])
    assert mixed.endswith("in small pieces through 2 pinned buffers per read onto 2 to 3 GPUs, "
                          "2 onto 5 (unless KVIKPY_READ_CHUNK_SIZE sets them)")  # fmt: skip


def test_info_says_how_reads_onto_several_gpus_are_cut():
    """The engine's own rule, the one ``kvikpy info`` prints: none on one GPU; where a
    GPU's pool leaves room in the copy budget, 1 MiB pieces and more buffers per read
    for fewer busy threads, within two full bounce buffers."""
    from kvikpy import _info

    assert _lib.shared_read_pieces(0) is None and _lib.shared_read_pieces(1) is None
    # 8 threads per GPU under a budget of at least 16: two GPUs' 16 busy threads (and
    # four GPUs' at most 32) share 128 MiB of 1 MiB pieces, four buffers each at most.
    with kvikpy.defaults.set("num_threads", 8):
        assert _lib.shared_read_pieces(2) == (1 << 20, 4)
        assert _lib.shared_read_pieces(4) == (1 << 20, 4)
        assert _info.shared_pieces(3) == [(2, 1 << 20, 4), (3, 1 << 20, 4)]
        with kvikpy.defaults.set("bounce_buffer_size", 1 << 20):
            assert _lib.shared_read_pieces(2) == (1 << 20, 2)
        with kvikpy.defaults.set("gpu_threads", 8):  # set by hand: no budget, no turns
            assert _lib.shared_read_pieces(2) is None
    with kvikpy.defaults.set("num_threads", 1024):  # one pool fills any budget
        assert _lib.shared_read_pieces(2) is None
        assert _info.shared_pieces(4) == []
