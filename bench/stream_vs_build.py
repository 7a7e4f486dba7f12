"""Does the stream train as well as the packed build on the same data? (issue 40, "the stream trains as well";
issue 49, §5, over seeds)

A mix of long and short documents (the demo corpus: stdlib docstrings, and whole stdlib modules, most of them longer
than a piece of 8 blocks of 128 tokens) is built into a packed dataset and trained by both trainers with the same
model, tokens, batch and learning rate: the packed trainer on the dataset, the streaming trainer on the same mix at
its default SHUFFLE_WINDOW, each further window in SHUFFLE_WINDOWS (0: the stream's order), and with TWO_PROCESSES
the default window on two processes too (torchrun, gloo). Each seed in SEEDS is the config's seed (the data: the
shuffle buffers, the hold-out, the stream's windows) and the trainers' --seed (the model's initial weights, the packed
trainer's order), with its own build; one tokenizer serves every seed. With the same config, tokenizer, VAL_TOKENS
and seed every run evaluates on the same validation blocks (the hold-out is one rule), so the final eval losses
compare directly; the figures are the final eval loss, its ratio to the packed run's and the difference in nats, the
run's tokens/s, and over the seeds the mean, range and standard deviation of the difference.

The packed run and the default-window stream record their blocks (RECORD_BATCHES), and `tools/same_blocks.py` checks
each against the build's train.bin: both train its blocks each once, so what differs is the order.

Run: `.venv/bin/python bench/stream_vs_build.py` (about a minute a run on 2 cores at the default budget: 6 runs and
3 builds), or `--short true` (a few steps of each run: checks the bench itself).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_TOKENS = 598_016  # training tokens per run: 292 steps of 16 x 128, all of train.bin's 4,672 blocks, each once
BLOCK_SIZE = 128
GLOBAL_BATCH_SIZE = 16
LEARNING_RATE = 3e-3
MODEL_PRESET = "sparknet-tiny"
VAL_TOKENS = 40_000  # the build's and the stream's alike (their defaults are one rule too; explicit, as measured)
SHUFFLE_BUFFER = 100  # documents per source, the build's and the stream's alike
SEEDS: list = [0, 1, 2]  # each: the data (config seed) and the model's init and packed order (--seed), its own build
SHUFFLE_WINDOWS: list = []  # the stream's windows measured beside its default SHUFFLE_WINDOW (0: the stream's order)
TWO_PROCESSES = False  # the default window on two processes too
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


def _same_blocks(run_dir: Path, dataset_dir: Path, python: str, env: dict[str, str]) -> str:
    """tools/same_blocks.py's verdict on a run's recorded blocks against the build's train.bin (its last line)."""
    proc = subprocess.run([python, "tools/same_blocks.py", str(run_dir), str(dataset_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"tools/same_blocks.py failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def main() -> None:
    from sparknet.config.cli import script_constants

    python = sys.executable
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    budget = GLOBAL_BATCH_SIZE * BLOCK_SIZE * 6 if SHORT else TARGET_TOKENS
    default_window = script_constants("train_sparknet.py")["SHUFFLE_WINDOW"]
    windows = [default_window] + [w for w in dict.fromkeys(SHUFFLE_WINDOWS) if w != default_window]
    runs = [(f"stream, window {w}", w, 1) for w in windows]
    if TWO_PROCESSES:
        runs.append((f"stream, window {default_window}, 2 processes", default_window, 2))
    rows: dict[int, dict[str, dict[str, float]]] = {}
    checks: dict[int, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="sparknet-stream-vs-build-") as tmp:
        work = Path(tmp)
        _run([python, "scripts/prepare_demo_corpus.py", "--output_dir", work / "corpus"], env)
        mix = [{"name": "json", "prob": 0.4, "data_files": str(work / "corpus" / "prose.train.jsonl")},
               {"name": "json", "prob": 0.6, "data_files": str(work / "corpus" / "code.train.jsonl")}]
        for index, seed in enumerate(SEEDS):
            config = work / f"mix{seed}.json"
            config.write_text(json.dumps({"seed": seed, "context_length": BLOCK_SIZE, "target_tokens": budget,
                                          "mix": mix}))
            if index == 0:  # one tokenizer for every seed: the losses are in the same units
                _run([python, "scripts/train_tokenizer_v5.py", "--config", config, "--vocab_size", 4096,
                      "--max_bytes", 2_000_000, "--output_dir", work / "tok"], env)
            dataset = work / f"ds{seed}"
            _run([python, "scripts/build_dataset_v5.py", "--config", config, "--tokenizer_dir", work / "tok",
                  "--output_dir", dataset, "--val_tokens", VAL_TOKENS, "--shuffle_buffer", SHUFFLE_BUFFER,
                  "--num_workers", 0], env)
            common = ["--model_preset", MODEL_PRESET, "--target_tokens", budget, "--global_batch_size",
                      GLOBAL_BATCH_SIZE, "--batch_size", GLOBAL_BATCH_SIZE, "--learning_rate", LEARNING_RATE,
                      "--eval_steps", 1000, "--save_steps", 1000, "--sample_steps", 0, "--seed", seed,
                      "--checkpoints_dir", work / "ckpt", "--logs_dir", work / "logs"]
            rows[seed], checks[seed] = {}, {}
            seconds = _run([python, "scripts/train_sparknet_v5.py", "--run_name", f"packed-{seed}", "--config",
                            config, "--dataset_dir", dataset, "--record_batches", "true", *common], env)
            rows[seed]["packed"] = {**_final(work / "ckpt" / f"packed-{seed}"), "seconds": seconds}
            checks[seed]["packed"] = _same_blocks(work / "ckpt" / f"packed-{seed}", dataset, python, env)
            for name, window, processes in runs:
                run = name.replace(" ", "").replace(",", "-") + f"-{seed}"
                launcher = ([python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", processes]
                            if processes > 1 else [python])
                record = name == runs[0][0]  # the default window on one process
                seconds = _run([*launcher, "scripts/train_sparknet.py", "--run_name", run, "--config", config,
                                "--tokenizer_dir", work / "tok", "--val_tokens", VAL_TOKENS, "--shuffle_buffer",
                                SHUFFLE_BUFFER, "--shuffle_window", window, "--num_workers", 1,
                                "--record_batches", str(record).lower(), *common],
                               {**env, "OMP_NUM_THREADS": "1"} if processes > 1 else env)
                rows[seed][name] = {**_final(work / "ckpt" / run), "seconds": seconds}
                if record:
                    checks[seed][name] = _same_blocks(work / "ckpt" / run, dataset, python, env)
    print(f"\n{budget:,} training tokens, {MODEL_PRESET}, blocks of {BLOCK_SIZE}, global batch {GLOBAL_BATCH_SIZE}, "
          f"lr {LEARNING_RATE}; per seed the same validation blocks for every run")
    print("| seed | run | final eval loss | against packed | − packed (nats) | tokens/s | seconds |\n"
          "|---|---|---|---|---|---|---|")
    for seed, by_run in rows.items():
        packed = by_run["packed"]["eval_loss"]
        for name, row in by_run.items():
            print(f"| {seed} | {name} | {row['eval_loss']:.4f} | {row['eval_loss'] / packed:.3f} | "
                  f"{row['eval_loss'] - packed:+.4f} | {row['tokens_per_second']:,.0f} | {row['seconds']:.0f} |")
    print(f"\nover seeds {SEEDS}: the run's final eval loss − the packed run's, in nats (std: the sample's)")
    print("| run | mean | min | max | std | mean ratio |\n|---|---|---|---|---|---|")
    for name, _, _ in runs:
        diffs = [by_run[name]["eval_loss"] - by_run["packed"]["eval_loss"] for by_run in rows.values()]
        ratios = [by_run[name]["eval_loss"] / by_run["packed"]["eval_loss"] for by_run in rows.values()]
        spread = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        print(f"| {name} | {statistics.mean(diffs):+.4f} | {min(diffs):+.4f} | {max(diffs):+.4f} | {spread:.4f} | "
              f"{statistics.mean(ratios):.3f} |")
    print("\nthe blocks trained, against the build's train.bin (tools/same_blocks.py RUN DATASET):")
    for seed, by_run in checks.items():
        for name, verdict in by_run.items():
            print(f"  seed {seed}, {name}: {verdict}")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
