"""Untrusted input: malformed safetensors headers are a ValueError naming the file (never
another exception type, a hang or a huge allocation), and a zarr GDSStore refuses keys
that would reach outside its root."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy.safetensors as kst

# --- safetensors -------------------------------------------------------------------------

GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def write_raw(path: Path, text: bytes, data: bytes = b"\x01" * 8) -> Path:
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def write_header(path: Path, header: object, data: bytes = b"\x01" * 8) -> Path:
    return write_raw(path, json.dumps(header).encode(), data)


def refused(path: Path, match: str) -> None:
    """Both the header reader and the numpy loader refuse ``path`` with a ValueError that
    names it (and matches ``match``), and the file is left as it was."""
    before = path.read_bytes()
    for call in (
        lambda: kst.read_header(path),
        lambda: kst.load_file(path, device="cpu", framework="numpy"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert str(path) in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("shape", 2, "invalid shape 2"),
        ("shape", None, "invalid shape None"),
        ("shape", [True, True], "invalid shape"),
        ("shape", [2.0], "invalid shape"),
        ("shape", ["2"], "invalid shape"),
        ("shape", [2**63], "invalid shape"),
        ("shape", [1] * 65, "invalid shape"),
        ("dtype", ["F32"], "unknown dtype"),
        ("dtype", None, "unknown dtype"),
        ("data_offsets", ["0", "8"], "invalid data_offsets"),
        ("data_offsets", [0.0, 8.0], "invalid data_offsets"),
        ("data_offsets", [False, True], "invalid data_offsets"),
        ("data_offsets", [0, 8, 9], "invalid data_offsets"),
        ("data_offsets", 8, "invalid data_offsets"),
        ("data_offsets", {"0": 8}, "invalid data_offsets"),
        ("data_offsets", [8, 0], "claims bytes"),
        ("data_offsets", [-8, 0], "claims bytes"),
    ],
)
def test_each_field_of_the_wrong_type_is_a_value_error(
    tmp_path: Path, field: str, value: object, match: str
) -> None:
    refused(write_header(tmp_path / "f.safetensors", {"t": {**GOOD, field: value}}), match)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        # duplicate tensor names: json would keep the last one
        (
            b'{"t": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},'
            b' "t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}',
            "key 't' twice",
        ),
        # a duplicate field inside a tensor
        (
            b'{"t": {"dtype": "U8", "dtype": "F32", "shape": [8], "data_offsets": [0, 8]}}',
            "key 'dtype' twice",
        ),
        (b'{"__metadata__": [1, 2]}', "__metadata__ must be an object of strings"),
        (b'{"__metadata__": "x"}', "__metadata__ must be an object of strings"),
        (b'{"__metadata__": {"a": 1}}', "__metadata__ must be an object of strings"),
        (b'{"__metadata__": {"a": {"b": "c"}}}', "__metadata__ must be an object of strings"),
        (b'{"t": [1]}', "must be an object"),
        (b'{"t": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests arrays or objects"),
        (b"[" * 100_000, "does not start with"),
        (b'{"t": ' + b"[" * 100_000, "nests arrays or objects"),
        (b'{"t": 1' + b"0" * 5000 + b"}", "not valid JSON"),  # int too long to convert
        (b'{"t": NaN}', "must be an object"),
        (b"{", "not valid JSON"),
        (b" {}", "does not start with"),
        # a lone surrogate escape: no character (the reference implementation refuses it)
        (b'{"\\ud800": 1}', "Lone surrogate"),
    ],
)
def test_malformed_json_is_a_value_error(tmp_path: Path, text: bytes, match: str) -> None:
    refused(write_raw(tmp_path / "j.safetensors", text), match)


@pytest.mark.parametrize(
    ("tensors", "size", "match"),
    [
        # a hole between two tensors
        ({"a": [0, 4], "b": [6, 10]}, 10, "hole"),
        # data that does not start at 0
        ({"a": [2, 10]}, 10, "hole"),
        # overlap, and the same bytes twice
        ({"a": [0, 6], "b": [4, 10]}, 10, "overlap"),
        ({"a": [0, 10], "b": [0, 10]}, 10, "overlap"),
        # bytes after the last tensor
        ({"a": [0, 8]}, 10, "end at byte 8 of a 10-byte"),
        # past the end of the file
        ({"a": [0, 12]}, 10, "claims bytes"),
    ],
)
def test_offsets_cover_the_data_section_exactly(
    tmp_path: Path, tensors: dict[str, list[int]], size: int, match: str
) -> None:
    header = {
        k: {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}
        for k, (begin, end) in tensors.items()
    }
    refused(write_header(tmp_path / "o.safetensors", header, b"\x02" * size), match)


def test_nesting_is_bounded_before_parsing(tmp_path: Path) -> None:
    """64 levels (in a field the loader ignores) are parsed; 65 are refused before json
    sees them, brackets inside strings (escaped quotes too) not counted."""
    tricky = '"\\\\", "\\"[[[[", "]]]]"'  # an escaped backslash, an escaped quote
    for depth, ok in ((62, True), (63, False)):  # + the header and the tensor objects
        extra = "[" * depth + tricky + "]" * depth
        text = (
            '{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": ' + extra + "}}"
        ).encode()
        p = write_raw(tmp_path / f"n{depth}.safetensors", text)
        if ok:
            assert list(kst.read_header(p)[1]) == ["t"]
        else:
            refused(p, "more than 64 deep")


def test_deep_nesting_under_a_raised_recursion_limit_is_not_a_crash(tmp_path: Path) -> None:
    """json's C parser would overflow the C stack (a segfault) on 10**7 levels under a
    raised recursion limit; the header is refused before it is parsed."""
    p = write_raw(tmp_path / "deep.safetensors", b'{"t": ' + b"[" * 10**7 + b"]" * 10**7 + b"}")
    code = (
        "import sys, kvikpy.safetensors as kst; sys.setrecursionlimit(10**8)\n"
        f"try: kst.read_header({str(p)!r})\n"
        "except ValueError as e: print('ValueError', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ValueError") and "more than 64 deep" in done.stdout


def json_depth(v: object) -> int:
    if isinstance(v, list):
        return 1 + max(map(json_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(json_depth, v.values()), default=0)
    return 0


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    value=st.recursive(
        st.none() | st.integers() | st.text(alphabet='[]{}"\\ ab\u00e9\u20ac', max_size=6),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), inner, max_size=3)
        ),
        max_leaves=20,
    ),
    ascii_only=st.booleans(),
)
def test_nesting_scan_is_exact(tmp_path: Path, value: object, ascii_only: bool) -> None:
    """Nested to exactly 64 levels (the header, the tensor, and ``value`` wrapped in
    arrays in a field the loader ignores) a header is read; one level more is refused:
    brackets inside strings, escaped quotes and backslashes do not count."""
    inner = json.dumps(value, ensure_ascii=ascii_only)
    for extra, ok in ((0, True), (1, False)):
        wraps = 62 - json_depth(value) + extra
        field = "[" * wraps + inner + "]" * wraps
        text = '{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": ' + field + "}}"
        p = write_raw(tmp_path / "s.safetensors", text.encode())
        if ok:
            assert list(kst.read_header(p)[1]) == ["t"]
        else:
            refused(p, "more than 64 deep")


def test_huge_shapes_are_refused_quickly(tmp_path: Path) -> None:
    """A shape whose product has millions of digits is refused without computing it."""
    header = {"t": {"dtype": "F64", "shape": [2**62] * 64, "data_offsets": [0, 8]}}
    refused(write_header(tmp_path / "h.safetensors", header), "needs more bytes")
    text = (
        b'{"t": {"dtype": "U8", "shape": ['
        + b",".join([b"3"] * 2_000_000)
        + b'], "data_offsets": [0, 8]}}'
    )
    refused(write_raw(tmp_path / "h2.safetensors", text), "invalid shape")


def test_header_lengths_are_checked_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "l.safetensors"
    p.write_bytes(struct.pack("<Q", 2**64 - 1) + b"{}")
    refused(p, "more than the format's limit")
    p.write_bytes(struct.pack("<Q", 100_000_000) + b"{}")
    refused(p, "but the file has 10")
    p.write_bytes(b"\x00" * 7)
    refused(p, "only 7 bytes")


def test_valid_edge_cases_still_load(tmp_path: Path) -> None:
    header = {
        "__metadata__": None,  # null metadata: none, as the reference implementation reads it
        "e": {"dtype": "I32", "shape": [0, 3], "data_offsets": [0, 0]},
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3], "extra": [1, {"x": 2}]},
        "b": {"dtype": "I16", "shape": [], "data_offsets": [3, 5]},
        "z": {"dtype": "U8", "shape": [0], "data_offsets": [5, 5]},
    }
    p = write_header(tmp_path / "ok.safetensors", header, b"\x01\x02\x03\x04\x00")
    start, tensors, metadata = kst.read_header(p)
    assert start == 8 + len(json.dumps(header)) and metadata == {}
    assert set(tensors) == {"e", "a", "b", "z"}
    got = kst.load_file(p, device="cpu", framework="numpy")
    assert got["a"].tolist() == [1, 2, 3] and int(got["b"]) == 4 and got["e"].shape == (0, 3)
    empty = write_header(tmp_path / "empty.safetensors", {"__metadata__": {"k": "v"}}, b"")
    assert kst.read_header(empty)[1:] == ({}, {"k": "v"})
    assert kst.load_file(empty, device="cpu", framework="numpy") == {}


def test_the_torch_loader_validates_as_the_numpy_one(tmp_path: Path) -> None:
    """``framework="torch"`` (one file, shards, a filter) reads headers through the same
    validation: a malformed one is a ValueError naming the file, before any read."""
    pytest.importorskip("torch")
    bad = write_header(tmp_path / "bad.safetensors", {"t": {**GOOD, "shape": None}})
    good = write_header(tmp_path / "good.safetensors", {"u": GOOD})
    for call in (
        lambda: kst.load_file(bad, device="cpu"),
        lambda: kst.load_files([good, bad], device="cpu"),
        lambda: kst.load_file([good, bad], device="cpu", tensor_filter=lambda n: n == "u"),
    ):
        with pytest.raises(ValueError, match="invalid shape None") as info:
            call()
        assert str(bad) in str(info.value)
    assert (
        kst.load_file(good, device="cpu")["u"].tolist()
        == [np.frombuffer(b"\x01" * 4, np.float32)[0]] * 2
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["F32", "U8", "BF16", "BOOL"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
small_ints = st.integers(min_value=-2, max_value=12)
# Each field: mostly a plausible value, else any JSON value.
dtypes = st.sampled_from(["F32", "U8", "I16", "BF16", "X"]) | json_values
shapes = st.lists(small_ints, max_size=3) | json_values
offsets = st.lists(small_ints, min_size=2, max_size=2) | json_values
tensor_entries = st.fixed_dictionaries(
    {"dtype": dtypes, "shape": shapes, "data_offsets": offsets}
) | st.fixed_dictionaries({}, optional={"dtype": dtypes, "shape": shapes, "data_offsets": offsets})
headers = (
    st.dictionaries(
        st.text(max_size=3) | st.just("__metadata__"), tensor_entries | json_values, max_size=4
    )
    | json_values
)


def check_file(path: Path) -> None:
    """Reading ``path`` either works or is a ValueError naming it, by both loaders."""
    for call in (
        lambda: kst.read_header(path),
        lambda: kst.load_file(path, device="cpu", framework="numpy"),
    ):
        try:
            call()
        except ValueError as e:
            assert str(path) in str(e), e


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=headers, data=st.binary(max_size=24))
def test_random_headers_only_ever_raise_value_errors(header: Any, data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        check_file(write_header(Path(d) / "r.safetensors", header, data))


@settings(max_examples=200, deadline=None)
@given(
    cut=st.integers(min_value=0, max_value=400),
    length=st.integers(min_value=0, max_value=2**64 - 1) | st.integers(0, 300),
    noise=st.binary(max_size=300),
)
def test_truncated_and_random_files_only_ever_raise_value_errors(
    cut: int, length: int, noise: bytes
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.safetensors"
        header = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}
        text = json.dumps(header).encode()
        whole = struct.pack("<Q", len(text)) + text + np.arange(3, dtype=np.float32).tobytes()
        p.write_bytes(whole[:cut])  # a valid file cut anywhere
        check_file(p)
        p.write_bytes(struct.pack("<Q", length) + noise)  # any length, any bytes
        check_file(p)
        p.write_bytes(struct.pack("<Q", len(noise)) + noise)  # a right length, any bytes
        check_file(p)


# --- zarr: keys outside the store's root --------------------------------------------------

zarr = pytest.importorskip("zarr", minversion="3.0.8")

from zarr.core.buffer import cpu, default_buffer_prototype  # noqa: E402

from kvikpy.zarr import GDSStore  # noqa: E402

SECRET = b"outside the root"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``tmp_path/root`` (the store, with one real key ``a/k``) beside
    ``tmp_path/outside`` (a directory holding ``secret``), and links inside the root:
    ``dirlink`` to the outside directory, ``filelink`` to the secret file, ``inlink`` to
    the root's own ``a``."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    (root / "a" / "k").write_bytes(b"inside")
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    os.symlink(outside, root / "dirlink")
    os.symlink(outside / "secret", root / "filelink")
    os.symlink(root / "a", root / "inlink")
    return root, outside


def outside_state(tmp_path: Path) -> dict[str, bytes]:
    out = tmp_path / "outside"
    found = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in out.rglob("*")}
    found.update({p.name: b"" for p in tmp_path.iterdir() if p.name not in ("root", "outside")})
    return found


def operations(store: GDSStore, key: str) -> dict[str, Any]:
    """Every store operation that takes a key or prefix, on ``key``, as coroutines."""
    proto = default_buffer_prototype()
    value = cpu.Buffer.from_bytes(b"written")

    async def collect(it: Any) -> list[str]:
        return [k async for k in it]

    async def sync(f: Any, *args: Any, **kwargs: Any) -> Any:
        return f(*args, **kwargs)

    return {
        "get": lambda: store.get(key, proto),
        "get_sync": lambda: sync(store.get_sync, key, prototype=proto),
        "get_partial_values": lambda: store.get_partial_values(proto, [(key, None)]),
        "set": lambda: store.set(key, value),
        "set_sync": lambda: sync(store.set_sync, key, value),
        "set_if_not_exists": lambda: store.set_if_not_exists(key, value),
        "delete": lambda: store.delete(key),
        "delete_sync": lambda: sync(store.delete_sync, key),
        "delete_dir": lambda: store.delete_dir(key),
        "exists": lambda: store.exists(key),
        "getsize": lambda: store.getsize(key),
        "list_prefix": lambda: collect(store.list_prefix(key)),
        "list_dir": lambda: collect(store.list_dir(key)),
    }


OPS = list(operations(GDSStore("."), "x"))
HOSTILE = [
    "../outside/secret",
    "a/../../outside/secret",
    "../outside",
    "..",
    "a/..",
    "../outside/new",
    "a/../../outside/new",
    "/ABS/outside/secret",  # /ABS: the absolute path of tmp_path
    "/ABS/outside",
    "a/k\x00x",
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("key", HOSTILE)
async def test_keys_outside_the_root_are_refused(
    layout: tuple[Path, Path], op: str, key: str
) -> None:
    root, _ = layout
    key = key.replace("/ABS", str(root.parent))
    for follow in (False, True):  # refused whether links are followed or not
        store = GDSStore(root, follow_symlinks=follow)
        before = outside_state(root.parent)
        with pytest.raises(ValueError, match="GDSStore refuses key") as info:
            await operations(store, key)[op]()
        assert repr(key) in str(info.value) and repr(str(root)) in str(info.value)
        assert outside_state(root.parent) == before
        assert (root / "a" / "k").read_bytes() == b"inside"


LINKED = ["dirlink/secret", "filelink", "dirlink", "dirlink/new", "inlink/k", "inlink"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("key", LINKED)
async def test_symlinks_inside_the_root_are_refused_by_default(
    layout: tuple[Path, Path], op: str, key: str
) -> None:
    root, _ = layout
    before = outside_state(root.parent)
    with pytest.raises(ValueError, match=r"symbolic link.*follow_symlinks=True"):
        await operations(GDSStore(root), key)[op]()
    assert outside_state(root.parent) == before


async def test_listing_skips_symlinks_by_default(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    store = GDSStore(root)
    assert [k async for k in store.list()] == ["a/k"]
    assert [k async for k in store.list_prefix("")] == ["a/k"]
    assert [k async for k in store.list_dir("")] == ["a"]
    assert [k async for k in store.list_prefix("a/")] == ["a/k"]
    assert await store.exists("a/k") and await store.getsize("a/k") == 6


async def test_follow_symlinks_true_follows_them(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    store = GDSStore(root, follow_symlinks=True)
    proto = default_buffer_prototype()
    got = await store.get("dirlink/secret", proto)
    assert got is not None and got.to_bytes() == SECRET
    got = await store.get("filelink", proto)
    assert got is not None and got.to_bytes() == SECRET
    assert await store.getsize("inlink/k") == 6
    # listing, as LocalStore's: linked files listed, linked directories not descended
    assert sorted([k async for k in store.list()]) == ["a/k", "filelink"]
    assert sorted([k async for k in store.list_dir("")]) == ["a", "dirlink", "filelink", "inlink"]
    await store.set("dirlink/new", cpu.Buffer.from_bytes(b"n"))
    assert (outside / "new").read_bytes() == b"n"


async def test_allowed_key_forms_stay_inside(layout: tuple[Path, Path]) -> None:
    """Empty segments, ``.`` and backslashes are file names inside the root."""
    root, _ = layout
    store = GDSStore(root)
    proto = default_buffer_prototype()
    for key in ("a//k", "./a/k", "a/./k"):
        got = await store.get(key, proto)
        assert got is not None and got.to_bytes() == b"inside", key
    await store.set("b\\..\\..\\x", cpu.Buffer.from_bytes(b"z"))
    assert (root / "b\\..\\..\\x").read_bytes() == b"z"
    assert await store.get("..x", proto) is None  # '..x' is a name, not '..'


def test_follow_symlinks_is_kept_and_checked(tmp_path: Path) -> None:
    import pickle

    store = GDSStore(tmp_path, follow_symlinks=True)
    assert store.with_read_only(True).follow_symlinks
    again = pickle.loads(pickle.dumps(store))
    assert again == store and again.follow_symlinks
    assert store != GDSStore(tmp_path)
    assert repr(store).endswith("follow_symlinks=True)")
    opened = asyncio.run(GDSStore.open(tmp_path, follow_symlinks=True))
    assert opened.follow_symlinks
    with pytest.raises(TypeError, match="follow_symlinks must be True or False"):
        GDSStore(tmp_path, follow_symlinks=1)  # type: ignore[arg-type]
