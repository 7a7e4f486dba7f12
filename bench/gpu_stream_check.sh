#!/usr/bin/env bash
# The streaming trainer on one GPU machine, as one command from the repository root with the wheels folder carried
# (carry [".whl"]; see bench/gpu_check.sh for fetching them):   bash bench/gpu_stream_check.sh
# 1. bench/stream_throughput.py with every core of that machine (the stream alone against encode_batch);
# 2. scripts/train_sparknet.py training sparknet-70m (compiled, 64 x 1024 tokens a step) on the demo corpus
#    streamed live, so the stream's own rate (data/capacity_tokens_per_second) shows next to the GPU's (perf/tokens_per_second).
# Everything is also written to $OUT/gpu_stream_check.log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
work=$(mktemp -d)
{
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "error: installing the wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
  echo "== $(nproc) cores; bench/stream_throughput.py"
  timeout 150 python3 bench/stream_throughput.py
  echo "== demo corpus and a 16k tokenizer"
  python3 scripts/prepare_demo_corpus.py --output_dir "$work/corpus" >/dev/null || exit 1
  cat >"$work/mix.json" <<JSON
{"seed": 1, "context_length": 1024, "target_tokens": 5242880,
 "mix": [{"name": "json", "data_files": "$work/corpus/prose.train.jsonl", "prob": 0.4},
         {"name": "json", "data_files": "$work/corpus/code.train.jsonl", "prob": 0.6}]}
JSON
  python3 scripts/train_tokenizer_v5.py --config "$work/mix.json" --vocab_size 16384 --max_bytes 8000000 \
    --output_dir "$work/tok" 2>&1 | tail -2
  echo "== scripts/train_sparknet.py, sparknet-70m compiled, streamed"
  timeout 300 python3 scripts/train_sparknet.py --run_name stream-gpu --config "$work/mix.json" \
    --tokenizer_dir "$work/tok" --checkpoints_dir "$work/ckpt" --logs_dir "$work/logs" --model_preset sparknet-70m \
    --batch_size 64 --global_batch_size 64 --compile on --on_exhausted restart --shuffle_buffer 100 --val_tokens 65536 --eval_steps 1000 \
    --save_steps 1000 --sample_steps 0 --logging_steps 10 2>&1 | grep -v "Writing model shards"
  python3 - "$work/logs/stream-gpu" <<'PY'
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1])
acc.Reload()
for tag in ("perf/tokens_per_second", "data/capacity_tokens_per_second", "data/wait_fraction", "perf/mfu"):
    if tag in acc.Tags()["scalars"]:
        print(f"{tag:26}", " ".join(f"{e.step}:{e.value:,.3g}" for e in acc.Scalars(tag)))
PY
} 2>&1 | tee "$OUT/gpu_stream_check.log"
