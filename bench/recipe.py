"""Which recipe gets more out of each token: recipes trained on the same tokens, scored on the same held-out text.

Every recipe runs the real trainer (`scripts/train_sparknet_v5.py` as a subprocess) on the same packed dataset
(default: the demo's, from `make demo`), with the same budget and batch, for each of SEEDS. Each final model is then
scored by scripts/eval_perplexity.py on the same text: the dataset's val split ("all") and each source's held-out
documents (HELD_OUT, which no recipe trained on). Every finished run is appended to RUNS_FILE at once (one JSON
line: its scores, trainer figures, tokens/s, commit), so a long grid can be run a piece at a time (`--only`,
`--seeds`) and a run already there with the same flags is not trained again.

The table compares each recipe's mean over its seeds with the REFERENCE recipe's mean; a difference within the
reference's seed spread (max - min) is a tie. Tokens/s are as the trainer measured them: on a shared machine they
vary with the load, so compare recipes trained side by side.

Run: `.venv/bin/python bench/recipe.py` (the whole grid: about 3-15 minutes a run on 2 cores, depending on the
load), `--only '["muon"]' --seeds '[0, 1, 2]'` for some, `--table true` to print the table from RUNS_FILE only,
`--speed_steps 40 --only '["bundle + muon 4e-3"]' --seeds '[0, 1]'` for tokens/s side by side (two rounds against
the reference), or `--short true` (a few steps of SHORT_RECIPES into a throw-away file: checks the bench itself,
for CI).

A recipe may train on a share of the budget (`token_share`): whether it reaches the others' loss with fewer tokens,
which is what a recipe whose step costs more must show. A recipe may train on another mix (`mix_config`: a config
with phases, e.g. configs/demo_anneal.json): the bench builds its packed dataset with the dataset's tokenizer,
blocks and validation size, and trains it for the same budget; its trainer figures are then on its own validation
split, and only the held-out scores compare.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATASET_DIR = "datasets/demo"  # a packed dataset (make demo builds this one)
# each source's held-out documents (never in a training split), for the per-source columns
HELD_OUT = {"prose": "data/demo/prose.val.jsonl", "code": "data/demo/code.val.jsonl"}
TARGET_TOKENS = 500_000  # training tokens per run (the demo's budget)
BATCH_SIZE = 8  # blocks per step
EVAL_STEPS = 125  # the trainer's evaluations in between (each costs time; the scores are eval_perplexity's)
# the flags every recipe starts from: the demo's model and warmup
COMMON = {"model_preset": "sparknet-demo", "warmup_ratio": 0.05}
# the NanoChat block with the demo's Muon recipe, which the screening rows change one thing of
NANOCHAT = {"model_preset": "sparknet-nanochat-demo", "optimizer": "muon", "learning_rate": 2e-3,
            "muon_learning_rate": 2e-3}
# the winners together: the embedding at 4x the LR, wsd with a 50% cool-down (the demo's recipe)
BUNDLE = {**NANOCHAT, "lr_schedule": "wsd", "decay_ratio": 0.5, "embedding_learning_rate": 8e-3}
# name -> flags on top of COMMON
RECIPES: dict = {
    # the reference: AdamW on the demo's GPT-2 at each of three peak LRs (its best is REFERENCE)
    "adamw 1e-3": {"optimizer": "adamw", "learning_rate": 1e-3},
    "adamw 2e-3": {"optimizer": "adamw", "learning_rate": 2e-3},
    "adamw 4e-3": {"optimizer": "adamw", "learning_rate": 4e-3},
    # the demo's recipe before this bench: Muon for the hidden matrices
    "muon": {"optimizer": "muon", "learning_rate": 2e-3, "muon_learning_rate": 2e-3},
    "muon 4e-3": {"optimizer": "muon", "learning_rate": 2e-3, "muon_learning_rate": 4e-3},
    "muon 8e-3": {"optimizer": "muon", "learning_rate": 2e-3, "muon_learning_rate": 8e-3},
    # the schedule
    "muon + wsd 50%": {"optimizer": "muon", "learning_rate": 2e-3, "muon_learning_rate": 2e-3, "lr_schedule": "wsd",
                       "decay_ratio": 0.5},
    # the NanoChat block (QK-norm, ReLU², norms without weights, one after the embedding, untied output layer,
    # logits soft-capped at 15) with the demo's Muon
    "nanochat + muon": {"model_preset": "sparknet-nanochat-demo", "optimizer": "muon", "learning_rate": 2e-3,
                        "muon_learning_rate": 2e-3},
    # one change at a time on top of the NanoChat block with Muon
    "nanochat + muon 4e-3": {**NANOCHAT, "muon_learning_rate": 4e-3},
    "nanochat + muon, 80% of the tokens": {**NANOCHAT, "token_share": 0.8},
    "nanochat + muon, embedding LR x4": {**NANOCHAT, "embedding_learning_rate": 8e-3},
    "nanochat + muon, embedding LR x16": {**NANOCHAT, "embedding_learning_rate": 3.2e-2},
    "nanochat + muon + wsd 50%": {**NANOCHAT, "lr_schedule": "wsd", "decay_ratio": 0.5},
    # the winners of the rows above together
    "nanochat + muon + wsd 50%, embedding LR x4": BUNDLE,
    "nanochat + muon + wsd 50%, embedding LR x4, 80% of the tokens": {**BUNDLE, "token_share": 0.8},
    # one change at a time on top of that bundle; "bundle + muon 4e-3" won and is the demo's recipe
    "bundle + muon 4e-3": {**BUNDLE, "muon_learning_rate": 4e-3},
    "bundle + muon 8e-3": {**BUNDLE, "muon_learning_rate": 8e-3},
    "bundle, embedding LR x16": {**BUNDLE, "embedding_learning_rate": 3.2e-2},
    # the mix over time: the demo's mix for 80% of the tokens, then prose alone (configs/demo_anneal.json)
    "anneal": {"optimizer": "adamw", "learning_rate": 2e-3, "mix_config": "configs/demo_anneal.json"},
    "anneal + wsd": {"optimizer": "adamw", "learning_rate": 2e-3, "mix_config": "configs/demo_anneal.json",
                     "lr_schedule": "wsd"},
}
# the width measurement: the demo at width 384 (1.5x), the recipe's LRs carried by nanochat's width rule (AdamW's
# scale with width^-0.5: 2e-3 -> 1.6e-3, 8e-3 -> 6.5e-3; Muon's stays), each optimizer's x0.5 and x2 around it, and
# AdamW on GPT-2 at x0.5, x1 and x2 of its demo best (1e-3) carried by the same rule (8e-4)
WIDE = {**BUNDLE, "model_preset": "sparknet-nanochat-width384", "learning_rate": 1.6e-3,
        "embedding_learning_rate": 6.5e-3, "muon_learning_rate": 4e-3}
RECIPES.update({
    "width 384: adamw 4e-4": {"model_preset": "sparknet-width384", "optimizer": "adamw", "learning_rate": 4e-4},
    "width 384: adamw 8e-4": {"model_preset": "sparknet-width384", "optimizer": "adamw", "learning_rate": 8e-4},
    "width 384: adamw 1.6e-3": {"model_preset": "sparknet-width384", "optimizer": "adamw", "learning_rate": 1.6e-3},
    "width 384: recipe by the width rule": WIDE,
    "width 384: recipe, muon x0.5": {**WIDE, "muon_learning_rate": 2e-3},
    "width 384: recipe, muon x2": {**WIDE, "muon_learning_rate": 8e-3},
    "width 384: recipe, adamw LRs x0.5": {**WIDE, "learning_rate": 8e-4, "embedding_learning_rate": 3.25e-3},
    "width 384: recipe, adamw LRs x2": {**WIDE, "learning_rate": 3.2e-3, "embedding_learning_rate": 1.3e-2},
})
REFERENCE = "adamw 1e-3"  # the recipe every other is compared with (its seed spread is the noise)
SEEDS = [0]  # seeds of each recipe run
ONLY: list = []  # recipe names to run (empty: all)
TABLE = False  # print the table from RUNS_FILE, train nothing
RUNS_FILE = "eval/recipe-runs.jsonl"  # every finished run, one JSON line (under the project root)
SHORT = False  # a few steps of SHORT_RECIPES, recorded in a temporary file (CI)
# >0: no grid; each ONLY recipe (and the reference) trains this many steps, in turn, SEEDS rounds, and the table gives
# tokens/s side by side (the runs of a grid are far apart in time and share the machine with whatever ran then)
SPEED_STEPS = 0
SHORT_RECIPES = ["adamw 1e-3", "muon"]


def build(mix_config: str, work: Path, short: bool) -> str:
    """The packed dataset of `mix_config`, built once per bench run with the dataset's tokenizer, block size,
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


