"""How intake finds CuPy's fast path, without a GPU: a stand-in ``cupy`` module (an
``ndarray`` type with the attributes CuPy's arrays have) imported after kvikpy, in a
child process so that no other test sees it. What the fast path takes it answers for
(an empty array's size; without a GPU, a CUDA error for device memory); what it declines
goes down the general interfaces, which refuse the stand-in ("exports no buffer")."""

from __future__ import annotations

import json
import subprocess
import sys

_CHILD = r"""
import json, sys, types
import kvikpy
from kvikpy import _lib

class Memory: pass
class PooledMemory:
    identity = "Memory"
class MemoryPointer:
    def __init__(self, mem, ptr): self.mem, self.ptr, self.device_id = mem, ptr, 0
class Stream:
    ptr = 0
class ndarray:
    def __init__(self, nbytes, contiguous=True, mem=None):
        self.nbytes, self._c_contiguous = nbytes, contiguous
        self.data = MemoryPointer(mem or Memory(), 0 if nbytes == 0 else 1 << 40)

def path(a):
    # "fast" if intake took `a` (its size back, or, without a GPU, a CUDA error);
    # "general" if it went down the general interfaces, which refuse the stand-in.
    try:
        _lib.buffer_nbytes(a, True)
    except TypeError as e:
        return "general" if "exports no buffer" in str(e) else repr(e)
    except Exception:
        return "fast"  # device memory, and no CUDA here
    return "fast"

assert path(ndarray(0)) == "general", "no cupy module yet: the general path"
cupy = types.ModuleType("cupy")
cupy.__version__ = sys.argv[1]
cupy.ndarray = ndarray
cupy.cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(Memory=Memory, PooledMemory=PooledMemory),
    get_current_stream=lambda device_id=-1: Stream(),
)
sys.modules["cupy"] = cupy
class Sub(ndarray): pass
results = {
    "empty": path(ndarray(0)),
    "device": path(ndarray(4096)),
    "pooled": path(ndarray(4096, mem=PooledMemory())),
    "subclass": path(Sub(4096)),
    "strided": path(ndarray(4096, contiguous=False)),
}
pooled_managed = PooledMemory()
pooled_managed.identity = "ManagedMemory"
results["pooled managed"] = path(ndarray(4096, mem=pooled_managed))
print(json.dumps(results))
"""


def _run(version: str) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, version], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, str] = json.loads(out.stdout)
    return result


def test_cupy_arrays_take_the_fast_path_once_cupy_is_imported() -> None:
    assert _run("13.6.0") == {
        "empty": "fast",
        "device": "fast",
        "pooled": "fast",
        "subclass": "general",
        "strided": "general",
        "pooled managed": "general",
    }


def test_cupy_before_13_keeps_the_interfaces() -> None:
    # Its current stream is not kept per device: no fast path at all.
    assert set(_run("12.3.0").values()) == {"general"}
