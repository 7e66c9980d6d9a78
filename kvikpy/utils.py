"""kvikio's small helpers, under the same names (``kvikio.utils``): run a function once,
mark functions and modules deprecated (a ``FutureWarning`` when used, a note in the
docstring), and a local HTTP server with range support for tests and examples."""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from kvikpy._http_server import LocalHttpServer

__all__ = [
    "LocalHttpServer",
    "call_once",
    "kvikio_deprecate_module",
    "kvikio_deprecation_notice",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def call_once(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate ``func`` so that only its first call runs it; every later call returns
    that first call's result, whatever its arguments (kvikio's ``call_once``).

    Parameters
    ----------
    func
        The function to run once.

    Returns
    -------
    Callable
        The decorated function. Concurrent first calls run ``func`` once: the others wait
        for its result. If the first call raises, the next call runs ``func`` again.

    Examples
    --------
    >>> from kvikpy.utils import call_once
    >>> @call_once
    ... def setup():
    ...     print("setting up")
    ...     return 42
    >>> setup(), setup()
    setting up
    (42, 42)
    """
    lock = threading.Lock()
    done = False
    result: _R | None = None

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        nonlocal done, result
        with lock:
            if not done:
                result = func(*args, **kwargs)
                done = True
        return result  # type: ignore[return-value]  # set by the one call that ran

    return wrapper


def kvikio_deprecation_notice(
    msg: str = "This function is deprecated.", *, since: str
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A decorator that marks a function deprecated: each call warns ``msg`` as a
    ``FutureWarning`` (pointing at the caller), and the docstring starts with
    ``.. deprecated:: <since> <msg>``, as kvikio's decorator writes it.

    Parameters
    ----------
    msg
        The notice: what to use instead.
    since
        The version that deprecated the function.

    Returns
    -------
    Callable
        The decorator.

    Examples
    --------
    >>> from kvikpy.utils import kvikio_deprecation_notice
    >>> @kvikio_deprecation_notice("Use new() instead.", since="1.2")
    ... def old():
    ...     return 1
    """

    def decorate(func: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            warnings.warn(msg, FutureWarning, stacklevel=2)
            return func(*args, **kwargs)

        wrapper.__doc__ = f".. deprecated:: {since} {msg}\n\n{func.__doc__ or ''}"
        return wrapper

    return decorate


def kvikio_deprecate_module(msg: str = "", *, since: str) -> None:
    """Warn that the calling module is deprecated: a ``FutureWarning`` saying
    ``This module is deprecated since <since>. <msg>``, pointing at the code that
    imported it. Call it at the top level of the deprecated module.

    Parameters
    ----------
    msg
        The notice: what to use instead.
    since
        The version that deprecated the module.
    """
    warnings.warn(f"This module is deprecated since {since}. {msg}", FutureWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    # The HTTP server pulls in http.server and multiprocessing: loaded on first use, so
    # that `import kvikpy` (which imports this module) stays cheap.
    if name == "LocalHttpServer":
        from kvikpy._http_server import LocalHttpServer

        return LocalHttpServer
    raise AttributeError(f"module 'kvikpy.utils' has no attribute {name!r}")
