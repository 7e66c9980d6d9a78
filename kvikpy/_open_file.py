"""What the file classes over one engine file handle share (:class:`kvikpy.CuFile`,
:class:`kvikpy.RemoteFile`): closing it, and whether it is closed."""

from __future__ import annotations

import kvikpy._lib as _lib
from kvikpy._closing import ClosedOnExit


class OpenFile(ClosedOnExit):
    """Mixin: a file read (and written) through the engine's handle ``_handle``."""

    _handle: _lib.FileHandle

    def close(self) -> None:
        """Close the file. Idempotent; operations still running finish first."""
        self._handle.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._handle.closed
