"""kvikio's page-cache utilities: ``get_page_cache_info`` counts a file's resident pages,
``drop_file_page_cache`` evicts them, ``drop_system_page_cache`` drops everything where
permitted, and the deprecated ``clear_page_cache`` warns and delegates.

Eviction is checked on a real filesystem: tmpfs keeps its pages whatever it is advised,
so the ``evictable_dir`` fixture looks for a folder where ``POSIX_FADV_DONTNEED`` works
(pytest's tmp_path, /var/tmp, the repository) and skips, saying so, where none does.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvikpy
from kvikpy.errors import FileTypeError, NegativeValueError

PAGE = os.sysconf("SC_PAGESIZE")
ROOT = Path(__file__).resolve().parent.parent
#: The folder this run imports kvikpy from.
KVIKPY_HOME = str(Path(kvikpy.__file__).resolve().parent.parent)


def read_whole(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass


def fadvise_evicts(folder: Path) -> bool:
    """Whether a file in ``folder`` leaves the page cache when advised to (os.posix_fadvise,
    not the code under test)."""
    probe = folder / "fadvise-probe.bin"
    try:
        probe.write_bytes(os.urandom(16 * PAGE))
        fd = os.open(probe, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        cached, _ = kvikpy.get_page_cache_info(probe)
        return cached == 0
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


@pytest.fixture
def evictable_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on a filesystem whose pages can be evicted; skips where none is found."""
    if fadvise_evicts(tmp_path):
        yield tmp_path
        return
    for parent in (Path("/var/tmp"), ROOT):
        try:
            folder = Path(tempfile.mkdtemp(prefix=".kvikpy-page-cache-", dir=parent))
        except OSError:
            continue
        try:
            if fadvise_evicts(folder):
                yield folder
                return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    pytest.skip(
        "no filesystem here evicts pages on POSIX_FADV_DONTNEED (tmp_path, /var/tmp and the "
        "repository are all tmpfs or similar), so eviction cannot be observed"
    )


def make_file(folder: Path, nbytes: int, name: str = "data.bin") -> Path:
    path = folder / name
    path.write_bytes(os.urandom(nbytes))
    return path


