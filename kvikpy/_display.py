"""How kvikpy objects show themselves: one-line ``repr`` s with human units, and small
HTML tables for notebooks (``_repr_html_``)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from kvikpy._dtypes import BFLOAT16_TYPESTR


def human_bytes(n: float, digits: int = 1) -> str:
    """``1536`` -> ``"1.5 KiB"`` (``digits`` decimals); whole bytes below 1 KiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def html_table(title: str, rows: list[tuple[str, Any]]) -> str:
    """A compact two-column table headed by ``title``, every value escaped."""
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>"
    return f"<table>{caption}{body}</table>"


def _dtype(buf: Any) -> str:
    if buf.typestr == BFLOAT16_TYPESTR:  # numpy calls these raw items 'V2'
        return "bfloat16"
    try:
        return str(buf.dtype)
    except Exception:  # a typestr numpy does not know
        return str(buf.typestr)


def buffer_rows(buf: Any) -> list[tuple[str, Any]]:
    memory = "pinned host" if buf.is_pinned else ("GPU" if buf.device != "cpu" else "host")
    return [
        ("size", f"{human_bytes(buf.nbytes)} ({buf.nbytes:,} bytes)"),
        ("device", f"{buf.device} ({memory} memory)"),
        ("dtype", _dtype(buf)),
        ("shape", tuple(buf.shape)),
        ("address", f"{buf.ptr:#x}"),
    ]


def buffer_repr(buf: Any) -> str:
    pinned = " pinned" if buf.is_pinned else ""
    shape = tuple(buf.shape)
    return (
        f"<kvikpy.Buffer {human_bytes(buf.nbytes)} on {buf.device}{pinned}, "
        f"dtype={_dtype(buf)}, shape={shape}>"
    )


def buffer_html(buf: Any) -> str:
    return html_table("kvikpy.Buffer", buffer_rows(buf))


def backend(f: Any) -> str:
    """How an open file's GPU reads and writes move, and why (its ``backend``)."""
    name, why = f.backend
    if name == "cufile":
        return f"cuFile (GPUDirect Storage) for transfers of at least gds_threshold; {why}"
    return f"POSIX, pinned bounce buffers; {why}"


# What ``info`` says of GPU reads where CUDA is not available.
NO_GPU_IO = "none: CUDA is not available, so reads and writes use host memory only"


def io_threads(
    num_threads: int,
    per_gpu: int,
    device_count: int,
    budget: int = 0,
    pieces: Sequence[tuple[int, int, int]] = (),
) -> str:
    """How many I/O threads kvikpy runs, for ``info``: one pool of ``num_threads`` for
    host transfers, and one of ``per_gpu`` for each GPU that device transfers use, at
    most ``budget`` of them moving bytes at once, shared among the GPUs in use (0: no
    bound). ``pieces``: how reads move while several GPUs read at once, ``(GPUs, piece
    bytes, pinned buffers per read)`` for each count of GPUs where the engine cuts them
    so (``_lib.shared_read_pieces``); said too."""
    rule = f"{num_threads} for host transfers"
    if device_count:
        total = num_threads + per_gpu * device_count
        gpus = "its GPU" if device_count == 1 else f"all {device_count} GPUs"
        rule += (
            f", and {per_gpu} per GPU for transfers to and from it (one pool each; up to "
            f"{total} in all with {gpus} in use"
        )
        if budget and budget < per_gpu * device_count:
            rule += (
                f", at most {budget} of the GPUs' threads moving bytes at once, shared among "
                "the GPUs in use"
            )
        rule += ")"
    if pieces:
        sizes = {human_bytes(piece, 0) for _, piece, _ in pieces}
        size = sizes.pop() if len(sizes) == 1 else "small"
        rule += (
            f"; reads onto two or more GPUs at once move in {size} pieces through "
            f"{_buffers_by_gpus(pieces)} (unless KVIKPY_READ_CHUNK_SIZE sets them)"
        )
    return rule


def _buffers_by_gpus(pieces: Sequence[tuple[int, int, int]]) -> str:
    """``(GPUs, piece, buffers)`` as "4 pinned buffers per read onto 2 GPUs, 2 onto 3 to
    4": consecutive GPU counts with as many buffers said once."""
    runs: list[list[int]] = []  # [first GPUs, last GPUs, buffers]
    for gpus, _, buffers in sorted(pieces):
        if runs and runs[-1][2] == buffers and runs[-1][1] == gpus - 1:
            runs[-1][1] = gpus
        else:
            runs.append([gpus, gpus, buffers])
    said = []
    for k, (first, last, buffers) in enumerate(runs):
        onto = f"{first}" if first == last else f"{first} to {last}"
        what = f"{buffers} pinned buffers per read" if k == 0 else f"{buffers}"
        said.append(f"{what} onto {onto}" + (" GPUs" if k == 0 else ""))
    return ", ".join(said)


