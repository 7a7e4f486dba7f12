"""What the eval loss per source costs: the Trainer's evaluate() with and without the per-source accounting, side by
side in one process on the same model and the same validation blocks.

"plain" is SparkTrainer evaluating the validation blocks as they are (the model's own loss); "per source" is the
same Trainer class evaluating them with their tokens' sources (SparkTrainer.compute_loss's per-token loss, the
scatter of each block's sums per source, the reduction at the end), as both trainers run it. The validation tokens
get SOURCES sources in runs of about a document's length, so that blocks join sources as packing makes them do.
Rounds alternate plain and per source; each evaluate() is timed whole (the device synchronised at its end), after
one untimed evaluate() of each. The table gives seconds per evaluate() and the ratio per source / plain per round,
and the median ratio. Target: ratio <= 1.10 (issue 33).

Run: `.venv/bin/python bench/eval_per_source.py` (CPU: tiny and demo presets, about a minute on 2 cores); on a GPU the
70M preset (`--presets '["sparknet-70m"]'`).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparknet.train.data_plan import PackedPlan
    from sparknet.train.hf_trainer import SparkTrainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS: list[str] | None = None  # None: sparknet-70m on CUDA, sparknet-tiny and sparknet-demo on the CPU
VAL_BLOCKS = 64  # validation blocks evaluated per evaluate()
BATCH: int | None = None  # blocks per eval batch (None: 32 for 70M, 8 otherwise)
ROUNDS = 5  # plain and per source, alternating, this many times
SOURCES = 4  # mix sources the validation tokens are spread over
VOCAB = 8192  # synthetic vocabulary for the CPU presets (the 70M preset uses 50257)


def _plan(folder: Path, preset: str, batch: int) -> tuple[PackedPlan, int]:
    """A synthetic packed dataset's plan, its validation tokens spread over SOURCES sources; and its vocabulary."""
    import numpy as np
    from _synthetic import write_packed_dataset, write_tokenizer

    from sparknet.model.presets import get_preset
    from sparknet.train.data_plan import packed_plan

    context = get_preset(preset).n_positions
    vocab = 50257 if preset == "sparknet-70m" else VOCAB
    write_tokenizer(folder / "tok", vocab, context)
    config = {"path": "synthetic", "seed": 0, "context_length": context, "target_tokens": batch * context,
              "mix": [{"name": "synthetic", "split": "train", "prob": 1.0}]}
    write_packed_dataset(folder / "ds", folder / "tok", vocab, context, {"train": batch, "val": VAL_BLOCKS}, config)
    plan = packed_plan(str(folder / "ds"), None, None)
    # the synthetic dataset has one source: its validation tokens get SOURCES, in runs of 50 to 500 tokens
    rng = np.random.default_rng(0)
    runs = rng.integers(50, 500, size=VAL_BLOCKS * context // 50)
    ids = np.repeat(rng.integers(0, SOURCES, size=len(runs)), runs)[: VAL_BLOCKS * context]
    plan.val_sources = ids.reshape(VAL_BLOCKS, context).astype(np.uint16)
    plan.source_labels = [f"source-{i}" for i in range(SOURCES)]
    return plan, vocab


def _trainers(plan: PackedPlan, vocab: int, preset: str, batch: int, out: Path) -> tuple[SparkTrainer, SparkTrainer]:
    """Two SparkTrainers on one model, with the real TrainingArguments: without and with the sources."""
    import torch
    from transformers import default_data_collator
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sparknet.common.runtime import device_info
    from sparknet.config.cli import script_constants
    from sparknet.model.presets import build_model, get_preset
    from sparknet.train.batch import plan_batch
    from sparknet.train.hf_trainer import SparkTrainer, training_arguments
    from sparknet.train.settings import TrainSettings

    settings = TrainSettings.from_constants(script_constants("train_sparknet_v5.py"), run_name="bench",
                                            model_preset=preset, batch_size=batch, global_batch_size=batch,
                                            sample_prompts=[], checkpoints_dir=str(out), logs_dir=str(out))
    args = training_arguments(settings, output_dir=out, max_steps=1, batch=plan_batch(batch, batch, 1),
                              device=device_info(), fresh=True)
    torch.manual_seed(0)
    model = build_model(get_preset(preset), vocab, eos_token_id=vocab - 1)
    trainers = []
    for dataset, labels in ((plan.val, None), (plan.eval_dataset(), plan.source_labels)):
        trainer = SparkTrainer(model=model, args=args, eval_dataset=dataset, data_collator=default_data_collator,
                               source_labels=labels)
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        trainers.append(trainer)
    return tuple(trainers)


def _timed(trainer: SparkTrainer) -> tuple[float, dict[str, Any]]:
    """One evaluate(), timed whole (the device synchronised at its end), and its metrics."""
    import torch

    started = time.perf_counter()
    metrics = trainer.evaluate()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started, metrics


def main() -> None:
    import logging

    import torch

    from sparknet.common import runtime

    runtime.setup(0, level=logging.WARNING)
    cuda = torch.cuda.is_available()
    presets = PRESETS or (["sparknet-70m"] if cuda else ["sparknet-tiny", "sparknet-demo"])
    rows = []
    for preset in presets:
        batch = BATCH or (32 if preset == "sparknet-70m" else 8)
        with tempfile.TemporaryDirectory(prefix="sparknet-eval-per-source-") as tmp:
            plan, vocab = _plan(Path(tmp), preset, batch)
            plain, sourced = _trainers(plan, vocab, preset, batch, Path(tmp) / "out")
            _timed(plain), _timed(sourced)  # warm-up: allocator, caches, accelerate's preparation
            for round_ in range(ROUNDS):
                plain_s, plain_metrics = _timed(plain)
                sourced_s, sourced_metrics = _timed(sourced)
                # the same figure both ways: the per-source loss is the overall one split, not another computation
                gap = abs(sourced_metrics["eval_loss"] - plain_metrics["eval_loss"])
                rows.append((preset, round_ + 1, plain_s, sourced_s, gap))
                print(f"{preset} round {round_ + 1}: plain {plain_s:.3f} s, per source {sourced_s:.3f} s, ratio "
                      f"{sourced_s / plain_s:.3f} (eval loss differs by {gap:.1e})", flush=True)
    print(f"\n[eval per source] {VAL_BLOCKS} validation blocks over {SOURCES} sources, {ROUNDS} alternating rounds "
          f"after one untimed; device {runtime.device_info()['name']}")
    print("| preset | round | plain s | per source s | ratio |\n|---|---:|---:|---:|---:|")
    for preset, round_, plain_s, sourced_s, _ in rows:
        print(f"| {preset} | {round_} | {plain_s:.3f} | {sourced_s:.3f} | {sourced_s / plain_s:.3f} |")
    for preset in presets:
        ratios = [s / p for name, _, p, s, _ in rows if name == preset]
        print(f"{preset}: median ratio per source / plain {statistics.median(ratios):.3f} (target <= 1.10)")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
