#!/usr/bin/env bash
# The GPU check of bench/gpu_throughput.py, as one command on the GPU machine, from the repository root, with the
# wheels folder carried (carry [".whl"]):   bash bench/gpu_check.sh [flags for gpu_throughput.py]
#
# Prepare here first (a machine that reaches the package registry):
#   bash ../shared/gpu/fetch-wheels.sh           # datasets, dill, multiprocess into .whl/ (git-ignored)
#   python3 -m pip download --no-deps -d .whl cut-cross-entropy==25.1.1   # FUSED_CROSS_ENTROPY (the image has triton)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl/pyarrow "pyarrow==24.0.0"   # installed only where the image's is < 24
# The image has torch, transformers, accelerate, tokenizers, tensorboard, safetensors, psutil, numpy and tqdm.
#
# Installs the wheels into /tmp/site, prints the GPU and the library versions, runs the benchmark (hard limit
# BENCH_TIMEOUT_S, default 420 s; the benchmark keeps itself under 5 minutes: every step change on, then each one
# off (SPARKNET_STEP_OFF), the fused loss, then micro-batches 32 and 128; one JSON line per run in
# $OUT/gpu_throughput.jsonl), then (OVERHEAD=1, the default)
# bench/trainer_overhead.py with one round of the 70M preset (hard limit OVERHEAD_TIMEOUT_S, default 240 s),
# then (FSDP=1, the default) bench/gpu_fsdp_check.py: a one-process FSDP run's sharded save, resume and full-weights
# export for both tiny presets (hard limit FSDP_TIMEOUT_S, default 300 s); everything also into
# $OUT/gpu_throughput.log. Takes about 10 minutes in all; OVERHEAD=0 / FSDP=0 leave those out.
# Without CUDA (a check of this script) both benchmarks run their CPU modes.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

{
  echo "== $(date -u '+%Y-%m-%d %H:%M:%S') UTC, $(uname -m), $(nproc) cores, in $PWD"
  wheels=(.whl/*.whl)
  # datasets 5.x needs pyarrow >= 24: take the carried one only where the image's is older (or missing)
  if ! python3 -c 'import sys, pyarrow; sys.exit(int(pyarrow.__version__.split(".")[0]) < 24)' 2>/dev/null; then
    if compgen -G ".whl/pyarrow/*.whl" >/dev/null; then
      echo "image's pyarrow is missing or older than 24: installing the carried one"
      wheels+=(.whl/pyarrow/*.whl)
    else
      echo "warning: image's pyarrow is missing or older than 24 and none is carried: datasets may fail to import"
    fi
  fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${wheels[@]}" || { echo "error: installing ${wheels[*]} failed"; exit 1; }
  else
    echo "warning: no wheels carried in .whl/: using the Python environment as it is"
  fi
  export PYTHONPATH=/tmp/site:$PWD

  echo "== nvidia-smi"
  nvidia-smi || echo "warning: nvidia-smi failed"
  echo "== versions"
  python3 - <<'EOF'
import importlib
import sys

print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "triton", "cut_cross_entropy", "transformers", "accelerate", "tokenizers", "datasets", "pyarrow", "huggingface_hub",
             "tensorboard", "safetensors", "numpy", "psutil", "tqdm", "sparknet"):
    try:
        module = importlib.import_module(name)
        print(f"{name:16} {getattr(module, '__version__', '?'):14} {module.__file__}")
    except Exception as exc:  # noqa: BLE001 - report every missing piece, then carry on
        print(f"{name:16} FAILED: {type(exc).__name__}: {exc}")
import torch

if torch.cuda.is_available():
    print("cuda", torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
          "bf16", torch.cuda.is_bf16_supported())
else:
    print("warning: torch sees no CUDA device: the benchmark would fall back to its CPU smoke mode")
EOF

  echo "== bench/gpu_throughput.py $*"
  start=$(date +%s)
  timeout -s TERM "${BENCH_TIMEOUT_S:-420}" python3 bench/gpu_throughput.py --results_jsonl "$OUT/gpu_throughput.jsonl" "$@"
  rc=$?
  echo "== gpu_throughput.py exit status $rc after $(($(date +%s) - start)) s"
  if [ "${OVERHEAD:-1}" = 1 ]; then
    echo "== bench/trainer_overhead.py --rounds 1"
    start=$(date +%s)
    timeout -s TERM "${OVERHEAD_TIMEOUT_S:-240}" python3 bench/trainer_overhead.py --rounds 1
    overhead_rc=$?
    echo "== trainer_overhead.py exit status $overhead_rc after $(($(date +%s) - start)) s"
    [ $rc = 0 ] && rc=$overhead_rc
  fi
  if [ "${FSDP:-1}" = 1 ]; then
    echo "== bench/gpu_fsdp_check.py"
    start=$(date +%s)
    timeout -s TERM "${FSDP_TIMEOUT_S:-300}" python3 bench/gpu_fsdp_check.py
    fsdp_rc=$?
    echo "== gpu_fsdp_check.py exit status $fsdp_rc after $(($(date +%s) - start)) s"
    [ $rc = 0 ] && rc=$fsdp_rc
  fi
  exit $rc
} 2>&1 | tee "$OUT/gpu_throughput.log"