# --- counting --------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [1, PAGE - 1, PAGE, PAGE + 1, 10 * PAGE + 123])
def test_total_pages_are_the_file_size_in_whole_pages(tmp_path, nbytes):
    path = make_file(tmp_path, nbytes)
    read_whole(path)
    cached, total = kvikpy.get_page_cache_info(path)
    assert total == -(-nbytes // PAGE)
    assert 0 <= cached <= total


def test_ranges_count_the_pages_they_touch(tmp_path):
    path = make_file(tmp_path, 10 * PAGE + 10)
    info = kvikpy.get_page_cache_info
    assert info(path, 0, 1)[1] == 1
    assert info(path, PAGE - 1, 2)[1] == 2, "a range across a page boundary touches two pages"
    assert info(path, 3 * PAGE, 0)[1] == 8, "length 0 runs to the end of the file"
    assert info(path, 3 * PAGE + 5, 2 * PAGE)[1] == 3
    assert info(path, 0, 100 * PAGE)[1] == 11, "a range past the end stops there"
    assert info(path, 10 * PAGE + 10) == (0, 0), "a range at the end of the file is empty"
    assert info(path, 50 * PAGE) == (0, 0)


def test_an_empty_file_has_no_pages(tmp_path):
    path = make_file(tmp_path, 0)
    assert kvikpy.get_page_cache_info(path) == (0, 0)


def test_a_file_just_read_is_cached(tmp_path):
    path = make_file(tmp_path, 64 * PAGE)
    read_whole(path)
    assert kvikpy.get_page_cache_info(path) == (64, 64)


def test_every_kind_of_file_argument_gives_the_same_answer(tmp_path):
    path = make_file(tmp_path, 5 * PAGE)
    read_whole(path)
    expected = kvikpy.get_page_cache_info(path)
    assert expected == (5, 5)
    assert kvikpy.get_page_cache_info(str(path)) == expected
    assert kvikpy.get_page_cache_info(os.fsencode(path)) == expected
    with open(path, "rb") as fh:
        assert kvikpy.get_page_cache_info(fh.fileno()) == expected
        assert kvikpy.get_page_cache_info(fh) == expected
        assert fh.tell() == 0, "the file object's position is not used"
    with tempfile.NamedTemporaryFile(dir=tmp_path) as tmp:  # not an io.IOBase: has fileno()
        tmp.write(b"x" * (2 * PAGE))
        tmp.flush()
        assert kvikpy.get_page_cache_info(tmp)[1] == 2


def test_the_functions_are_where_kvikio_has_them():
    import kvikpy.cufile

    for name in (
        "get_page_cache_info",
        "drop_file_page_cache",
        "drop_system_page_cache",
        "clear_page_cache",
    ):
        assert getattr(kvikpy, name) is getattr(kvikpy.cufile, name)
        assert name in kvikpy.__all__


# --- dropping one file ------------------------------------------------------------------


def test_dropping_a_file_empties_its_cached_pages(evictable_dir):
    path = make_file(evictable_dir, 256 * PAGE)
    read_whole(path)
    assert kvikpy.get_page_cache_info(path) == (256, 256)
    kvikpy.drop_file_page_cache(path)
    assert kvikpy.get_page_cache_info(path) == (0, 256)


def test_dropping_through_a_descriptor_or_file_object(evictable_dir):
    path = make_file(evictable_dir, 32 * PAGE)
    for as_argument in (lambda fh: fh.fileno(), lambda fh: fh):
        read_whole(path)
        assert kvikpy.get_page_cache_info(path)[0] == 32
        with open(path, "rb") as fh:
            kvikpy.drop_file_page_cache(as_argument(fh))
        assert kvikpy.get_page_cache_info(path)[0] == 0


def test_dropping_a_range_keeps_the_rest(evictable_dir):
    """Only the range goes. The kernel caches a file in folios of up to 2 MiB and evicts
    only those wholly inside the range, so the range here is 2 MiB-aligned."""
    mib2 = 2 << 20
    pages = mib2 // PAGE
    path = make_file(evictable_dir, 8 * mib2)
    read_whole(path)
    kvikpy.drop_file_page_cache(path, offset=2 * mib2, length=4 * mib2)
    assert kvikpy.get_page_cache_info(path, 0, 2 * mib2) == (2 * pages, 2 * pages)
    assert kvikpy.get_page_cache_info(path, 2 * mib2, 4 * mib2) == (0, 4 * pages)
    assert kvikpy.get_page_cache_info(path, 6 * mib2) == (2 * pages, 2 * pages)
    assert kvikpy.get_page_cache_info(path) == (4 * pages, 8 * pages)


def test_sync_first_lets_freshly_written_pages_go(evictable_dir):
    """Pages just written are dirty, and the kernel does not evict dirty pages: the
    default ``sync_first=True`` writes them back first."""
    path = evictable_dir / "dirty.bin"
    with open(path, "wb") as fh:
        fh.write(os.urandom(128 * PAGE))
    assert kvikpy.get_page_cache_info(path)[0] == 128
    kvikpy.drop_file_page_cache(path)
    assert kvikpy.get_page_cache_info(path)[0] == 0


def test_dropping_works_on_a_file_kvikpy_wrote(evictable_dir):
    path = evictable_dir / "written.bin"
    with kvikpy.CuFile(path, "w") as f:
        f.write(bytearray(os.urandom(40 * PAGE)))
    kvikpy.drop_file_page_cache(path)
    assert kvikpy.get_page_cache_info(path) == (0, 40)


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("call", [kvikpy.get_page_cache_info, kvikpy.drop_file_page_cache])
def test_a_missing_file_is_file_not_found_and_runtime_error(tmp_path, call):
    missing = tmp_path / "missing.bin"
    with pytest.raises(FileNotFoundError, match=r"Unable to open file.*No such file") as info:
        call(missing)
    assert isinstance(info.value, RuntimeError), "kvikio's `except RuntimeError` catches it"
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == str(missing)
    with pytest.raises(RuntimeError, match="Unable to open file"):  # kvikio's own check
        call(missing)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError) as info:
        kvikpy.get_page_cache_info(tmp_path)
    assert isinstance(info.value, RuntimeError)


