"""kvikio's ``kvikio.buffer``: cuFile's registration of GPU memory, and the bounce buffers
kvikpy keeps for transfers between files and GPU memory."""

from __future__ import annotations

import kvikpy._lib as _lib
from kvikpy._gds import memory_deregister, memory_register

__all__ = ["bounce_buffer_free", "memory_deregister", "memory_register"]


def bounce_buffer_free() -> int:
    """Free the idle bounce buffers kvikpy keeps (pinned ones for GPU transfers, aligned
    ones for O_DIRECT), as kvikio's ``bounce_buffer_free``.

    Returns
    -------
    int
        The bounce-buffer bytes freed, counted as kvikio counts them: each buffer as the
        ``bounce_buffer_size`` it was last used with. The memory released is a little
        more: kvikpy rounds each buffer up to whole 4 KiB pages, and pinned ones carry
        one more page so that O_DIRECT can move file bytes straight into them.

    Notes
    -----
    Buffers in use by running operations are kept, and return to the (now smaller) pool
    when those finish. After a GPU read or write of up to one buffer's worth with
    ``num_threads`` 1, the pool holds one buffer, so this returns ``bounce_buffer_size``
    as kvikio's does; larger transfers double-buffer, and each thread keeps up to two.
    """
    return int(_lib.bounce_buffer_free())
