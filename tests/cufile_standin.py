"""kvikpy's cuFile stand-in (a test double of NVIDIA's libcufile, rust/cufile-standin):
where the built library is, its C API through ctypes, and checks run against it.

The stand-in's SONAME is ``libcufile.so``: once a process has loaded it, a by-name lookup of
libcufile in that process finds the stand-in. So the checks here never load it into the
pytest process: ``run(scenario)`` runs each in a fresh interpreter
(``python tests/cufile_standin.py SCENARIO LIBRARY FOLDER``).

Where the library is (``path()``): ``$KVIKPY_CUFILE_STANDIN``, else
``.gpu/libcufile_standin.so`` (``make cufile-standin``, carried to the GPU machine), else
cargo's ``release`` folder.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable
from ctypes import POINTER, byref, c_int, c_long, c_size_t, c_ssize_t, c_uint, c_void_p
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = "KVIKPY_CUFILE_STANDIN"

# CUfileOpError values used here.
SUCCESS = 0
DRIVER_NOT_INITIALIZED = 5001
INVALID_VALUE = 5022
HANDLE_NOT_REGISTERED = 5027
BATCH_FULL = 5037
# CUfileStatus_t values.
COMPLETE = 16
FAILED = 64


def path() -> Path | None:
    """The built stand-in, or None when none is found (see the module's docstring)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for candidate in (
        ROOT / ".gpu" / "libcufile_standin.so",
        target / "release" / "libcufile_standin.so",
    ):
        if candidate.is_file():
            return candidate
    return None


class CUfileError(ctypes.Structure):
    _fields_ = [("err", c_uint), ("cu_err", c_uint)]


class _DescrHandle(ctypes.Union):
    _fields_ = [("fd", c_int), ("handle", c_void_p)]


class CUfileDescr(ctypes.Structure):
    _fields_ = [("type", c_uint), ("handle", _DescrHandle), ("fs_ops", c_void_p)]


class _Nvfs(ctypes.Structure):
    _fields_ = [
        ("major_version", c_uint),
        ("minor_version", c_uint),
        ("poll_thresh_size", c_size_t),
        ("max_direct_io_size", c_size_t),
        ("dstatusflags", c_uint),
        ("dcontrolflags", c_uint),
    ]


class CUfileDrvProps(ctypes.Structure):
    _fields_ = [
        ("nvfs", _Nvfs),
        ("fflags", c_uint),
        ("max_device_cache_size", c_uint),
        ("per_buffer_cache_size", c_uint),
        ("max_device_pinned_mem_size", c_uint),
        ("max_batch_io_size", c_uint),
        ("max_batch_io_timeout_msecs", c_uint),
    ]


class _BatchIo(ctypes.Structure):
    _fields_ = [
        ("devPtr_base", c_void_p),
        ("file_offset", c_long),
        ("devPtr_offset", c_long),
        ("size", c_size_t),
    ]


class _IoUnion(ctypes.Union):
    _fields_ = [("batch", _BatchIo)]


class CUfileIOParams(ctypes.Structure):
    _fields_ = [
        ("mode", c_uint),
        ("u", _IoUnion),
        ("fh", c_void_p),
        ("opcode", c_uint),
        ("cookie", c_void_p),
    ]


class CUfileIOEvents(ctypes.Structure):
    _fields_ = [("cookie", c_void_p), ("status", c_uint), ("ret", c_size_t)]


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", c_long), ("tv_nsec", c_long)]


