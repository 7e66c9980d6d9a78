"""kvikpy's PEP 517 build backend: maturin's, behind a check that Rust is installed.

Building kvikpy from source (an sdist, a git checkout) compiles its Rust engine, so it
needs ``cargo``. Without it, maturin's own backend downloads a temporary Rust toolchain
(several hundred MB) into the build; on an offline machine that fails late and with an
unrelated-looking network error. This backend instead stops at once with a message
saying what to install, unless ``KVIKPY_BOOTSTRAP_RUST=1`` asks for maturin's download.
Every hook is maturin's; only the check is added.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

import maturin

_OPT_IN = "KVIKPY_BOOTSTRAP_RUST"

MESSAGE = f"""
error: building kvikpy from source needs Rust (cargo and rustc 1.85 or newer), and no
`cargo` was found on PATH.

Do one of these, then rerun the install:
  - install Rust with rustup (https://rustup.rs), your distribution's package
    (`apt install cargo`, `dnf install cargo`; check that `cargo --version` is 1.85 or
    newer) or conda (`conda install -c conda-forge rust`), and put `cargo` on PATH;
  - install a prebuilt wheel file instead (kvikpy is not on PyPI): one built by
    `make wheels` in a kvikpy checkout on a machine with Rust, for Linux x86_64 with
    glibc 2.28 or newer and Python 3.11+, e.g.
    `pip install ./kvikpy-*-manylinux_2_28_x86_64.whl`;
  - let the build download a temporary Rust toolchain (about 700 MB, needs network
    access): set {_OPT_IN}=1.
"""


def _check_rust() -> None:
    if shutil.which("cargo") is not None or os.environ.get(_OPT_IN) == "1":
        return
    sys.stderr.write(MESSAGE)
    sys.stderr.flush()
    raise SystemExit(1)


def get_requires_for_build_wheel(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    _check_rust()
    return maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(
    config_settings: Mapping[str, Any] | None = None,
) -> list[str]:
    _check_rust()
    return maturin.get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    _check_rust()
    return maturin.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    _check_rust()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    _check_rust()
    return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _check_rust()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _check_rust()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    _check_rust()
    return maturin.build_sdist(sdist_directory, config_settings)
