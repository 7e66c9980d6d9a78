# The single source of every command humans and CI run.
#
#   make demo   a small environment (.venv-demo: numpy and maturin only), build kvikpy
#               into it, and time a read against numpy.fromfile
#   make test   install everything, then every lint, the Rust tests, the stub check,
#               the type check, the release wheel and sdist with their checks, the whole
#               pytest suite (notebooks included) and the documentation site in strict
#               mode with its reference check
#   make wheels the release wheel (manylinux_2_28, linked through zig) and the sdist into
#               dist/, in a small environment of their own (.venv-release: numpy, maturin,
#               zig, auditwheel), checked by tests/check_dist.py (auditwheel, licence,
#               the wheel installed into a temporary folder and imported from there)
#   make bench-engine   criterion benchmarks of the engine's host path (no GPU; not in `test`)
#
# GPU machine (no Rust there): `make gpu-wheel` here builds the wheel (and the cuFile
# stand-in, `make cufile-standin`) into .gpu/, which is carried to the GPU machine, where
# `make gpu-test` installs the wheel and runs the suite.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements-dev.txt | cksum | cut -d' ' -f1)
CARGO  ?= cargo

export JUPYTER_PLATFORM_DIRS := 1
export PYTHONDONTWRITEBYTECODE := 1
# kvikpy's build backend (build_backend/kvikpy_build.py) is maturin's behind a check that
# cargo is installed: maturin's warning that the backend is not maturin does not apply.
export MATURIN_NO_MISSING_BUILD_BACKEND_WARNING := 1
# `maturin develop` installs kvikpy's dependencies with pip, which would print one
# "Ignoring ...: markers 'extra == ...'" line per optional dependency.
MATURIN_DEVELOP = PIP_QUIET=1 VIRTUAL_ENV=$(CURDIR)/$(1) $(1)/bin/maturin develop --release --quiet

.PHONY: demo test docs lint fmt develop rust-test stubtest typecheck py-test wheel wheels \
        gpu-wheel gpu-test gpu-bench gpu-bench-wheels gpu-bench-regimes gpu-notebooks nb-wheels clean check-rust \
        notebooks bench-engine kvikio-tests-fetch kvikio-tests gpu-kvikio-tests cufile-standin \
        zarr-wheels dask-wheels remote-wheels streamer-wheels peer-wheels

# The demo needs only numpy and a build of kvikpy: its own small environment, with the
# same pinned numpy and maturin as the development one.
DEMO_VENV  := .venv-demo
DEMO_REQS  := $(shell grep -E '^(numpy|maturin)==' requirements-dev.txt)
DEMO_STAMP := $(DEMO_VENV)/.installed-$(shell echo $(DEMO_REQS) | cksum | cut -d' ' -f1)

$(DEMO_STAMP): requirements-dev.txt
	rm -rf $(DEMO_VENV)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --disable-pip-version-check $(DEMO_REQS)
	touch $@

demo: $(DEMO_STAMP) check-rust
	$(call MATURIN_DEVELOP,$(DEMO_VENV))
	$(DEMO_VENV)/bin/python benchmarks/demo.py

test: lint rust-test develop stubtest typecheck wheels py-test docs
	@echo "make test: all checks passed"

check-rust:
	@command -v $(CARGO) >/dev/null || { echo "error: cargo not found; install Rust (https://rustup.rs) and rerun" >&2; exit 1; }

$(STAMP): requirements-dev.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

develop: $(STAMP) check-rust
	$(call MATURIN_DEVELOP,$(VENV))
	$(BIN)/python -c "import kvikpy; print('kvikpy', kvikpy.__version__, 'built')"

lint: $(STAMP) check-rust
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --quiet -- -D warnings
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(CARGO) fmt --all
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

rust-test: check-rust
	$(CARGO) test --workspace --quiet

bench-engine: check-rust
	$(CARGO) bench -p kvikpy-core --bench host_path --bench residency_probe

