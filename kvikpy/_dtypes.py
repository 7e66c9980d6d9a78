"""Data types and shapes as ``kvikpy.read`` takes them: a dtype spelled the numpy, JAX or
torch way resolved to what DLPack carries, and a shape parsed (the engine fits it to the
bytes read). No I/O here: :mod:`kvikpy._api` asks this module, then reads."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, SupportsIndex, TypeAlias

import kvikpy._lib as _lib

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "BFLOAT16_TYPESTR",
    "DTypeLike",
    "ShapeLike",
    "TorchDtype",
    "parse_shape",
    "resolve_dtype",
]


class TorchDtype(Protocol):
    """A torch dtype (``torch.float16``...), described by what its type stubs declare, so
    that annotations need not import torch."""

    @property
    def is_floating_point(self) -> bool: ...
    @property
    def itemsize(self) -> int: ...


DTypeLike: TypeAlias = "npt.DTypeLike | TorchDtype"
"""What ``read`` takes as ``dtype``: numpy's dtype spellings (``"bfloat16"`` too) and
torch dtypes."""
ShapeLike: TypeAlias = "SupportsIndex | Sequence[SupportsIndex]"


def _dlpack_table() -> tuple[dict[str, tuple[int, tuple[int, ...]]], int]:
    """numpy dtype kind -> (DLPack type code, the item sizes in bytes DLPack consumers
    take), and bfloat16's code (kind ``V``), from the engine's one table of item types."""
    codes: dict[str, tuple[int, tuple[int, ...]]] = {}
    bfloat16 = 4  # DLPack's kDLBfloat
    for kind, size, code in _lib.item_types():
        if kind == "V":
            bfloat16 = code
        else:
            codes[kind] = (code, (*codes.get(kind, (code, ()))[1], size))
    return codes, bfloat16


_DLPACK_CODES, _BFLOAT16 = _dlpack_table()
# bfloat16's typestr: numpy has no bfloat16, so the items are raw 2-byte ones ('V2');
# ``Buffer.dtype`` reports ``ml_dtypes.bfloat16`` where ml_dtypes is installed.
BFLOAT16_TYPESTR = "<V2"
_MAX_DIM = (1 << 63) - 1


class _Dtype(NamedTuple):
    """How ``read`` describes its items to consumers."""

    name: str  # for messages
    typestr: str  # numpy's array-interface spelling
    code: int  # DLPack type code
    itemsize: int


def _torch_name(dtype: object) -> str | None:
    """``"float16"`` for ``torch.float16`` (and its aliases such as ``torch.half``),
    recognised by its string so that torch need not be imported; None for anything else."""
    if isinstance(dtype, str):
        return None
    text = str(dtype)
    prefix = "torch."
    if text.startswith(prefix) and text[len(prefix) :].isidentifier():
        return text[len(prefix) :]
    return None


def resolve_dtype(dtype: object) -> _Dtype:
    """The item type ``read`` exports for ``dtype``: a numpy dtype or its spelling,
    ``"bfloat16"``, ``ml_dtypes.bfloat16`` (JAX's), or a torch dtype such as
    ``torch.float16``. TypeError for something that is no data type, ValueError for a
    data type that DLPack cannot carry."""
    import numpy as np

    spelled = _torch_name(dtype)
    if spelled is not None:
        dtype = spelled
    if dtype is None:
        dtype = "uint8"  # read's default
    if isinstance(dtype, str) and dtype.strip().lower() in ("bfloat16", "bf16"):
        return _Dtype("bfloat16", BFLOAT16_TYPESTR, _BFLOAT16, 2)
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except Exception as e:  # TypeError mostly; odd spellings give others
        if spelled is not None:
            raise ValueError(
                f"torch.{spelled} has no numpy or DLPack type kvikpy can export; read the "
                "bytes (dtype='uint8') and view them as that type in torch"
            ) from e
        raise TypeError(
            f"dtype={dtype!r} is not a data type: pass a numpy dtype or its name "
            "('float16', '<i4'...), 'bfloat16', or a torch dtype (torch.float16)"
        ) from e
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes.bfloat16 (JAX, TensorFlow)
        return _Dtype("bfloat16", BFLOAT16_TYPESTR, _BFLOAT16, 2)
    code, sizes = _DLPACK_CODES.get(dt.kind, (None, ()))
    if code is None or dt.itemsize not in sizes or dt.fields is not None or dt.subdtype:
        raise ValueError(
            f"dtype {dt} ({dt.itemsize}-byte items) cannot be exported through DLPack, which "
            "carries booleans, integers of 1 to 8 bytes, float16/32/64, bfloat16 and "
            "complex64/128; read the bytes (dtype='uint8') and view them as that type in "
            "your array library"
        )
    if not dt.isnative:
        raise ValueError(
            f"dtype {dt.str!r} is in the other byte order, which DLPack cannot describe; "
            f"read with the native dtype {dt.newbyteorder('=').name!r} and swap the bytes "
            "afterwards (numpy: arr.byteswap())"
        )
    typestr = dt.str if dt.itemsize > 1 else "|" + dt.str[1:]
    return _Dtype(dt.name, typestr, code, dt.itemsize)


def parse_shape(shape: object) -> list[int]:
    """``shape`` (an int or a sequence of ints, numpy integers included) as a list;
    TypeError for anything else, ValueError for negative dimensions other than one -1."""
    wrong = TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    if isinstance(shape, bool) or type(shape).__name__ == "bool_":
        raise wrong
    try:
        dims = [operator.index(shape)]  # type: ignore[arg-type]
    except TypeError:
        if isinstance(shape, str | bytes) or not hasattr(shape, "__iter__"):
            raise wrong from None
        dims = []
        for d in shape:
            if isinstance(d, bool) or type(d).__name__ == "bool_":
                raise wrong from None
            try:
                dims.append(operator.index(d))
            except TypeError:
                raise wrong from None
    if any(d < -1 for d in dims) or dims.count(-1) > 1:
        raise ValueError(
            f"shape {tuple(dims)} has a negative dimension; dimensions are sizes (0 or more), "
            "with at most one -1 standing for as many items as fit"
        )
    if any(d > _MAX_DIM for d in dims):
        raise ValueError(f"shape {tuple(dims)} has a dimension above 2**63 - 1")
    return dims
