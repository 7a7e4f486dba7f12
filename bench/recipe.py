"""Which recipe gets more out of each token: several recipes trained on the same tokens for the same budget.

Every recipe runs the real trainer (`scripts/train_sparknet_v5.py` as a subprocess) on the same packed dataset
(default: the demo's, from `make demo`), with the same budget and batch, and is compared on its held-out loss and
bits per byte at the end and at a few evaluations in between (from its TensorBoard events), and on tokens/s. The
baseline runs with two seeds: a difference to it smaller than their spread is a tie.

Run: `.venv/bin/python bench/recipe.py` (the full table: about 3 minutes a recipe on 2 cores) or `--short true`
(a few steps of each recipe: checks the bench itself, for CI); `--only '["baseline", "anneal"]'` runs some.

A recipe may train on another mix (`mix_config`: a config with phases, e.g. configs/demo_anneal.json, which ends on
the prose source alone): the bench builds its packed dataset with the demo dataset's tokenizer, blocks and
validation size, and trains it for the same budget. Its own validation split follows its own mix, so every recipe's
final model is also scored by scripts/eval_perplexity.py on the same held-out text: the demo dataset's val split
(overall) and each source's held-out file (HELD_OUT, documents no recipe trained on), the per-source figures.
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
    # the mix over time: the demo's mix for 80% of the tokens, then prose alone (configs/demo_anneal.json)
    "anneal": {"mix_config": "configs/demo_anneal.json"},
    "anneal + wsd": {"mix_config": "configs/demo_anneal.json", "lr_schedule": "wsd"},
}
ONLY: list = []  # recipe names to run (empty: all); the baseline always runs, for the noise
# each source's held-out documents (never in a training split), for the per-source columns
HELD_OUT = {"prose": "data/demo/prose.val.jsonl", "code": "data/demo/code.val.jsonl"}
SEEDS = [0]  # seeds of the other recipes
BASELINE = {"model_preset": "sparknet-demo", "learning_rate": 2e-3, "warmup_ratio": 0.05}


def build(mix_config: str, work: Path, short: bool) -> str:
    """The packed dataset of `mix_config`, built once per bench run with the demo dataset's tokenizer, block size,
    validation size and seed (only the mix differs); its folder."""
    manifest = json.loads((ROOT / DATASET_DIR / "manifest.json").read_text())
    out = work / "datasets" / Path(mix_config).stem
    if (out / "manifest.json").is_file():
        return str(out)
    inputs = manifest["inputs"]
    values = {"config": mix_config, "tokenizer_dir": manifest["tokenizer"]["path"], "output_dir": str(out),
              "block_size": manifest["block_size"], "val_tokens": inputs["val_tokens"],
              "shuffle_buffer": inputs["shuffle_buffer"], "seed": manifest["seed"]}
    if short:  # the phases at a fiftieth of the config's tokens: enough blocks for the short runs
        values["target_tokens"] = json.loads((ROOT / mix_config).read_text())["target_tokens"] // 50
    _script("scripts/build_dataset_v5.py", values, f"building {mix_config}")
    return str(out)


def _script(script: str, values: dict, what: str) -> None:
    args = [a for k, v in values.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, list) else str(v))]
    proc = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")


def run(name: str, flags: dict, seed: int, work: Path, short: bool) -> dict:
    manifest = json.loads((ROOT / DATASET_DIR / "manifest.json").read_text())
    run_name = f"{name.replace(' ', '_').replace('+', 'and')}-{seed}"
    flags = dict(flags)
    mix_config = flags.pop("mix_config", None)
    dataset_dir = build(mix_config, work, short) if mix_config else DATASET_DIR
    values = {**BASELINE, **flags, "config": mix_config or manifest["config"]["path"], "seed": seed,
              "run_name": run_name, "dataset_dir": dataset_dir,
              "target_tokens": TARGET_TOKENS // 50 if short else TARGET_TOKENS,
              "global_batch_size": BATCH_SIZE, "batch_size": BATCH_SIZE,
              "eval_steps": EVAL_STEPS // 10 if short else EVAL_STEPS,
              "save_steps": 10**6, "sample_steps": 0, "sample_prompts": [], "logging_steps": 10,
              "checkpoints_dir": str(work / "ckpt"), "logs_dir": str(work / "logs")}
    _script("scripts/train_sparknet_v5.py", values, f"recipe {name!r}")
    meta = json.loads((work / "ckpt" / run_name / "training_metadata.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(work / "logs" / run_name))
    acc.Reload()
    curve = [(e.step, e.value) for e in acc.Scalars("eval/bits_per_byte")]
    return {"name": name, "seed": seed, "loss": meta["metrics"]["eval_loss"],
            "bpb": meta["metrics"]["eval_bits_per_byte"], "tps": meta["metrics"]["tokens_per_second_mean"],
            "curve": curve, "model": str(work / "ckpt" / run_name), "own_data": dataset_dir != DATASET_DIR}


def held_out_scores(results: list[dict], work: Path, short: bool) -> dict[str, dict[str, float]]:
    """Bits per byte of every recipe's final model on the same held-out text, by scripts/eval_perplexity.py: the
    demo dataset's val split ("all") and each source's held-out documents; {model folder: {what: bits/byte}}."""
    scores: dict[str, dict[str, float]] = {r["model"]: {} for r in results}
    for what, data in {"all": DATASET_DIR, **HELD_OUT}.items():
        out = work / "eval" / what  # one folder per text: each results file then holds that text's row only
        values = {"models": [r["model"] for r in results], "data": data, "eval_dir": str(out),
                  "batch_size": 16, "max_documents": 4 if short else 0}
        _script("scripts/eval_perplexity.py", values, f"scoring on {data}")
        for r in results:
            [row] = json.loads((out / Path(r["model"]).name / "perplexity.json").read_text()).values()
            scores[r["model"]][what] = row["bits_per_byte"]
    return scores


def main() -> None:
    if not (ROOT / DATASET_DIR / "manifest.json").is_file():
        raise SystemExit(f"no dataset in {DATASET_DIR}: run `make demo` first (or pass --dataset_dir)")
    unknown = sorted(set(ONLY) - set(RECIPES))
    if unknown:
        raise SystemExit(f"ONLY names no recipe {unknown}: choose among {list(RECIPES)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="sparknet-recipe-") as tmp:
        for name, flags in RECIPES.items():
            if ONLY and name not in ONLY and name != "baseline":
                continue
            for seed in ((0, 1) if name == "baseline" else SEEDS):
                results.append(run(name, flags, seed, Path(tmp), SHORT))
                r = results[-1]
                print(f"{name} (seed {seed}): eval loss {r['loss']:.4f}, bits/byte {r['bpb']:.4f}", flush=True)
        scores = held_out_scores(results, Path(tmp), SHORT)
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
        # a recipe on another mix is evaluated on its own validation split: its trainer figures do not compare
        verdict = "own val split" if r["own_data"] else (
            "tie" if abs(diff) <= noise else ("better" if diff < 0 else "worse"))
        at = dict(r["curve"])
        print(f"| {r['name']} | {r['seed']} | {r['loss']:.4f} | {r['bpb']:.4f} | {diff:+.4f} ({verdict}) | "
              + " | ".join(f"{at.get(m, float('nan')):.4f}" for m in marks) + f" | {r['tps'] or 0:,.0f} |")
    print_held_out(results, scores)


def print_held_out(results: list[dict], scores: dict[str, dict[str, float]]) -> None:
    """The per-source table: every final model on the same text, each column against the baseline's seed mean,
    with the baseline's seed spread in that column as the noise."""
    columns = ["all", *HELD_OUT]
    base = [scores[r["model"]] for r in results if r["name"] == "baseline"]
    mean = {c: sum(b[c] for b in base) / len(base) for c in columns}
    spread = {c: max(b[c] for b in base) - min(b[c] for b in base) for c in columns}
    print(f"\n[held-out text, eval_perplexity] bits/byte on {DATASET_DIR} val (all) and on "
          + ", ".join(f"{label} = {path}" for label, path in HELD_OUT.items())
          + "; baseline seed spread: " + ", ".join(f"{c} {spread[c]:.4f}" for c in columns))
    print("| recipe | seed | " + " | ".join(f"{c} bpb | vs baseline" for c in columns) + " |")
    print("|---|---:|" + "---:|---:|" * len(columns))
    for r in results:
        cells = []
        for c in columns:
            value, diff = scores[r["model"]][c], scores[r["model"]][c] - mean[c]
            verdict = "tie" if abs(diff) <= spread[c] else ("better" if diff < 0 else "worse")
            cells.append(f"{value:.4f} | {diff:+.4f} ({verdict})")
        print(f"| {r['name']} | {r['seed']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    from sparknet.cli import run_script

    run_script(globals(), main)