stubtest: develop
	$(BIN)/python -m mypy.stubtest kvikpy._lib

typecheck: develop
	$(BIN)/python -m mypy kvikpy

# The stand-in's tests (tests/test_cufile_standin.py) load the library just built;
# tests/test_packaging.py checks the distributions in dist/ (`make test` builds them first
# with `make wheels`; run alone, py-test skips those checks when dist/ has none).
py-test: develop cufile-standin
	KVIKPY_CUFILE_STANDIN=$(CURDIR)/.gpu/libcufile_standin.so KVIKPY_DIST_DIR=$(CURDIR)/dist \
		KVIKPY_WHEEL_COMPAT=$(WHEEL_COMPAT) $(BIN)/python -m pytest

# kvikpy's test stand-in for libcufile (rust/cufile-standin; never part of a wheel: maturin
# builds rust/python only), built in release mode and copied to .gpu/, which travels to the
# GPU machine. Loaded only when asked for: KVIKPY_CUFILE_LIBRARY=.gpu/libcufile_standin.so.
CARGO_TARGET = $(shell $(CARGO) metadata --no-deps --format-version 1 | \
	$(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cufile-standin: check-rust
	$(CARGO) build --release --quiet -p kvikpy-cufile-standin
	mkdir -p .gpu && cp $(CARGO_TARGET)/release/libcufile_standin.so .gpu/libcufile_standin.so

# The documentation site (mkdocs.yml) in strict mode: a broken link, a missing page or an
# unresolved API reference fails the build. Output in site/ (git-ignored). Then the
# rendered API reference is checked (every parameter in its own row, read()'s defaults),
# and the pages' wording (no development-log talk; every page in docs/index.md and the nav).
docs: develop
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	KVIKPY_SITE_DIR=$(CURDIR)/site $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_docs_reference.py tests/test_docs_wording.py

# Release artefacts in dist/: a wheel for manylinux_2_28 (glibc 2.28+: RHEL/Rocky 8,
# Ubuntu 20.04, Amazon Linux 2023...), linked through zig against glibc 2.28's symbols
# whatever this machine's glibc is, and the sdist. A release build needs only Rust and
# its own small environment, .venv-release (numpy, maturin, zig and auditwheel, pinned as
# in requirements-dev.txt), not the development one. tests/check_dist.py then runs
# `auditwheel show` (fails above manylinux_2_28), checks the licence and metadata in both,
# and installs the wheel into a temporary folder and imports it from there (never the
# checkout's kvikpy/). `make test` checks dist/ again with tests/test_packaging.py.
# maturin finds zig through `python -m ziglang`, hence the venv first on PATH.
# aarch64: `make wheels WHEEL_TARGET=aarch64-unknown-linux-gnu` cross-links through the same
# zig, once Rust's standard library for that target is installed
# (`rustup target add aarch64-unknown-linux-gnu`); CI builds x86_64 only.
REL_VENV  := .venv-release
REL_REQS  := $(shell grep -E '^(numpy|maturin|ziglang|auditwheel)==' requirements-dev.txt)
REL_STAMP := $(REL_VENV)/.installed-$(shell echo $(REL_REQS) | cksum | cut -d' ' -f1)

$(REL_STAMP): requirements-dev.txt
	rm -rf $(REL_VENV)
	$(PYTHON) -m venv $(REL_VENV)
	$(REL_VENV)/bin/python -m pip install -q --disable-pip-version-check $(REL_REQS)
	touch $@

WHEEL_COMPAT := manylinux_2_28
WHEEL_TARGET ?=
ZIG_BUILD = PATH=$(CURDIR)/$(REL_VENV)/bin:$$PATH $(REL_VENV)/bin/maturin build --release --zig \
	--compatibility $(WHEEL_COMPAT) $(if $(WHEEL_TARGET),--target $(WHEEL_TARGET))
wheels: $(REL_STAMP) check-rust
	rm -rf dist && mkdir -p dist
	$(ZIG_BUILD) --quiet --out dist
	$(REL_VENV)/bin/maturin sdist --out dist
	KVIKPY_WHEEL_COMPAT=$(WHEEL_COMPAT) $(REL_VENV)/bin/python tests/check_dist.py dist

wheel: wheels

# Build here, run on the GPU machine: the wheel (the same manylinux_2_28 build as
# `make wheels`) and the test requirements travel in .gpu/.
# The cuFile stand-in goes beside the wheel (`make gpu-test` installs only the *.whl).
gpu-wheel: $(REL_STAMP) check-rust
	rm -rf .gpu && mkdir -p .gpu
	$(ZIG_BUILD) --quiet --out .gpu
	$(MAKE) --no-print-directory cufile-standin

# On the GPU machine (Python 3.12, torch/cupy/pytest/hypothesis preinstalled, no Rust):
# install the carried wheel outside the source tree, run the suite against it, and write
# the summary to $(REPORT) (set REPORT to a file you copy back from the GPU machine, then
# copy it to docs/gpu-test-report.md here).
REPORT ?= docs/gpu-test-report.md
# Carried wheels go outside the source tree, so the tests import the built package.
GPU_INSTALL = python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
	--target /tmp/kvikpy-site
gpu-test:
	$(GPU_INSTALL) .gpu/*.whl $(wildcard .whl/nanoarrow-*.whl) $(wildcard .whl/pytest_timeout-*.whl) \
		$(wildcard .nbwhl/*.whl) \
		$(wildcard .zwhl/*.whl) $(wildcard .dwhl/*.whl)
	PYTHONPATH=/tmp/kvikpy-site PYTHONSAFEPATH=1 JUPYTER_PLATFORM_DIRS=1 python3 tests/gpu_report.py --out $(REPORT) -- \
		-p no:cacheprovider -q $(PYTEST_ARGS)

# kvikio's own Python tests against kvikpy (docs/kvikio-tests.md). They are never
# committed: `make kvikio-tests-fetch` copies them from a local git mirror of
# rapidsai/kvikio (`git clone --mirror https://github.com/rapidsai/kvikio`) into the
# git-ignored .kvikio-tests/, with the kvikio commit in .kvikio-tests/KVIKIO_COMMIT.txt.
# `make kvikio-tests` runs them here against the .venv build; `make gpu-kvikio-tests`
# runs them on the GPU machine against the carried wheel (carry .kvikio-tests with .gpu).
# Both put tests/kvikio_shim first on PYTHONPATH (so `import kvikio` is kvikpy) and write
# kvikio-tests-kvikpy.xml (junit) and kvikio-tests-kvikpy.md (summary) into $(REPORT_DIR)
# (on the GPU machine, a folder you copy back). KVIKIO_TESTS picks files (default: all).
# The baseline: `make gpu-kvikio-tests KVIKIO_AGAINST=kvikio` runs them on kvikio itself
# (its wheels carried in .whl/, as for gpu-bench), into kvikio-tests-kvikio.{xml,md}.
# The git directory of a local clone of rapidsai/kvikio (required by kvikio-tests-fetch).
KVIKIO_MIRROR ?=
KVIKIO_TESTS ?=
REPORT_DIR ?= /tmp/kvikpy-kvikio-tests
KVIKIO_AGAINST ?= kvikpy
kvikio-tests-fetch:
	@[ -n "$(KVIKIO_MIRROR)" ] || { echo "error: set KVIKIO_MIRROR to the git directory of a clone of rapidsai/kvikio (git clone --mirror https://github.com/rapidsai/kvikio)" >&2; exit 2; }
	$(PYTHON) tests/kvikio_harness.py fetch --mirror $(KVIKIO_MIRROR)

kvikio-tests: develop
	$(BIN)/python tests/kvikio_harness.py run --report-dir $(REPORT_DIR) $(KVIKIO_TESTS) \
		-- $(PYTEST_ARGS)

gpu-kvikio-tests:
	$(GPU_INSTALL) $(if $(filter kvikio,$(KVIKIO_AGAINST)),.whl/*.whl,.gpu/*.whl) \
		$(wildcard .zwhl/*.whl)
	PYTHONPATH=/tmp/kvikpy-site python3 tests/kvikio_harness.py run --report-dir $(REPORT_DIR) \
		--against $(KVIKIO_AGAINST) $(KVIKIO_TESTS) -- $(PYTEST_ARGS)

# Notebook outputs from the GPU machine: `make nb-wheels` here fetches Jupyter's wheels
# (and tqdm) for its Python 3.12 into .nbwhl/, carried with .gpu/; `make gpu-notebooks`
# there executes every notebook in place and packs them into $(NB_OUT), to unpack here.
NB_WHEELS = $(shell grep -E '^(nbclient|nbformat|ipykernel|tqdm)==' requirements-dev.txt)
NB_OUT ?= /tmp/kvikpy-notebooks.tar
nb-wheels:
	rm -rf .nbwhl && $(BIN)/python -m pip download -q --only-binary=:all: --python-version 3.12 \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 --platform any -d .nbwhl $(NB_WHEELS)

# Wheels for the GPU machine's Python 3.12 (binary only, no dependencies resolved: each
# list names what the machine lacks).
GPU_WHEEL_DOWNLOAD = $(BIN)/python -m pip download -q --no-deps --only-binary=:all: \
	--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any

# kvikpy.zarr on the GPU machine (no network there): `make zarr-wheels` here downloads
# zarr, its dependencies, pytest-asyncio (zarr's StoreTests) and nvCOMP's Python package
# (nvidia-nvcomp-cu13 and its library, about 34 MB of the 45 MB) for Python 3.12 into
# .zwhl/ (git-ignored); carry it with .gpu/, and `make gpu-test`, `gpu-kvikio-tests`,
# `gpu-bench` and `gpu-notebooks` install it when present.
# `make zarr-wheels ZARR_NVCOMP=` leaves nvCOMP out (9 MB: zstd then decodes on the CPU),
# for a smaller copy to the GPU machine beside .nbwhl/.
ZARR_NVCOMP ?= nvidia-nvcomp-cu13==6.0.0.12 nvidia-libnvcomp-cu13==6.0.0.12
ZARR_WHEELS = $(shell grep -E '^(zarr|numcodecs|pytest-asyncio)==' requirements-dev.txt) \
	donfig google-crc32c typing_extensions packaging pyyaml $(ZARR_NVCOMP)
zarr-wheels:
	rm -rf .zwhl && $(GPU_WHEEL_DOWNLOAD) -d .zwhl $(ZARR_WHEELS)
	du -sh .zwhl

# kvikpy.dask on the GPU machine (no network there): `make dask-wheels` downloads dask,
# distributed, dask-cuda (one worker per GPU) and what they import that the machine lacks,
# for Python 3.12, into .dwhl/ (git-ignored, about 4 MB); carry it with .gpu/, and
# `make gpu-test` installs it when present (tests/test_dask.py and its GPU cases then run).
# pandas is left out: the GPU machine has it, and dask-cuda runs with that one (12 MB
# less to carry, so .dwhl/ fits beside .zwhl/ and .gpu/).
DASK_WHEELS = $(shell grep -E '^(dask|distributed)==' requirements-dev.txt) dask-cuda==26.10.0 \
	nvidia-ml-py click cloudpickle fsspec partd toolz locket msgpack sortedcontainers tblib \
	tornado zict psutil
dask-wheels:
	rm -rf .dwhl && $(GPU_WHEEL_DOWNLOAD) -d .dwhl $(DASK_WHEELS)
	du -sh .dwhl

# kvikio's test_s3_io.py on the GPU machine needs boto3 and moto's server: `make
# remote-wheels` downloads them and what they import that the machine lacks (about
# 31 MB) into .rwhl/ (git-ignored); carry it and install it beside the kvikpy wheel.
REMOTE_WHEELS = $(shell grep -E '^(moto\[server\]|boto3)==' requirements-dev.txt | sed 's/\[server\]//') \
	botocore s3transfer jmespath python-dateutil==2.9.0.post0 six urllib3 werkzeug markupsafe xmltodict \
	responses requests idna certifi charset-normalizer cryptography cffi pycparser jinja2 \
	pyyaml flask flask-cors blinker itsdangerous click py-partiql-parser
remote-wheels:
	rm -rf .rwhl && $(GPU_WHEEL_DOWNLOAD) -d .rwhl $(REMOTE_WHEELS)
	du -sh .rwhl

# `python -m benchmarks remote-checkpoint` on the GPU machine compares kvikpy with the Run:ai
# model streamer: `make streamer-wheels` downloads it and its S3 plug-in (manylinux_2_30
# wheels, each with its own native library, the AWS SDK linked into the plug-in's) and
# humanize, the one package they need that the machine lacks besides boto3 (from
# .rwhl/), into .swhl/ (git-ignored); carry it with .gpu/ and .rwhl/.
STREAMER_VERSION := 0.17.0
STREAMER_WHEELS = runai-model-streamer==$(STREAMER_VERSION) \
	runai-model-streamer-s3==$(STREAMER_VERSION) humanize
streamer-wheels:
	rm -rf .swhl && $(GPU_WHEEL_DOWNLOAD) --platform manylinux_2_30_x86_64 -d .swhl $(STREAMER_WHEELS)
	du -sh .swhl

# The local rows of `python -m benchmarks remote-checkpoint` (the same checkpoint from the
# local disk) on the GPU machine: `make peer-wheels` downloads FlashPack (pure Python; what
# it imports, accelerate among them, the machine has) into .pwhl/ (git-ignored); carry it
# with .gpu/, .rwhl/, .swhl/ and .whl/ (InstantTensor's wheel).
FLASHPACK_VERSION := 0.4.5
PEER_WHEELS = flashpack==$(FLASHPACK_VERSION)
peer-wheels:
	rm -rf .pwhl && $(GPU_WHEEL_DOWNLOAD) -d .pwhl $(PEER_WHEELS)
	du -sh .pwhl

gpu-notebooks:
	$(GPU_INSTALL) .gpu/*.whl .nbwhl/*.whl $(wildcard .whl/nanoarrow-*.whl) $(wildcard .zwhl/*.whl) \
		$(wildcard .dwhl/*.whl)
	PYTHONPATH=/tmp/kvikpy-site PYTHONSAFEPATH=1 JUPYTER_PLATFORM_DIRS=1 python3 notebooks/execute.py
	tar cf $(NB_OUT) notebooks/*.ipynb

notebooks: develop
	$(BIN)/python notebooks/build.py
	$(BIN)/ruff format notebooks
	$(BIN)/python notebooks/execute.py

# The benchmark matrix on the GPU machine (peers' wheels carried in .whl/): ceilings,
# large reads against kvikio (warm, cold, writes), throughput against file size, small
# files, a checkpoint, host reads, random ranges, batches, what progress bars cost, import
# time (tqdm from .nbwhl/); JSON and markdown
# into $(BENCH_OUT). One piece: make gpu-bench BENCH=large BENCH_ARGS="--size-mib 1024".
BENCH_OUT ?= /tmp/kvikpy-bench
BENCH ?=
gpu-bench:
	$(GPU_INSTALL) .gpu/*.whl .whl/*.whl $(wildcard .nbwhl/tqdm-*.whl) $(wildcard .zwhl/*.whl)
	mkdir -p $(BENCH_OUT)
	if [ -n "$(BENCH)" ]; then \
		PYTHONPATH=/tmp/kvikpy-site:. PYTHONSAFEPATH=1 python3 -m benchmarks $(BENCH) $(BENCH_ARGS); \
	else \
		set -e; export PYTHONPATH=/tmp/kvikpy-site:. PYTHONSAFEPATH=1; \
		python3 -m benchmarks ceilings --cold --out $(BENCH_OUT)/ceilings.json; \
		python3 -m benchmarks large --threads 1,4,8,16 --out $(BENCH_OUT)/large.json --markdown $(BENCH_OUT)/large.md; \
		python3 -m benchmarks large --mode cold --size-mib 2048 --threads 16 --out $(BENCH_OUT)/cold.json; \
		python3 -m benchmarks large --mode write --threads 16 --out $(BENCH_OUT)/write.json; \
		python3 -m benchmarks sizes --out $(BENCH_OUT)/sizes.json; \
		python3 -m benchmarks small --out $(BENCH_OUT)/small.json; \
		python3 -m benchmarks checkpoint --out $(BENCH_OUT)/checkpoint.json; \
		python3 -m benchmarks host | tee $(BENCH_OUT)/host.txt; \
		python3 -m benchmarks ranges --out $(BENCH_OUT)/ranges.json; \
		python3 -m benchmarks batch --out $(BENCH_OUT)/batch.json; \
		python3 -m benchmarks progress --out $(BENCH_OUT)/progress.json; \
		python3 -m benchmarks startup | tee $(BENCH_OUT)/startup.txt; \
	fi

# kvikpy against kvikio in every regime, side by side (benchmarks/regimes.py): per-call
# reads into torch, CuPy and numpy, a loop over 2,000 files, a 2 GiB write incl. os.sync,
# the first read of a process, a 4 GiB file cold, warm and half warm at 16 threads, and the
# disk's O_DIRECT ceiling, in about 6 minutes on an H100 (kvikio's wheels carried in .whl/,
# kvikpy's in .gpu/); regimes.json and regimes.md into $(BENCH_OUT). Options in
# BENCH_ARGS, e.g. BENCH_ARGS="--only write-sweep --write-rounds 3" (kvikpy's write at
# several task and chunk sizes, to choose its write defaults from one run).
gpu-bench-regimes:
	$(GPU_INSTALL) .gpu/*.whl .whl/*.whl
	mkdir -p $(BENCH_OUT)
	PYTHONPATH=/tmp/kvikpy-site:. PYTHONSAFEPATH=1 python3 -m benchmarks regimes \
		--out $(BENCH_OUT)/regimes.json --markdown $(BENCH_OUT)/regimes.md $(BENCH_ARGS)

# Two builds side by side on the GPU machine (the before/after of an engine change): the
# wheel from before carried in .bench/before/, the one from after in .gpu/ (`make
# gpu-wheel`), each installed into its own folder; `python -m benchmarks wheels` runs
# them in alternating fresh processes (about 4 minutes on an H100) and writes wheels.json
# and wheels.md (the table for docs/benchmarks.md) into $(BENCH_OUT). More options in
# BENCH_ARGS, e.g. BENCH_ARGS="--only large,ranges --rounds 4".
WHEELS_INSTALL = python3 -m pip install -q --no-index --no-deps --no-compile --target
gpu-bench-wheels:
	@for d in .bench/before .gpu; do \
		n=$$(ls $$d/*.whl 2>/dev/null | wc -l); \
		[ "$$n" = 1 ] || { echo "error: expected one kvikpy wheel in $$d/, found $$n" >&2; exit 1; }; \
	done
	rm -rf /tmp/kvikpy-before /tmp/kvikpy-after
	$(WHEELS_INSTALL) /tmp/kvikpy-before .bench/before/*.whl
	$(WHEELS_INSTALL) /tmp/kvikpy-after .gpu/*.whl
	mkdir -p $(BENCH_OUT)
	PYTHONPATH=. PYTHONSAFEPATH=1 python3 -m benchmarks wheels \
		--build before=/tmp/kvikpy-before --build after=/tmp/kvikpy-after \
		--out $(BENCH_OUT)/wheels.json --markdown $(BENCH_OUT)/wheels.md $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(REL_VENV) target dist site .gpu .pytest_cache .mypy_cache .ruff_cache .hypothesis
