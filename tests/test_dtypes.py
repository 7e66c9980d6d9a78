"""kvikpy.read's dtype and shape: every numpy type DLPack carries, bfloat16 (by name, from
ml_dtypes/JAX, from torch), torch dtypes recognised without importing torch, one -1
dimension inferred, and nothing but a clear ValueError or TypeError for anything else."""

from __future__ import annotations

import ctypes
import math
import sys

import numpy as np
import pytest
from conftest import random_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy

N = 96  # bytes in the test file: divisible by every item size


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("dtypes") / "d.bin"
    p.write_bytes(random_bytes(N, seed=8))
    return p


def dlpack_dtype(buf) -> tuple[int, int, int]:
    """(code, bits, lanes) of the DLTensor in ``buf``'s unversioned DLPack capsule."""
    capsule = buf.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor")
    # DLTensor: void* data; DLDevice device (2 x int32); int32 ndim; DLDataType dtype
    raw = ctypes.string_at(address + 20, 4)
    code, bits, lanes = raw[0], raw[1], int.from_bytes(raw[2:], sys.byteorder)
    del capsule  # its deleter frees the export
    return code, bits, lanes


class TorchLike:
    """Stands in for a torch dtype on a machine without torch: torch's dtypes print as
    ``torch.float16``, which is all kvikpy looks at."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


@pytest.mark.parametrize(
    ("dtype", "code", "bits"),
    [
        ("int8", 0, 8),
        ("<i4", 0, 32),
        ("uint16", 1, 16),
        ("float16", 2, 16),
        ("float64", 2, 64),
        ("complex64", 5, 64),
        ("complex128", 5, 128),
        ("bool", 6, 8),
        (np.float32, 2, 32),
    ],
)
def test_every_dlpack_type_reads(path, dtype, code, bits):
    buf = kvikpy.read(path, device="cpu", dtype=dtype)
    assert dlpack_dtype(buf) == (code, bits, 1)
    assert buf.dtype == np.dtype(dtype)
    assert buf.to_numpy().tobytes() == path.read_bytes()


@pytest.mark.parametrize("dtype", ["complex256", "longdouble", "clongdouble"])
def test_types_dlpack_cannot_carry_are_a_value_error(path, dtype):
    if np.dtype(dtype).itemsize not in (16, 32):
        pytest.skip(f"{dtype} is an ordinary type on this platform")
    with pytest.raises(ValueError, match="cannot be exported through DLPack"):
        kvikpy.read(path, device="cpu", dtype=dtype)


@pytest.mark.parametrize("dtype", ["S4", "U1", "O", "M8[s]", "V8", "i4,f4", "(2,)i4"])
def test_non_numeric_types_are_a_value_error(path, dtype):
    with pytest.raises(ValueError, match="uint8"):
        kvikpy.read(path, device="cpu", dtype=dtype)


def test_the_other_byte_order_is_a_value_error(path):
    other = ">f4" if sys.byteorder == "little" else "<f4"
    with pytest.raises(ValueError, match=r"byte order.*float32"):
        kvikpy.read(path, device="cpu", dtype=other)


@pytest.mark.parametrize("dtype", ["float17", "nonsense", 3.5, object(), [1, 2]])
def test_what_is_no_type_is_a_type_error(path, dtype):
    with pytest.raises(TypeError, match="not a data type"):
        kvikpy.read(path, device="cpu", dtype=dtype)


@pytest.mark.parametrize("spelling", ["bfloat16", "BFloat16", "bf16", TorchLike("bfloat16")])
def test_bfloat16_is_exported_with_its_dlpack_code(path, spelling, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # the stand-in dtype, below
    buf = kvikpy.read(path, device="cpu", dtype=spelling, shape=(6, 8))
    assert dlpack_dtype(buf) == (4, 16, 1)  # kDLBfloat, 16 bits
    assert buf.typestr == "<V2" and buf.shape == (6, 8)
    # Without ml_dtypes, numpy has no bfloat16: raw 2-byte items.
    assert buf.dtype == np.dtype("V2")
    arr = buf.to_numpy()
    assert arr.dtype == np.dtype("V2") and arr.shape == (6, 8)
    assert arr.tobytes() == path.read_bytes()
    assert arr.view(np.uint16).tobytes() == path.read_bytes()  # the bits, as uint16
    assert np.asarray(buf).dtype == np.uint16  # the buffer protocol: bits as uint16
    assert "dtype=bfloat16" in repr(buf) and "bfloat16" in buf._repr_html_()


def test_bfloat16_with_ml_dtypes(path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for spelling in ("bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)):
        buf = kvikpy.read(path, device="cpu", dtype=spelling)
        assert buf.dtype == np.dtype(ml_dtypes.bfloat16)
        assert dlpack_dtype(buf) == (4, 16, 1)
        want = np.frombuffer(path.read_bytes(), dtype=ml_dtypes.bfloat16)
        assert np.array_equal(buf.to_numpy(), want, equal_nan=True)


@pytest.mark.parametrize(
    ("name", "numpy_name"),
    [
        ("float16", "float16"),
        ("float32", "float32"),
        ("float64", "float64"),
        ("int8", "int8"),
        ("int64", "int64"),
        ("uint8", "uint8"),
        ("bool", "bool"),
        ("complex64", "complex64"),
    ],
)
def test_torch_dtypes_are_recognised_without_torch(path, name, numpy_name):
    buf = kvikpy.read(path, device="cpu", dtype=TorchLike(name))
    assert buf.dtype == np.dtype(numpy_name)
    assert "torch" not in sys.modules or sys.modules["torch"] is not None


def test_a_torch_type_numpy_lacks_is_a_value_error(path):
    # Named as torch spells it, or as ml_dtypes does where it is installed (JAX brings it).
    with pytest.raises(ValueError, match=r"float8_e4m3fn"):
        kvikpy.read(path, device="cpu", dtype=TorchLike("float8_e4m3fn"))


@pytest.mark.parametrize(
    ("shape", "want"),
    [
        (-1, (24,)),
        ((-1,), (24,)),
        ((4, -1), (4, 6)),
        ((-1, 3, 2), (4, 3, 2)),
        (np.int64(24), (24,)),
        ((np.int32(2), 12), (2, 12)),
        ([2, 3, 4], (2, 3, 4)),
    ],
)
def test_shapes_and_one_inferred_dimension(path, shape, want):
    buf = kvikpy.read(path, device="cpu", dtype="float32", shape=shape)
    assert buf.shape == want
    assert buf.to_numpy().shape == want


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        (-2, "negative"),
        ((-1, -1), "negative"),
        ((2, -3), "negative"),
        ((5, -1), "cannot cover"),
        ((0, -1), "cannot cover"),
        (25, "needs 100 bytes"),
        ((0, 1 << 70), "2\\*\\*63"),
    ],
)
def test_bad_shapes_are_a_value_error(path, shape, match):
    with pytest.raises(ValueError, match=match):
        kvikpy.read(path, device="cpu", dtype="float32", shape=shape)


@pytest.mark.parametrize("shape", [True, (2, False), "24", 2.0, (2.0, 12), {"a": 1}, object()])
def test_non_integer_shapes_are_a_type_error(path, shape):
    with pytest.raises(TypeError, match="shape must be"):
        kvikpy.read(path, device="cpu", dtype="float32", shape=shape)


DTYPE_WORDS = [
    "bfloat16",
    "float16",
    "f2",
    "i8",
    "u1",
    "c16",
    "c32",
    "f16",
    "b1",
    "?",
    "V2",
    "S3",
    "<f4",
    ">i2",
    "=u4",
    "|b1",
    "O",
    "M8",
    "m8[ns]",
    "torch.float16",
    "e",
    "longdouble",
    "complex256",
    "(2,)f4",
    "f4,i4",
    "a",
    "U",
    "p",
    "P",
    "g",
]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=st.one_of(
        st.sampled_from(DTYPE_WORDS),
        st.text(max_size=8),
        st.none(),
        st.integers(),
        st.builds(TorchLike, st.sampled_from(DTYPE_WORDS)),
    ),
    shape=st.one_of(
        st.none(),
        st.integers(-(1 << 70), 1 << 70),
        st.lists(st.integers(-3, 100), max_size=4).map(tuple),
        st.lists(st.integers(-(1 << 65), 1 << 65), max_size=3),
        st.text(max_size=3),
        st.floats(allow_nan=True),
    ),
)
def test_any_dtype_and_shape_reads_or_raises_value_or_type_error(path, dtype, shape):
    try:
        buf = kvikpy.read(path, device="cpu", dtype=dtype, shape=shape)
    except (ValueError, TypeError) as e:
        assert str(e)  # a message, never an empty one
        return
    assert buf.nbytes == N
    assert math.prod(buf.shape) * np.dtype(buf.typestr).itemsize == N
    assert buf.to_numpy().tobytes() == path.read_bytes()


@pytest.mark.gpu
def test_torch_float16_and_bfloat16_reach_torch(path):
    torch = pytest.importorskip("torch")
    data = path.read_bytes()
    for dtype in (torch.float16, torch.bfloat16, "bfloat16"):
        t = torch.from_dlpack(kvikpy.read(path, dtype=dtype, shape=(-1, 8)))
        want_dtype = torch.float16 if dtype is torch.float16 else torch.bfloat16
        assert t.dtype == want_dtype and t.shape == (N // 16, 8) and t.is_cuda
        want = torch.frombuffer(bytearray(data), dtype=want_dtype).reshape(-1, 8)
        assert torch.equal(t.cpu().view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_bfloat16_reaches_jax(path):
    jax = pytest.importorskip("jax")
    buf = kvikpy.read(path, dtype="bfloat16")
    arr = jax.dlpack.from_dlpack(buf)
    assert str(arr.dtype) == "bfloat16" and arr.shape == (N // 2,)


def test_the_item_types_come_from_the_engine():
    """One table of item types: read's DLPack codes are the engine's (bfloat16 is 'V2')."""
    from kvikpy import _dtypes, _lib

    assert ("V", 2, 4) in _lib.item_types()
    assert _dtypes._DLPACK_CODES == {
        "b": (6, (1,)),
        "i": (0, (1, 2, 4, 8)),
        "u": (1, (1, 2, 4, 8)),
        "f": (2, (2, 4, 8)),
        "c": (5, (8, 16)),
    }
    assert _dtypes._BFLOAT16 == 4