def train(name: str, seed: int, work: Path, short: bool) -> dict:
    """Trains one recipe at one seed; its trainer figures and the folder of its final model."""
    manifest = json.loads((ROOT / DATASET_DIR / "manifest.json").read_text())
    run_name = f"{name.replace(' ', '_').replace('+', 'and')}-{seed}"
    flags = dict(RECIPES[name])
    mix_config = flags.pop("mix_config", None)
    share = flags.pop("token_share", 1.0)  # a share of the budget: how many fewer tokens reach the same loss
    dataset_dir = build(mix_config, work, short) if mix_config else DATASET_DIR
    eval_steps = EVAL_STEPS // 10 if short else EVAL_STEPS
    values = {**COMMON, **flags, "config": mix_config or manifest["config"]["path"], "seed": seed,
              "run_name": run_name, "dataset_dir": dataset_dir,
              "target_tokens": round(share * (TARGET_TOKENS // 50 if short else TARGET_TOKENS)),
              "global_batch_size": BATCH_SIZE, "batch_size": BATCH_SIZE, "eval_steps": eval_steps,
              "save_steps": eval_steps * 10**4, "sample_steps": 0, "sample_prompts": [], "logging_steps": 10,
              "checkpoints_dir": str(work / "ckpt"), "logs_dir": str(work / "logs")}
    _script("scripts/train_sparknet_v5.py", values, f"recipe {name!r} (seed {seed})")
    meta = json.loads((work / "ckpt" / run_name / "training_metadata.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(work / "logs" / run_name))
    acc.Reload()
    return {"trainer_bpb": meta["metrics"]["eval_bits_per_byte"], "eval_loss": meta["metrics"]["eval_loss"],
            "tokens_per_second": meta["metrics"]["tokens_per_second_mean"],
            "curve": [(e.step, round(e.value, 4)) for e in acc.Scalars("eval/bits_per_byte")],
            "own_data": dataset_dir != DATASET_DIR, "model": str(work / "ckpt" / run_name)}


def held_out_scores(model: str, work: Path, short: bool) -> dict[str, float]:
    """Bits per byte of one final model, by scripts/eval_perplexity.py, on the dataset's val split ("all") and on
    each source's held-out documents."""
    scores = {}
    for what, data in {"all": DATASET_DIR, **HELD_OUT}.items():
        out = work / "eval" / what
        values = {"models": [model], "data": data, "eval_dir": str(out), "batch_size": 16,
                  "max_documents": 4 if short else 0}
        _script("scripts/eval_perplexity.py", values, f"scoring on {data}")
        [row] = json.loads((out / Path(model).name / "perplexity.json").read_text()).values()
        scores[what] = round(row["bits_per_byte"], 5)
    return scores


def run_once(name: str, seed: int, runs_file: Path, short: bool) -> dict:
    """Trains and scores one recipe at one seed, appends its record to `runs_file`, and returns it."""
    with tempfile.TemporaryDirectory(prefix="sparknet-recipe-") as tmp:
        result = train(name, seed, Path(tmp), short)
        scores = held_out_scores(result.pop("model"), Path(tmp), short)
    record = {"recipe": name, "seed": seed, "flags": {**COMMON, **RECIPES[name]}, "dataset": DATASET_DIR,
              "tokens": TARGET_TOKENS // 50 if short else TARGET_TOKENS, "held_out": scores, **result,
              "commit": _git("rev-parse", "--short", "HEAD"),
              "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "cpu": _cpu()}
    runs_file.parent.mkdir(parents=True, exist_ok=True)
    with runs_file.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _cpu() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")


def latest_runs(runs_file: Path, tokens: int) -> dict[tuple[str, int], dict]:
    """The newest record of each (recipe, seed) on this dataset and budget, with the recipe's current flags."""
    runs: dict[tuple[str, int], dict] = {}
    if not runs_file.is_file():
        return runs
    for line in runs_file.read_text().splitlines():
        record = json.loads(line)
        name = record["recipe"]
        if (record["dataset"] == DATASET_DIR and record["tokens"] == tokens and name in RECIPES
                and record["flags"] == {**COMMON, **RECIPES[name]}):
            runs[(name, record["seed"])] = record
    return runs


def table(runs: dict[tuple[str, int], dict]) -> str:
    """One row per recipe: its seeds' held-out bits/byte, their mean against the reference's, per source, the
    trainer's own figure and tokens/s."""
    by_recipe: dict[str, list[dict]] = {}
    for (name, _), record in sorted(runs.items(), key=lambda item: item[0][1]):
        by_recipe.setdefault(name, []).append(record)
    reference = by_recipe.get(REFERENCE, [])
    ref_all = [r["held_out"]["all"] for r in reference]
    ref_mean = statistics.mean(ref_all) if ref_all else float("nan")
    spread = max(ref_all) - min(ref_all) if len(ref_all) > 1 else float("nan")
    sources = list(HELD_OUT)
    lines = [f"reference: {REFERENCE}, {len(ref_all)} seed(s), mean {ref_mean:.4f}, seed spread {spread:.4f} "
             f"bits/byte ({DATASET_DIR} val, eval_perplexity)", "",
             "| recipe | seeds: bits/byte | mean | vs reference | " + " | ".join(sources)
             + " | trainer bpb | tokens/s |", "|---|---|---:|---:|" + "---:|" * len(sources) + "---:|---:|"]
    for name in RECIPES:
        records = by_recipe.get(name)
        if not records:
            continue
        values = [r["held_out"]["all"] for r in records]
        mean = statistics.mean(values)
        diff = mean - ref_mean
        verdict = ("reference" if name == REFERENCE else "tie" if not abs(diff) > spread
                   else "better" if diff < 0 else "worse")
        seeds = ", ".join(f"{r['seed']}: {v:.4f}" for r, v in zip(records, values, strict=True))
        per_source = [statistics.mean(r["held_out"][s] for r in records) for s in sources]
        trainer = ("own val" if records[0]["own_data"]
                   else f"{statistics.mean(r['trainer_bpb'] for r in records):.4f}")
        tps = [r["tokens_per_second"] for r in records if r["tokens_per_second"]]
        lines.append(f"| {name} | {seeds} | {mean:.4f} | {diff:+.4f} ({verdict}) | "
                     + " | ".join(f"{v:.4f}" for v in per_source)
                     + f" | {trainer} | {statistics.mean(tps) if tps else 0:,.0f} |")
    return "\n".join(lines)


def speed(names: list[str], steps: int, rounds: int) -> str:
    """Each recipe's training tokens/s (the trainer's mean over `steps` steps), the recipes run one after another in
    each of `rounds` rounds, so that each pair was measured under the same load; and each one's ratio to the
    reference's in the same round."""
    per: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            with tempfile.TemporaryDirectory(prefix="sparknet-recipe-speed-") as tmp:
                flags = {k: v for k, v in RECIPES[name].items() if k not in ("token_share", "mix_config")}
                values = {**COMMON, **flags, "seed": 0, "run_name": "speed", "dataset_dir": DATASET_DIR,
                          "max_steps": steps, "global_batch_size": BATCH_SIZE, "batch_size": BATCH_SIZE,
                          "eval_steps": steps * 10, "save_steps": steps * 10, "sample_steps": 0, "sample_prompts": [],
                          "logging_steps": 10, "checkpoints_dir": str(Path(tmp) / "ckpt"),
                          "logs_dir": str(Path(tmp) / "logs")}
                _script("scripts/train_sparknet_v5.py", values, f"recipe {name!r} (speed)")
                meta = json.loads((Path(tmp) / "ckpt" / "speed" / "training_metadata.json").read_text())
                per[name].append(meta["metrics"]["tokens_per_second_mean"])
    lines = [f"tokens/s over {steps} steps, {rounds} round(s) in turn ({_cpu()}):", "",
             "| recipe | tokens/s by round | against the reference, by round |", "|---|---|---|"]
    for name, values in per.items():
        ratios = [v / r for v, r in zip(values, per[REFERENCE], strict=True)]
        lines.append(f"| {name} | {', '.join(f'{v:,.0f}' for v in values)} | "
                     f"{', '.join(f'{x:.3f}' for x in ratios)} |")
    return "\n".join(lines)


def main() -> None:
    if not (ROOT / DATASET_DIR / "manifest.json").is_file():
        raise SystemExit(f"no dataset in {DATASET_DIR}: run `make demo` first (or pass --dataset_dir)")
    unknown = sorted(set(ONLY + SHORT_RECIPES + [REFERENCE]) - set(RECIPES))
    if unknown:
        raise SystemExit(f"no recipe named {unknown}: choose among {list(RECIPES)}")
    if SPEED_STEPS:
        print(speed([REFERENCE, *[name for name in ONLY if name != REFERENCE]], SPEED_STEPS, len(SEEDS)))
        return
    tokens = TARGET_TOKENS // 50 if SHORT else TARGET_TOKENS
    with tempfile.TemporaryDirectory(prefix="sparknet-recipe-runs-") as scratch:
        runs_file = Path(scratch) / "runs.jsonl" if SHORT else ROOT / RUNS_FILE
        names = [] if TABLE else ONLY or (SHORT_RECIPES if SHORT else list(RECIPES))
        for name in names:
            for seed in SEEDS:
                if (name, seed) in latest_runs(runs_file, tokens):
                    print(f"{name} (seed {seed}): in {runs_file} already", flush=True)
                    continue
                record = run_once(name, seed, runs_file, SHORT)
                print(f"{name} (seed {seed}): held-out bits/byte {record['held_out']['all']:.4f}, trainer "
                      f"{record['trainer_bpb']:.4f}, {record['tokens_per_second'] or 0:,.0f} tokens/s", flush=True)
        print(f"\n[recipes] {DATASET_DIR}, {tokens:,} tokens each; held-out: "
              + ", ".join(f"{label} = {path}" for label, path in HELD_OUT.items()))
        print(table(latest_runs(runs_file, tokens)))


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