def load(library: Path | str) -> ctypes.CDLL:
    """The library with cufile.h's signatures declared (call only in a fresh process)."""
    lib = ctypes.CDLL(str(library), use_errno=True)
    status = CUfileError
    signatures: dict[str, tuple[object, list[object]]] = {
        "kvikpy_cufile_standin": (ctypes.c_char_p, []),
        "cuFileDriverOpen": (status, []),
        "cuFileDriverClose_v2": (status, []),
        "cuFileUseCount": (c_long, []),
        "cuFileGetVersion": (status, [POINTER(c_int)]),
        "cuFileDriverGetProperties": (status, [POINTER(CUfileDrvProps)]),
        "cuFileDriverSetPollMode": (status, [ctypes.c_bool, c_size_t]),
        "cuFileHandleRegister": (status, [POINTER(c_void_p), POINTER(CUfileDescr)]),
        "cuFileHandleDeregister": (None, [c_void_p]),
        "cuFileBufRegister": (status, [c_void_p, c_size_t, c_int]),
        "cuFileBufDeregister": (status, [c_void_p]),
        "cuFileRead": (c_ssize_t, [c_void_p, c_void_p, c_size_t, c_long, c_long]),
        "cuFileWrite": (c_ssize_t, [c_void_p, c_void_p, c_size_t, c_long, c_long]),
        "cuFileReadAsync": (
            status,
            [
                c_void_p,
                c_void_p,
                POINTER(c_size_t),
                POINTER(c_long),
                POINTER(c_long),
                POINTER(c_ssize_t),
                c_void_p,
            ],
        ),
        "cuFileWriteAsync": (
            status,
            [
                c_void_p,
                c_void_p,
                POINTER(c_size_t),
                POINTER(c_long),
                POINTER(c_long),
                POINTER(c_ssize_t),
                c_void_p,
            ],
        ),
        "cuFileStreamRegister": (status, [c_void_p, c_uint]),
        "cuFileStreamDeregister": (status, [c_void_p]),
        "cuFileBatchIOSetUp": (status, [POINTER(c_void_p), c_uint]),
        "cuFileBatchIOSubmit": (status, [c_void_p, c_uint, POINTER(CUfileIOParams), c_uint]),
        "cuFileBatchIOGetStatus": (
            status,
            [c_void_p, c_uint, POINTER(c_uint), POINTER(CUfileIOEvents), POINTER(Timespec)],
        ),
        "cuFileBatchIODestroy": (None, [c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def ok(status: CUfileError) -> None:
    assert (status.err, status.cu_err) == (SUCCESS, 0), (status.err, status.cu_err)


def register(lib: ctypes.CDLL, fd: int) -> int:
    descr = CUfileDescr(type=1)
    descr.handle.fd = fd
    fh = c_void_p()
    ok(lib.cuFileHandleRegister(byref(fh), byref(descr)))
    assert fh.value
    return fh.value


def batch_read(
    lib: ctypes.CDLL, fh: int, base: int, ranges: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """Reads (file_offset, size, buffer_offset) ranges through one batch; the events as
    (cookie, status, ret), sorted by cookie (cookie i for range i)."""
    batch = c_void_p()
    ok(lib.cuFileBatchIOSetUp(byref(batch), len(ranges)))
    params = (CUfileIOParams * len(ranges))()
    for i, (file_offset, size, buf_offset) in enumerate(ranges):
        params[i].mode = 1
        params[i].u.batch = _BatchIo(base, file_offset, buf_offset, size)
        params[i].fh = fh
        params[i].opcode = 0
        params[i].cookie = 1000 + i
    ok(lib.cuFileBatchIOSubmit(batch, len(ranges), params, 0))
    full = lib.cuFileBatchIOSubmit(batch, 1, params, 0)
    assert full.err == BATCH_FULL, full.err
    events = (CUfileIOEvents * len(ranges))()
    nr = c_uint(len(ranges))
    ok(lib.cuFileBatchIOGetStatus(batch, len(ranges), byref(nr), events, None))
    assert nr.value == len(ranges)
    lib.cuFileBatchIODestroy(batch)
    return sorted(((e.cookie or 0) - 1000, e.status, e.ret) for e in events)


def _data(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


def scenario_host(library: Path, folder: Path) -> None:
    """The C ABI through ctypes on host memory: structs, return conventions, batches."""
    lib = load(library)
    assert b"stand-in" in lib.kvikpy_cufile_standin()
    assert lib.cuFileDriverGetProperties(byref(CUfileDrvProps())).err == DRIVER_NOT_INITIALIZED
    ok(lib.cuFileDriverOpen())
    props = CUfileDrvProps()
    ok(lib.cuFileDriverGetProperties(byref(props)))
    assert props.max_batch_io_size == 128 and props.max_device_cache_size == 131072
    ok(lib.cuFileDriverSetPollMode(True, 16))
    ok(lib.cuFileDriverGetProperties(byref(props)))
    assert props.nvfs.poll_thresh_size == 16 and props.nvfs.dcontrolflags & 1
    version = c_int()
    ok(lib.cuFileGetVersion(byref(version)))
    assert version.value >= 1000
    data = _data(100_000, 1)
    file = folder / "host.bin"
    file.write_bytes(data)
    fd = os.open(file, os.O_RDWR)
    fh = register(lib, fd)
    buf = ctypes.create_string_buffer(b"\xaa" * 50_000, 50_000)
    base = ctypes.addressof(buf)
    assert lib.cuFileRead(fh, base, 20_000, 1234, 100) == 20_000
    assert buf.raw[100:20_100] == data[1234:21_234] and buf.raw[:100] == b"\xaa" * 100
    assert lib.cuFileRead(fh, base, 50_000, 90_000, 0) == 10_000  # short at end of file
    assert lib.cuFileRead(fh + 16, base, 10, 0, 0) == -HANDLE_NOT_REGISTERED
    events = batch_read(lib, fh, base, [(0, 1000, 0), (99_500, 1000, 1000), (5000, 3000, 2000)])
    assert events == [(0, COMPLETE, 1000), (1, COMPLETE, 500), (2, COMPLETE, 3000)], events
    assert buf.raw[:1000] == data[:1000] and buf.raw[1000:1500] == data[99_500:]
    assert buf.raw[2000:5000] == data[5000:8000]
    assert lib.cuFileWrite(fh, base, 5000, 200_000, 0) == 5000
    assert file.stat().st_size == 205_000
    reader = os.open(file, os.O_RDONLY)
    rh = register(lib, reader)
    assert lib.cuFileWrite(rh, base, 10, 0, 0) == -1
    assert ctypes.get_errno() == 9  # EBADF
    lib.cuFileHandleDeregister(fh)
    lib.cuFileHandleDeregister(rh)
    ok(lib.cuFileDriverClose_v2())
    os.close(fd)
    os.close(reader)


def scenario_soname(library: Path, folder: Path) -> None:
    """Once loaded by path, a by-name dlopen of libcufile.so finds the stand-in."""
    lib = ctypes.CDLL(str(library))
    by_name = ctypes.CDLL("libcufile.so")
    assert hasattr(by_name, "kvikpy_cufile_standin")
    same = (
        ctypes.cast(by_name.cuFileRead, c_void_p).value
        == ctypes.cast(lib.cuFileRead, c_void_p).value
    )
    assert same, "libcufile.so resolved to another library"


def _torch() -> object:
    import torch

    assert torch.cuda.is_available(), "needs a CUDA GPU"
    return torch


def scenario_device(library: Path, folder: Path) -> None:
    """Synchronous reads and writes of real GPU memory, with a device offset and EOF."""
    torch = _torch()
    lib = load(library)
    ok(lib.cuFileDriverOpen())
    data = _data((3 << 20) + 123, 2)
    file = folder / "device.bin"
    file.write_bytes(data)
    fd = os.open(file, os.O_RDWR)
    fh = register(lib, fd)
    n = len(data)
    t = torch.full((n + 4096,), 0xAB, dtype=torch.uint8, device="cuda")
    base = t.data_ptr()
    ok(lib.cuFileBufRegister(base, n + 4096, 0))
    assert lib.cuFileRead(fh, base, n, 0, 4096) == n
    got = bytes(t.cpu().numpy())
    assert got[4096:] == data and got[:4096] == b"\xab" * 4096
    # Short at end of file: the device bytes past it stay as they were.
    t.fill_(0xCD)
    assert lib.cuFileRead(fh, base, 1 << 20, n - 1000, 7) == 1000
    got = bytes(t[: (1 << 20) + 7].cpu().numpy())
    assert got[7:1007] == data[-1000:] and got[1007:] == b"\xcd" * ((1 << 20) - 1000)
    assert got[:7] == b"\xcd" * 7
    # Write from a device offset, read back through the OS.
    src = torch.arange(256, dtype=torch.int32, device="cuda").view(torch.uint8).repeat(4097)
    assert lib.cuFileWrite(fh, src.data_ptr(), src.numel() - 9, 5, 9) == src.numel() - 9
    assert file.read_bytes()[5 : 5 + src.numel() - 9] == bytes(src.cpu().numpy())[9:]
    # On a second device, if there is one: the pointer's own context is used.
    if torch.cuda.device_count() > 1:
        t1 = torch.zeros(4096, dtype=torch.uint8, device="cuda:1")
        assert lib.cuFileRead(fh, t1.data_ptr(), 4096, 0, 0) == 4096
        assert bytes(t1.cpu().numpy()) == file.read_bytes()[:4096]
    ok(lib.cuFileBufDeregister(base))
    lib.cuFileHandleDeregister(fh)
    ok(lib.cuFileDriverClose_v2())
    os.close(fd)


def scenario_async(library: Path, folder: Path) -> None:
    """cuFileReadAsync / cuFileWriteAsync on a torch stream, in stream order."""
    torch = _torch()
    lib = load(library)
    ok(lib.cuFileDriverOpen())
    data = _data((2 << 20) + 11, 3)
    file = folder / "async.bin"
    file.write_bytes(data)
    fd = os.open(file, os.O_RDWR)
    fh = register(lib, fd)
    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    ok(lib.cuFileStreamRegister(handle, 0))
    n = len(data)
    t = torch.full((n + 100,), 0x11, dtype=torch.uint8, device="cuda")
    size, file_offset, buf_offset, done = c_size_t(n), c_long(0), c_long(100), c_ssize_t(-7)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # the stream is busy: the read must wait its turn
        ok(
            lib.cuFileReadAsync(
                fh,
                t.data_ptr(),
                byref(size),
                byref(file_offset),
                byref(buf_offset),
                byref(done),
                handle,
            )
        )
        # Parameters are read when the read runs: a file offset changed now is seen.
        file_offset.value = 10
    stream.synchronize()
    assert done.value == n - 10, done.value
    got = bytes(t.cpu().numpy())
    assert got[100 : 100 + n - 10] == data[10:] and got[:100] == b"\x11" * 100
    assert got[100 + n - 10 :] == b"\x11" * 10  # past the short read: unchanged
    # A write in stream order after a kernel that fills the buffer.
    out = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    wsize, woff, wbuf, wdone = c_size_t(1 << 20), c_long(n), c_long(0), c_ssize_t(-7)
    with torch.cuda.stream(stream):
        out.fill_(0x5A)
        ok(
            lib.cuFileWriteAsync(
                fh, out.data_ptr(), byref(wsize), byref(woff), byref(wbuf), byref(wdone), handle
            )
        )
    stream.synchronize()
    assert wdone.value == 1 << 20
    assert file.read_bytes()[n:] == b"\x5a" * (1 << 20)
    ok(lib.cuFileStreamDeregister(handle))
    # An unregistered stream works too (registration is optional); so does the default stream.
    done.value, file_offset.value, size.value = -7, 0, 4096
    ok(
        lib.cuFileReadAsync(
            fh, t.data_ptr(), byref(size), byref(file_offset), byref(buf_offset), byref(done), None
        )
    )
    torch.cuda.synchronize()
    assert done.value == 4096 and bytes(t[100:4196].cpu().numpy()) == data[:4096]
    lib.cuFileHandleDeregister(fh)
    ok(lib.cuFileDriverClose_v2())
    os.close(fd)


def scenario_batch(library: Path, folder: Path) -> None:
    """Batch reads into GPU memory, one short at end of file."""
    torch = _torch()
    lib = load(library)
    ok(lib.cuFileDriverOpen())
    data = _data(1 << 20, 4)
    file = folder / "batch.bin"
    file.write_bytes(data)
    fd = os.open(file, os.O_RDONLY)
    fh = register(lib, fd)
    t = torch.zeros(4 << 16, dtype=torch.uint8, device="cuda")
    ranges = [
        (0, 1 << 16, 0),
        (4096, 1 << 16, 1 << 16),
        ((1 << 20) - 100, 1 << 16, 2 << 16),
        (12345, 999, 3 << 16),
    ]
    events = batch_read(lib, fh, t.data_ptr(), ranges)
    assert events == [
        (0, COMPLETE, 1 << 16),
        (1, COMPLETE, 1 << 16),
        (2, COMPLETE, 100),
        (3, COMPLETE, 999),
    ]
    got = bytes(t.cpu().numpy())
    assert got[: 1 << 16] == data[: 1 << 16]
    assert got[1 << 16 : 2 << 16] == data[4096 : 4096 + (1 << 16)]
    assert got[2 << 16 : (2 << 16) + 100] == data[-100:]
    assert got[3 << 16 : (3 << 16) + 999] == data[12345 : 12345 + 999]
    lib.cuFileHandleDeregister(fh)
    ok(lib.cuFileDriverClose_v2())
    os.close(fd)


SCENARIOS: dict[str, Callable[[Path, Path], None]] = {
    "host": scenario_host,
    "soname": scenario_soname,
    "device": scenario_device,
    "async": scenario_async,
    "batch": scenario_batch,
}


def run(scenario: str, library: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """Runs a scenario in a fresh interpreter (the stand-in never enters the caller)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVIKIO_", "KVIKPY_CUFILE"))}
    return subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), scenario, str(library), str(folder)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3]))
    print("ok")
