"""What the HF Trainer and SparkNet's callbacks cost: our full training step against a minimal PyTorch loop.

Same model (a preset built by sparknet.model.presets), same batches (a synthetic packed dataset read in the same random
order), same optimizer (AdamW with the Trainer's weight-decay groups, fused on CUDA), same LR schedule and gradient
clipping, bf16 autocast and torch.compile on CUDA as the trainer does. "ours" is `sparknet.train.run.train` (Trainer,
metrics, sampling off, safety, logging every LOGGING_STEPS); "plain" is the loop below. Each is timed from the end
of its WARMUP-th step to the end of its last (compilation and start-up left out), rounds interleaved; the table
gives tokens/s and the ratio ours/plain per round and its median. Target: ratio >= 0.95.

Run: `.venv/bin/python bench/trainer_overhead.py` (CPU: tiny and demo presets, about a minute on 2 cores); on a GPU
the 70M preset at 32 x 1024 (`--presets '["sparknet-70m"]'`).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS: list[str] | None = None  # None: sparknet-70m on CUDA, sparknet-tiny and sparknet-demo on the CPU
STEPS = 60  # optimizer steps per timed run
WARMUP = 10  # steps left out of the timing (compilation, allocator, caches)
ROUNDS = 2  # ours and plain, interleaved, this many times
LOGGING_STEPS = 10  # our logging interval (logging is part of our step's cost)
BATCH: int | None = None  # blocks per step (None: 32 for 70M, 8 otherwise)
VOCAB = 8192  # synthetic vocabulary for the CPU presets (the 70M preset uses 50257)


def _dataset(folder: Path, preset_name: str, steps: int, batch: int) -> tuple[Path, int]:
    from _synthetic import write_packed_dataset, write_tokenizer

    from sparknet.model.presets import get_preset

    context = get_preset(preset_name).n_positions
    vocab = 50257 if preset_name == "sparknet-70m" else VOCAB
    write_tokenizer(folder / "tok", vocab, context)
    config = {"path": "synthetic", "seed": 0, "context_length": context, "target_tokens": steps * batch * context,
              "mix": [{"name": "synthetic", "split": "train", "prob": 1.0}]}
    write_packed_dataset(folder / "ds", folder / "tok", vocab, context, {"train": steps * batch + batch, "val": 4},
                         config)
    return folder / "ds", context


class StepClock:
    """Wall-clock time at the end of the WARMUP-th and of the last optimizer step, the device synchronised there
    only (a sync at every step would serialise the host's work with the device's, which neither loop does)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def tick(self, step: int) -> None:
        import torch

        if step in (WARMUP, STEPS):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())

    def rate(self, tokens_per_step: int) -> float:
        return (STEPS - WARMUP) * tokens_per_step / (self.ends[-1] - self.ends[0])


def run_ours(dataset: Path, preset: str, batch: int, out: Path) -> StepClock:
    from transformers import TrainerCallback

    from sparknet.config.cli import script_constants
    from sparknet.train import run as training
    from sparknet.train.data_plan import packed_plan
    from sparknet.train.settings import TrainSettings

    clock = StepClock()

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            clock.tick(state.global_step)

    build = training.build_trainer

    def with_clock(*args, **kwargs):
        parts = build(*args, **kwargs)
        parts.trainer.add_callback(Clock())
        return parts

    training.build_trainer = with_clock
    try:
        settings = TrainSettings.from_constants(
            script_constants("train_sparknet_v5.py"), run_name="overhead", model_preset=preset, target_tokens=None,
            batch_size=batch, global_batch_size=batch, eval_steps=10**6, save_steps=10**6, sample_steps=0,
            sample_prompts=[], logging_steps=LOGGING_STEPS, checkpoints_dir=str(out / "ckpt"),
            logs_dir=str(out / "logs"))
        settings.target_tokens = STEPS * batch * get_context(preset)
        training.train(settings, packed_plan(str(dataset), None, None))
    finally:
        training.build_trainer = build
    return clock


def get_context(preset: str) -> int:
    from sparknet.model.presets import get_preset

    return get_preset(preset).n_positions


def run_plain(dataset: Path, preset: str, batch: int) -> StepClock:
    import torch
    from transformers.trainer_pt_utils import get_parameter_names

    from sparknet.common.runtime import device_info
    from sparknet.config.cli import script_constants
    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.model.presets import build_model, get_preset

    constants = script_constants("train_sparknet_v5.py")
    device = device_info()
    cuda = device["kind"] == "cuda"
    data = PackedDataset(str(dataset), "train")
    torch.manual_seed(0)
    model = build_model(get_preset(preset), 50257 if preset == "sparknet-70m" else VOCAB,
                        eos_token_id=(50257 if preset == "sparknet-70m" else VOCAB) - 1)
    model = model.to("cuda" if cuda else "cpu").train()
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
    groups = [{"params": [p for n, p in model.named_parameters() if n in decay],
               "weight_decay": constants["WEIGHT_DECAY"]},
              {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=constants["LEARNING_RATE"], betas=tuple(constants["ADAM_BETAS"]),
                                  fused=cuda)
    warm = max(1, round(STEPS * constants["WARMUP_RATIO"]))
    floor = constants["MIN_LR_RATIO"]

    def lr_at(step: int) -> float:  # linear warmup, then cosine to the floor (the Trainer's cosine_with_min_lr)
        if step < warm:
            return step / warm
        progress = (step - warm) / max(1, STEPS - warm)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    forward = torch.compile(model) if cuda else model
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True,
                                         pin_memory=cuda, generator=torch.Generator().manual_seed(0))
    clock = StepClock()
    for step, inputs in enumerate(loader):
        if step == STEPS:
            break
        ids = inputs["input_ids"].to(model.device, non_blocking=True)
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bool(device["bf16"])):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), constants["MAX_GRAD_NORM"])
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick(step + 1)
    return clock


def main() -> None:
    import logging

    import torch

    from sparknet.common import runtime

    runtime.setup(0, level=logging.WARNING)
    cuda = torch.cuda.is_available()
    presets = PRESETS or (["sparknet-70m"] if cuda else ["sparknet-tiny", "sparknet-demo"])
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for preset in presets:
        batch = BATCH or (32 if preset == "sparknet-70m" else 8)
        with tempfile.TemporaryDirectory(prefix="sparknet-overhead-") as tmp:
            dataset, context = _dataset(Path(tmp), preset, STEPS, batch)
            tokens = batch * context
            for round_ in range(ROUNDS):
                ours = run_ours(dataset, preset, batch, Path(tmp) / f"run{round_}").rate(tokens)
                plain = run_plain(dataset, preset, batch).rate(tokens)
                rows.append((preset, round_ + 1, ours, plain))
                print(f"{preset} round {round_ + 1}: ours {ours:,.0f} tokens/s, plain {plain:,.0f} tokens/s, "
                      f"ratio {ours / plain:.3f}", flush=True)
    print(f"\n[trainer overhead] {STEPS} steps, the first {WARMUP} untimed; device {runtime.device_info()['name']}")
    print("| preset | round | ours tokens/s | plain tokens/s | ratio |\n|---|---:|---:|---:|---:|")
    for preset, round_, ours, plain in rows:
        print(f"| {preset} | {round_} | {ours:,.0f} | {plain:,.0f} | {ours / plain:.3f} |")
    for preset in presets:
        ratios = [o / p for name, _, o, p in rows if name == preset]
        print(f"{preset}: median ratio ours/plain {statistics.median(ratios):.3f} (target >= 0.95)")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
