"""kvikpy._devices: the one parser and resolver of ``device=`` and ``--device`` values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvikpy
from kvikpy import _devices


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:0", 0), ("cuda:12", 12), (3, 3), (-1, -1)],
)
def test_parse_spellings(value: str | int, parsed: str | int) -> None:
    assert _devices.parse(value) == parsed


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cpu:0", "", "0"])
def test_parse_refuses_other_strings(value: str) -> None:
    with pytest.raises(ValueError, match=r"device must be 'cuda', 'cuda:N', an int or 'cpu'"):
        _devices.parse(value)


@pytest.mark.parametrize("value", [True, False])
def test_parse_refuses_bools(value: bool) -> None:
    with pytest.raises(TypeError, match="not a bool"):
        _devices.parse(value)


@given(st.integers(min_value=0, max_value=10**6))
def test_labels_parse_back(ordinal: int) -> None:
    assert _devices.parse(_devices.label(ordinal)) == ordinal
    assert _devices.label(None) == "cpu"


def test_cpu_never_asks_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvikpy import _lib

    def no_cuda() -> bool:
        raise AssertionError("cpu asked whether CUDA is available")

    monkeypatch.setattr(_lib, "cuda_available", no_cuda)
    assert _devices.resolve("cpu") is None
    assert _devices.resolve_option("cpu") == ("cpu", None)


@pytest.mark.skipif(kvikpy.cuda_available(), reason="checks the errors of a machine without CUDA")
@pytest.mark.parametrize("value", ["cuda", "cuda:0", 0, -1])
def test_gpu_without_cuda_is_worded_for_the_caller(value: str | int) -> None:
    """-1 is an ordinal like any int, not host memory: only 'cpu' means the host."""
    with pytest.raises(kvikpy.CudaUnavailableError, match=r"use device='cpu' to read"):
        _devices.resolve(value)
    if isinstance(value, str):
        with pytest.raises(kvikpy.CudaUnavailableError, match=r"--device .*use --device cpu"):
            _devices.resolve_option(value)


@pytest.mark.skipif(kvikpy.cuda_available(), reason="checks auto on a machine without CUDA")
def test_auto_falls_back_to_cpu_without_cuda() -> None:
    assert _devices.resolve_option("auto") == ("cpu", None)


@pytest.mark.parametrize("text", ["auto", "cpu", "cuda", "cuda:0", "cuda:7"])
def test_check_option_accepts_the_cli_spellings(text: str) -> None:
    assert _devices.check_option(text) == text


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "0", "Auto"])
def test_check_option_refuses_others(text: str) -> None:
    with pytest.raises(ValueError, match="expected auto, cpu, cuda or cuda:N"):
        _devices.check_option(text)
