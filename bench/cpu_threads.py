"""How many compute threads a CPU run should use: torch's default against SparkNet's rule, idle and beside busy work.

Each script that trains or evaluates on a CPU sizes torch's intra-op threads by `runtime.compute_threads`: the cores
its affinity allows that other work leaves free (measured from /proc/stat over a quarter of a second at the start,
and by the trainers again every 30 s), shared among the processes torchrun starts on the node; `OMP_NUM_THREADS`
when set. torch's own default takes every core whatever else runs. This bench runs the real scripts as subprocesses,
side by side in one run, on the demo's model and blocks (`sparknet-nanochat-demo`, Muon, blocks of 256, 8 a step):

- the packed trainer (`train_sparknet_v5.py`) on a small build of the demo corpus,
- the streaming trainer (`train_sparknet.py`) on the same mix, with its default encoder processes,
- `eval_perplexity.py` on the packed run's model and the build's validation split,

each under every mode of MODES (the rule: OMP_NUM_THREADS unset; torch's default, which the scripts used before:
OMP_NUM_THREADS set to the count torch picks by itself; "1 thread" where asked), on an idle machine and beside LOAD
busy loops (other work on the machine: `python -c 'while True: pass'`). Modes alternate within each round, ROUNDS
rounds, so drift in the machine's speed falls on every mode alike; the figure is each mode's median. Trainers report
tokens/s (the metadata's tokens_per_second_mean, the start excluded), the evaluation its wall-clock seconds.

Run: `.venv/bin/python bench/cpu_threads.py` (about 15 minutes on 2 cores), or `--short true` (checks the bench).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_PRESET = "sparknet-nanochat-demo"  # the demo's model
BLOCK_SIZE = 256  # the demo's blocks
BATCH_SIZE = 8  # the demo's blocks per step
STEPS = 24  # optimizer steps per training run
LOAD = 2  # busy loops beside the run, in the loaded rows
ROUNDS = 1  # each mode's runs per row; the median is reported
MODES: list = ["the rule", "torch default"]  # and "1 thread"
SHORT = False  # a few steps, one round (checks the bench)


def torch_default_threads(python: str, env: dict[str, str]) -> int:
    """The intra-op threads torch picks on its own here (OMP_NUM_THREADS unset)."""
    out = subprocess.run([python, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def run(args: list[object], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, args))}\n{proc.stderr[-3000:]}")
    return time.monotonic() - started, proc.stderr + proc.stdout


def prepare(work: Path, python: str, env: dict[str, str], tokens: int, block_size: int) -> Path:
    """The demo corpus and its tokenizer (8192 tokens, as the demo's) under `work` (corpus/, tok/: made once), and a
    packed dataset of `tokens` training tokens in blocks of `block_size` (ds<block_size>/); returns its mix config
    (mix<block_size>.json)."""
    if not (work / "corpus").exists():
        run([python, "scripts/prepare_demo_corpus.py", "--output_dir", work / "corpus"], env)
    mix = [{"name": "json", "prob": 0.4, "data_files": str(work / "corpus" / "prose.train.jsonl")},
           {"name": "json", "prob": 0.6, "data_files": str(work / "corpus" / "code.train.jsonl")}]
    config = work / f"mix{block_size}.json"
    config.write_text(json.dumps({"seed": 0, "context_length": block_size, "target_tokens": tokens, "mix": mix}))
    if not (work / "tok").exists():
        run([python, "scripts/train_tokenizer_v5.py", "--config", config, "--vocab_size", 8192, "--max_bytes",
             2_000_000, "--output_dir", work / "tok"], env)
    run([python, "scripts/build_dataset_v5.py", "--config", config, "--tokenizer_dir", work / "tok",
         "--output_dir", work / f"ds{block_size}", "--val_tokens", 25_000], env)
    return config


def cpu_line(default_threads: int) -> str:
    """The CPU this ran on, whether it has native bf16, and the threads torch picks by itself."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags = Path("/proc/cpuinfo").read_text()
    return (f"CPU {cpu} ({'avx512_bf16' if 'avx512_bf16' in flags else 'no native bf16'}), "
            f"{len(os.sched_getaffinity(0))} cores allowed; torch's own default: {default_threads} threads")


def _threads_line(output: str) -> str:
    """The script's own line saying how many compute threads it chose, or '' where it says none."""
    return next((line.split("INFO", 1)[-1].split(":", 1)[-1].strip() for line in output.splitlines()
                 if "compute thread" in line), "")


def main() -> None:
    python = sys.executable
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    base.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    default_threads = torch_default_threads(python, base)
    envs = {"the rule": base, "torch default": {**base, "OMP_NUM_THREADS": str(default_threads)},
            "1 thread": {**base, "OMP_NUM_THREADS": "1"}}
    steps, rounds = (4, 1) if SHORT else (STEPS, ROUNDS)
    print(cpu_line(default_threads), flush=True)
    results: dict[tuple[str, str, str], list[float]] = {}
    said: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory(prefix="sparknet-cpu-threads-") as tmp:
        work = Path(tmp)
        config = prepare(work, python, base, steps * BATCH_SIZE * BLOCK_SIZE * (rounds * len(MODES) * 2 + 1),
                         BLOCK_SIZE)
        common = ["--model_preset", MODEL_PRESET, "--max_steps", steps, "--global_batch_size", BATCH_SIZE,
                  "--batch_size", BATCH_SIZE, "--optimizer", "muon", "--learning_rate", 2e-3,
                  "--muon_learning_rate", 4e-3, "--eval_steps", 10_000, "--save_steps", 10_000, "--sample_steps", 0,
                  "--logging_steps", max(1, steps // 8), "--checkpoints_dir", work / "ckpt", "--logs_dir",
                  work / "logs"]
        runs = {
            "packed trainer": lambda name: [python, "scripts/train_sparknet_v5.py", "--run_name", name,
                                            "--dataset_dir", work / f"ds{BLOCK_SIZE}", *common],
            "stream": lambda name: [python, "scripts/train_sparknet.py", "--run_name", name, "--config", config,
                                    "--tokenizer_dir", work / "tok", "--val_tokens", 25_000, *common],
            "eval_perplexity": lambda name: [python, "scripts/eval_perplexity.py", "--models",
                                             json.dumps([str(work / "ckpt" / "model-for-eval")]), "--data",
                                             work / f"ds{BLOCK_SIZE}", "--eval_dir", work / "eval" / name],
        }
        run(runs["packed trainer"]("model-for-eval"), base)
        for load in ("idle", f"{LOAD} busy loops"):
            loops = [] if load == "idle" else [
                subprocess.Popen([python, "-c", "while True: pass"]) for _ in range(LOAD)]
            try:
                for round_ in range(rounds):
                    for what, args in runs.items():
                        for mode in MODES:
                            name = f"{what}-{mode}-{load}-{round_}".replace(" ", "_")
                            seconds, output = run(args(name), envs[mode])
                            said.setdefault((what, mode), _threads_line(output))
                            if what == "eval_perplexity":
                                value = seconds
                            else:
                                metadata = json.loads((work / "ckpt" / name / "training_metadata.json").read_text())
                                value = metadata["metrics"]["tokens_per_second_mean"]
                            results.setdefault((what, load, mode), []).append(value)
                            print(f"  {what}, {load}, {mode}: {value:,.1f}", flush=True)
            finally:
                for loop in loops:
                    loop.kill()
    print(f"\n{steps} steps of {BATCH_SIZE} x {BLOCK_SIZE} tokens, {MODEL_PRESET}; median of {rounds} rounds; "
          "trainers: tokens/s (higher is better), eval_perplexity: seconds (lower is better)")
    print("| run | load | " + " | ".join(MODES) + " | the rule against torch default |")
    print("|---|---|" + "---|" * (len(MODES) + 1))
    for what in runs:
        for load in ("idle", f"{LOAD} busy loops"):
            medians = {mode: statistics.median(results[(what, load, mode)]) for mode in MODES}
            ratio = medians["the rule"] / medians["torch default"]
            if what == "eval_perplexity":
                ratio = 1 / ratio  # a speed-up either way
            print(f"| {what} | {load} | " + " | ".join(f"{medians[m]:,.1f}" for m in MODES) + f" | {ratio:.2f}x |")
    print("\nwhat each script said it chose:")
    for (what, mode), line in said.items():
        print(f"  {what}, {mode}: {line or '(no line)'}")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
