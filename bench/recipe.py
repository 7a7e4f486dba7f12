"""Which recipe gets more out of each token: several recipes trained on the same tokens for the same budget.

Every recipe runs the real trainer (`scripts/train_sparknet_v5.py` as a subprocess) on the same packed dataset
(default: the demo's, from `make demo`), with the same budget and batch, and is compared on its held-out loss and
bits per byte at the end and at a few evaluations in between (from its TensorBoard events), and on tokens/s. The
baseline runs with two seeds: a difference to it smaller than their spread is a tie.

Run: `.venv/bin/python bench/recipe.py` (the full table: about 3 minutes a recipe on 2 cores) or `--short true`
(a few steps of each recipe: checks the bench itself, for CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATASET_DIR = "datasets/demo"  # a packed dataset (make demo builds this one)
TARGET_TOKENS = 500_000  # training tokens per recipe (the demo's budget)
BATCH_SIZE = 8  # blocks per step
EVAL_STEPS = 50  # evaluations in between, for the curve
SHORT = False  # a few steps of each recipe (CI)
# name -> flags on top of the baseline's; "baseline" runs twice (seeds 0 and 1) for the noise
RECIPES: dict = {
    "baseline": {},
    "lr 1e-3": {"learning_rate": 1e-3},
    "lr 4e-3": {"learning_rate": 4e-3},
    "wsd": {"lr_schedule": "wsd"},
    "muon": {"optimizer": "muon", "muon_learning_rate": 2e-3},
    "llama": {"model_preset": "sparknet-llama-demo"},
    "llama + muon": {"model_preset": "sparknet-llama-demo", "optimizer": "muon", "muon_learning_rate": 2e-3},
}
SEEDS = [0]  # seeds of the other recipes
BASELINE = {"model_preset": "sparknet-demo", "learning_rate": 2e-3, "warmup_ratio": 0.05}


def run(name: str, flags: dict, seed: int, work: Path, short: bool) -> dict:
    manifest = json.loads((ROOT / DATASET_DIR / "manifest.json").read_text())
    run_name = f"{name.replace(' ', '_').replace('+', 'and')}-{seed}"
    values = {**BASELINE, **flags, "config": manifest["config"]["path"], "seed": seed, "run_name": run_name,
              "dataset_dir": DATASET_DIR, "target_tokens": TARGET_TOKENS // 50 if short else TARGET_TOKENS,
              "global_batch_size": BATCH_SIZE, "batch_size": BATCH_SIZE,
              "eval_steps": EVAL_STEPS // 10 if short else EVAL_STEPS,
              "save_steps": 10**6, "sample_steps": 0, "sample_prompts": [], "logging_steps": 10,
              "checkpoints_dir": str(work / "ckpt"), "logs_dir": str(work / "logs")}
    args = [a for k, v in values.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, list) else str(v))]
    proc = subprocess.run([sys.executable, "scripts/train_sparknet_v5.py", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"recipe {name!r} failed:\n{proc.stderr[-3000:]}")
    meta = json.loads((work / "ckpt" / values["run_name"] / "training_metadata.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(work / "logs" / values["run_name"]))
    acc.Reload()
    curve = [(e.step, e.value) for e in acc.Scalars("eval/bits_per_byte")]
    return {"name": name, "seed": seed, "loss": meta["metrics"]["eval_loss"],
            "bpb": meta["metrics"]["eval_bits_per_byte"], "tps": meta["metrics"]["tokens_per_second_mean"],
            "curve": curve}


def main() -> None:
    if not (ROOT / DATASET_DIR / "manifest.json").is_file():
        raise SystemExit(f"no dataset in {DATASET_DIR}: run `make demo` first (or pass --dataset_dir)")
    results = []
    with tempfile.TemporaryDirectory(prefix="sparknet-recipe-") as tmp:
        for name, flags in RECIPES.items():
            for seed in ((0, 1) if name == "baseline" else SEEDS):
                results.append(run(name, flags, seed, Path(tmp), SHORT))
                r = results[-1]
                print(f"{name} (seed {seed}): eval loss {r['loss']:.4f}, bits/byte {r['bpb']:.4f}", flush=True)
    base = [r for r in results if r["name"] == "baseline"]
    mean = sum(r["bpb"] for r in base) / len(base)
    noise = max(r["bpb"] for r in base) - min(r["bpb"] for r in base)
    checkpoints = [step for step, _ in base[0]["curve"]]
    marks = checkpoints[len(checkpoints) // 3 :: max(1, len(checkpoints) // 3)][:2]
    tokens = TARGET_TOKENS // 50 if SHORT else TARGET_TOKENS
    print(f"\n[recipes] {DATASET_DIR}, {tokens:,} tokens each; baseline noise (2 seeds): {noise:.4f} bits/byte")
    print("| recipe | seed | eval loss | bits/byte | vs baseline | " + " | ".join(f"bpb @{m}" for m in marks)
          + " | tokens/s |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(marks) + "---:|")
    for r in results:
        diff = r["bpb"] - mean
        verdict = "tie" if abs(diff) <= noise else ("better" if diff < 0 else "worse")
        at = dict(r["curve"])
        print(f"| {r['name']} | {r['seed']} | {r['loss']:.4f} | {r['bpb']:.4f} | {diff:+.4f} ({verdict}) | "
              + " | ".join(f"{at.get(m, float('nan')):.4f}" for m in marks) + f" | {r['tps'] or 0:,.0f} |")


if __name__ == "__main__":
    from sparknet.cli import run_script

    run_script(globals(), main)
