#!/usr/bin/env bash
# torch_tpu on an NVIDIA GPU, in one prepared run (issue 19, item 7).
#
#   scripts/gpu_check.sh [--dry-run] [--skip-build] [REPORT]
#
# On a GPU machine (Python, torch with CUDA, jax-cuda13-pjrt installed, no
# network): builds torch_tpu against that torch into build/gpu-check (cmake,
# else g++ directly), then with PJRT_DEVICE=CUDA runs `doctor`, a fixed
# subset of the tests, and the dispatch, train-step and Hugging Face
# benchmarks, whose tables put torch's own CUDA eager and inductor beside
# ours. Everything goes into one report file (default gpu_check_report.md).
# A step that fails is reported and the run goes on; the exit code is the
# number of failed steps.
#
# --dry-run: the same steps on the CPU plugin (PJRT_DEVICE=CPU) with this
# checkout's .venv, the way to test the script without a GPU.
# --skip-build: use the torch_tpu the Python already imports.
# STEP_TIMEOUT (seconds, default 180; the build gets 4x) bounds each step:
# the whole run fits a 15-minute device lease. GPU_CHECK_STEPS=doctor,tests
# runs only those steps (ids: build doctor tests dispatch train hf explain).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
BUILD=1
REPORT=gpu_check_report.md
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --skip-build) BUILD=0 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) REPORT=$arg ;;
  esac
done
if [ "$DRY" = 1 ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  export PJRT_DEVICE=CPU
else
  PY=${PYTHON:-python3}
  export PJRT_DEVICE=CUDA
fi
STEP_TIMEOUT=${STEP_TIMEOUT:-180}
export TORCH_TPU_CACHE_DIR=${TORCH_TPU_CACHE_DIR:-$ROOT/build/gpu-check-cache}
FAILED=0

: >"$REPORT"
note() { echo "$*" | tee -a "$REPORT"; }

# step ID NAME COMMAND...: runs it under the step timeout, its output in the
# report; GPU_CHECK_STEPS (ids, comma-separated) runs only those.
step() {
  local id=$1 name=$2
  shift 2
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ ",$GPU_CHECK_STEPS," != *",$id,"* ]]; then
    return
  fi
  note ""
  note "## $name"
  note ""
  note '```'
  local start=$SECONDS
  timeout "$STEP_TIMEOUT" "$@" >>"$REPORT" 2>&1
  local rc=$?
  note '```'
  note "$name: exit $rc, $((SECONDS - start)) s"
  [ "$rc" = 0 ] || FAILED=$((FAILED + 1))
}

note "# torch_tpu GPU check ($(date -u +%Y-%m-%dT%H:%MZ), PJRT_DEVICE=$PJRT_DEVICE$([ "$DRY" = 1 ] && echo ', dry run'))"
note ""
note "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note "- python: $($PY -c 'import sys; print(sys.version.split()[0])')"
note "- torch: $(TORCH_DEVICE_BACKEND_AUTOLOAD=0 $PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
note "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"
note "- cpu: $(nproc) cores"

# The extension goes next to the Python files (run with PYTHONPATH=$ROOT); a
# dry run leaves it in the build folder (this checkout's .venv has its own).
build() {
  local dir=$ROOT/build/gpu-check dest=$ROOT/torch_tpu
  [ "$DRY" = 1 ] && dest=$dir
  mkdir -p "$dir"
  if command -v cmake >/dev/null; then
    cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORCH_TPU_BUILD_TESTS=OFF \
      -DPython_EXECUTABLE="$(command -v "$PY" || echo "$PY")" &&
      cmake --build "$dir" --target _C -j "$(nproc)" &&
      { [ "$dest" = "$dir" ] || cp "$dir"/_C*.so "$dest/"; }
    return
  fi
  # No cmake: the same sources and flags with g++ directly.
  local torch_dir abi ext inc
  torch_dir=$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 $PY -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  abi=$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 $PY -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  ext=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  inc=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  local flags="-std=c++20 -O2 -fPIC -DNDEBUG -D_GLIBCXX_USE_CXX11_ABI=$abi -DTORCH_EXTENSION_NAME=_C -I$ROOT/csrc -I$inc -I$torch_dir/include -I$torch_dir/include/torch/csrc/api/include"
  ls "$ROOT"/csrc/{pjrt,stablehlo,lowering,runtime,collectives,aten,python,distributed}/*.cpp |
    xargs -P "$(nproc)" -I{} sh -c 'o='"$dir"'/$(echo {} | tr / _).o; g++ '"$flags"' -c {} -o $o' &&
    g++ -shared -o "$dest/_C$ext" "$dir"/*.o -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" \
      -ltorch -ltorch_cpu -ltorch_python -lc10 -ldl
}

if [ "$BUILD" = 1 ]; then
  export -f build  # `timeout` runs programs: the step runs the function in a child bash
  export ROOT DRY PY
  STEP_TIMEOUT=$((STEP_TIMEOUT * 4)) step build "build against this torch" bash -c build
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi

step doctor "doctor" "$PY" -m torch_tpu doctor
step tests "tests (fixed subset)" "$PY" -m pytest -q -p no:cacheprovider -p no:warnings \
  tests/python/test_fused.py tests/python/test_compile.py tests/python/test_training.py tests/python/test_jax_ops.py
step dispatch "benchmark: dispatch" "$PY" benchmarks/dispatch.py --iters 1000
step train "benchmark: train step" "$PY" benchmarks/train_step.py --steps 5 --warmup 2 --sizes demo,gpt512
if "$PY" -c 'import transformers' 2>/dev/null; then
  step hf "benchmark: Hugging Face" "$PY" benchmarks/hf.py --steps 3 --warmup 2 --gen-runs 1
else
  note ""
  note "## benchmark: Hugging Face: skipped (transformers is not installed)"
fi
step explain "explain (what the run cost)" "$PY" -c 'import torch, torch_tpu; x = torch.randn(64, 64).to("tpu"); (x @ x).sum().item(); print(torch_tpu.explain())'

note ""
note "failed steps: $FAILED; report: $REPORT"
exit "$FAILED"
