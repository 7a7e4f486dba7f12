"""Does the stream train as well as the packed build on the same data? (issue 40, "the stream trains as well")

A mix of long and short documents (the demo corpus: stdlib docstrings, and whole stdlib modules, most of them longer
than a piece of 8 blocks of 128 tokens) is built into a packed dataset and trained by both trainers with the same
model, tokens, batch and learning rate: the packed trainer on the dataset, the streaming trainer on the same mix,
each shuffle window in SHUFFLE_WINDOWS (0: the stream's order; the streaming trainer's default is its
SHUFFLE_WINDOW), and the default one on two processes too (torchrun, gloo). With the same config, tokenizer,
VAL_TOKENS and seed every run evaluates on the same validation blocks (the hold-out is one rule), so the final eval
losses compare directly; the figures are the final eval loss, its ratio to the packed run's, and the run's tokens/s.

Run: `.venv/bin/python bench/stream_vs_build.py` (about 2 minutes a run on 2 cores at the default budget), or
`--short true` (a few steps of each run: checks the bench itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_TOKENS = 600_000  # training tokens per run
BLOCK_SIZE = 128
GLOBAL_BATCH_SIZE = 16
LEARNING_RATE = 3e-3
MODEL_PRESET = "sparknet-tiny"
VAL_TOKENS = 40_000
SHUFFLE_BUFFER = 100  # documents per source, the build's and the stream's alike
SHUFFLE_WINDOWS: list = [0, 64, 256, 1024]  # the stream's windows measured (blocks)
TWO_PROCESSES = True  # the default window on two processes too
SEED = 0
SHORT = False  # a few steps per run (CI)


def _run(args: list[object], env: dict[str, str]) -> float:
    started = time.monotonic()
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, args))}\n{proc.stderr[-3000:]}")
    return time.monotonic() - started


def _final(run_dir: Path) -> dict[str, float]:
    metadata = json.loads((run_dir / "training_metadata.json").read_text())
    return {"eval_loss": metadata["metrics"]["eval_loss"],
            "tokens_per_second": metadata["metrics"].get("tokens_per_second_mean") or 0.0}


def main() -> None:
    from sparknet.cli import script_constants

    python = sys.executable
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    budget = GLOBAL_BATCH_SIZE * BLOCK_SIZE * 6 if SHORT else TARGET_TOKENS
    default_window = script_constants("train_sparknet.py")["SHUFFLE_WINDOW"]
    with tempfile.TemporaryDirectory(prefix="sparknet-stream-vs-build-") as tmp:
        work = Path(tmp)
        _run([python, "scripts/prepare_demo_corpus.py", "--output_dir", work / "corpus"], env)
        mix = [{"name": "json", "prob": 0.4, "data_files": str(work / "corpus" / "prose.train.jsonl")},
               {"name": "json", "prob": 0.6, "data_files": str(work / "corpus" / "code.train.jsonl")}]
        config = work / "mix.json"
        config.write_text(json.dumps({"seed": SEED, "context_length": BLOCK_SIZE, "target_tokens": budget,
                                      "mix": mix}))
        _run([python, "scripts/train_tokenizer_v5.py", "--config", config, "--vocab_size", 4096, "--max_bytes",
              2_000_000, "--output_dir", work / "tok"], env)
        _run([python, "scripts/build_dataset_v5.py", "--config", config, "--tokenizer_dir", work / "tok",
              "--output_dir", work / "ds", "--val_tokens", VAL_TOKENS, "--shuffle_buffer", SHUFFLE_BUFFER,
              "--num_workers", 0], env)
        common = ["--model_preset", MODEL_PRESET, "--target_tokens", budget, "--global_batch_size",
                  GLOBAL_BATCH_SIZE, "--batch_size", GLOBAL_BATCH_SIZE, "--learning_rate", LEARNING_RATE,
                  "--eval_steps", 1000, "--save_steps", 1000, "--sample_steps", 0, "--seed", SEED,
                  "--checkpoints_dir", work / "ckpt", "--logs_dir", work / "logs"]
        rows = {}
        seconds = _run([python, "scripts/train_sparknet_v5.py", "--run_name", "packed", "--config", config,
                        "--dataset_dir", work / "ds", *common], env)
        rows["packed"] = {**_final(work / "ckpt" / "packed"), "seconds": seconds}
        runs = [(f"stream, window {w}", w, 1) for w in SHUFFLE_WINDOWS]
        if TWO_PROCESSES:
            runs.append((f"stream, window {default_window}, 2 processes", default_window, 2))
        for name, window, processes in runs:
            run = name.replace(" ", "").replace(",", "-")
            launcher = ([python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", processes]
                        if processes > 1 else [python])
            seconds = _run([*launcher, "scripts/train_sparknet.py", "--run_name", run, "--config", config,
                            "--tokenizer_dir", work / "tok", "--val_tokens", VAL_TOKENS, "--shuffle_buffer",
                            SHUFFLE_BUFFER, "--shuffle_window", window, "--num_workers", 1, *common],
                           {**env, "OMP_NUM_THREADS": "1"} if processes > 1 else env)
            rows[name] = {**_final(work / "ckpt" / run), "seconds": seconds}
    packed = rows["packed"]["eval_loss"]
    print(f"\n{budget:,} training tokens, {MODEL_PRESET}, blocks of {BLOCK_SIZE}, global batch {GLOBAL_BATCH_SIZE}, "
          f"lr {LEARNING_RATE}; the same validation blocks for every run")
    print("| run | final eval loss | against packed | tokens/s | seconds |\n|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['eval_loss']:.4f} | {row['eval_loss'] / packed:.3f} | "
              f"{row['tokens_per_second']:,.0f} | {row['seconds']:.0f} |")


if __name__ == "__main__":
    from sparknet.cli import run_script

    run_script(globals(), main)