def staging_line(staging: dict[str, Any]) -> str:
    """One line on a checkpoint load's staging budget and the bounce buffers held now
    (see :func:`kvikpy._info.staging_info`)."""
    b = human_bytes
    gpu, host, memory = staging["gpu_load"], staging["host_load"], staging["memory"]
    held = memory["host"]["held"] + sum(m["held"] for m in memory["pinned"].values())
    peak = memory["host"]["peak_in_use"] + sum(m["peak_in_use"] for m in memory["pinned"].values())
    return (
        f"checkpoint_staging {b(staging['checkpoint_staging'])}: GPU loads "
        f"{b(gpu['bounce'])} pinned + {b(gpu['windows'])} of GPU windows, host loads "
        f"{b(host['bounce'])}; bounce buffers held now {b(held)} (peak in use {b(peak)})"
    )


def gpu_io(gds: dict[str, Any], compat_mode: str, cuda_available: bool = True) -> str:
    """Which path GPU reads take under ``compat_mode``, for ``info`` (none without CUDA)."""
    if not cuda_available:
        return NO_GPU_IO
    if compat_mode == "ON" or not gds["usable"]:
        return "POSIX, pinned bounce buffers"
    return "cuFile (GPUDirect Storage) for files cuFile registers, POSIX for the others"


def cufile_note(gds: dict[str, Any], compat_mode: str) -> str:
    """Whether cuFile is usable and what ``compat_mode`` then does, for ``info``."""
    library = gds["library"]
    if gds["standin"] is not None:
        library = f"{library} (kvikpy's test stand-in, not NVIDIA's libcufile)"
    where = f"libcufile {gds['libcufile_version'] or '?'} at {library}" if library else ""
    if gds["usable"]:
        state = f"usable ({where})"
    else:
        state = f"not usable: {gds['reason']}" + (f" ({where})" if where else "")
    if compat_mode == "ON":
        return f"{state}; compat_mode=ON reads and writes through POSIX"
    if compat_mode == "OFF" and not gds["usable"]:
        return f"{state}; compat_mode=OFF fails to open files (kvikpy.CuFileError)"
    if not gds["usable"]:
        return f"{state}; so compat_mode={compat_mode} reads and writes through POSIX"
    return f"{state}; compat_mode={compat_mode} registers each file (CuFile.backend says)"


def cufile_rows(f: Any) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [("path", f.path), ("mode", f.mode)]
    if f.closed:
        rows.append(("state", "closed"))
    else:
        n = f.nbytes()
        rows += [("size", f"{human_bytes(n)} ({n:,} bytes)"), ("state", "open")]
    rows.append(("GPU I/O", backend(f)))
    return rows


def cufile_repr(f: Any) -> str:
    if f.closed:
        return f"<kvikpy.CuFile {f.path!r} mode={f.mode!r} closed>"
    return f"<kvikpy.CuFile {f.path!r} mode={f.mode!r} {human_bytes(f.nbytes())} open>"


def batch_rows(b: Any) -> list[tuple[str, Any]]:
    total = b.buffer.nbytes
    rows: list[tuple[str, Any]] = [
        ("elements", f"{len(b):,}"),
        ("size", f"{human_bytes(total)} ({total:,} bytes)"),
        ("device", b.buffer.device),
    ]
    if len(b):
        sizes = b.sizes
        rows.append(("element sizes", f"{human_bytes(sizes.min())} to {human_bytes(sizes.max())}"))
    failures = b.failures
    if failures:
        first = min(failures)
        rows.append(("failed", f"{len(failures)} (first: element {first}: {failures[first]})"))
    return rows


def batch_repr(b: Any) -> str:
    total = b.buffer.nbytes
    failed = f", {len(b.failures)} failed" if b.failures else ""
    return (
        f"<kvikpy.Batch of {len(b):,} elements, {human_bytes(total)} on {b.buffer.device}{failed}>"
    )


def future_rows(handle: Any) -> list[tuple[str, Any]]:
    """State, bytes moved and (once finished) the result or error of an ``IOFuture``,
    given the engine's handle behind it."""
    moved = handle.bytes_so_far
    if not handle.done():
        return [("state", "pending"), ("bytes so far", f"{human_bytes(moved)} ({moved:,} bytes)")]
    try:
        n = handle.get()
    except Exception as e:  # the operation's own error, shown rather than raised
        return [("state", "failed"), ("error", f"{type(e).__name__}: {e}")]
    return [("state", "done"), ("bytes", f"{human_bytes(n)} ({n:,} bytes)")]
