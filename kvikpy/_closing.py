"""``with obj:`` for kvikpy's objects that hold a file or a server: the object itself on
the way in, ``obj.close()`` on the way out (their ``close`` is idempotent)."""

from __future__ import annotations

from typing import Self


class ClosedOnExit:
    """Mixin: a context manager that closes the object when the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