def test_a_closed_descriptor_is_an_os_error(tmp_path):
    path = make_file(tmp_path, PAGE)
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as info:
        kvikpy.get_page_cache_info(fd)
    assert info.value.errno == errno.EBADF
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("bad", [123.456, ["path_in_a_list"], None, io.BytesIO(b"x")])
def test_a_bad_file_argument_is_type_and_value_error(bad):
    """kvikio raises ValueError here; kvikpy's error is both ValueError and TypeError.
    (BytesIO has a fileno() that raises io.UnsupportedOperation, which passes through.)"""
    expected = io.UnsupportedOperation if isinstance(bad, io.BytesIO) else FileTypeError
    with pytest.raises(expected) as info:
        kvikpy.get_page_cache_info(bad)
    assert isinstance(info.value, ValueError)
    if expected is FileTypeError:
        assert isinstance(info.value, TypeError)
        assert type(bad).__name__ in str(info.value)


@pytest.mark.parametrize("argument", ["offset", "length"])
def test_negative_ranges_are_value_and_overflow_errors(tmp_path, argument):
    path = make_file(tmp_path, PAGE)
    for call in (kvikpy.get_page_cache_info, kvikpy.drop_file_page_cache):
        with pytest.raises(NegativeValueError, match="negative value") as info:
            call(path, **{argument: -1})
        assert isinstance(info.value, ValueError) and isinstance(info.value, OverflowError)
        assert argument in str(info.value)


# --- the whole system -------------------------------------------------------------------

UNPRIVILEGED = """
import warnings, kvikpy
assert kvikpy.drop_system_page_cache() is False
assert kvikpy.drop_system_page_cache(False, False) is False
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert kvikpy.clear_page_cache() is False
assert [w.category for w in caught] == [FutureWarning], caught
assert "drop_system_page_cache" in str(caught[0].message)
print("ok")
"""


def as_nobody() -> list[str] | None:
    """A command prefix that runs as the unprivileged user ``nobody``, where possible."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_without_permission_dropping_the_system_cache_returns_false():
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("needs root and setpriv to run a process as an unprivileged user")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", UNPRIVILEGED],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        # This run's kvikpy first, so the child imports the same build (an installed
        # wheel on the GPU machine, not a source tree that happens to be on sys.path).
        env={**os.environ, "PYTHONPATH": os.pathsep.join([KVIKPY_HOME, *sys.path])},
    )
    if done.returncode != 0 and "Permission denied" in done.stderr and "import" in done.stderr:
        pytest.skip(f"user nobody cannot import this build of kvikpy: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_with_permission_dropping_the_system_cache_drops_it(evictable_dir):
    if not (os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)):
        pytest.skip("needs write access to /proc/sys/vm/drop_caches (root, not in a container)")
    path = make_file(evictable_dir, 64 * PAGE)
    read_whole(path)
    assert kvikpy.get_page_cache_info(path)[0] == 64
    assert kvikpy.drop_system_page_cache(reclaim_dentries_and_inodes=False) is True
    assert kvikpy.get_page_cache_info(path)[0] == 0


def test_clear_page_cache_is_deprecated_in_kvikio_s_words():
    doc = kvikpy.clear_page_cache.__doc__ or ""
    assert doc.startswith(".. deprecated::")
    assert "drop_system_page_cache" in doc
    assert kvikpy.clear_page_cache.__name__ == "clear_page_cache"
