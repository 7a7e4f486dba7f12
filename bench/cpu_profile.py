"""Where the demo's training step spends its time on a CPU: torch.profiler over the real trainer's steps.

The demo's recipe (`sparknet-nanochat-demo`, Muon for the hidden matrices, AdamW for the rest, 8 blocks of 256 a
step, vocab 8192) trained by `sparknet.train.run.train` on a synthetic packed dataset; a callback profiles steps
WAIT + 1 .. WAIT + ACTIVE (the first ones, with the allocator's and caches' warm-up, left out). The table splits the
profiled steps' wall-clock time (the `ProfilerStep*` ranges) into the ranges torch and the Trainer mark: the batch
(DataLoader and collation), the backward pass (autograd's functions), the optimizer step, zero_grad, and the rest,
which is the forward pass and the Trainer's own work; the loss (cross-entropy forward and backward) is shown apart,
as is the output layer's matmul. Then the top operators by their own CPU time.

Run: `.venv/bin/python bench/cpu_profile.py` (about a minute on 2 cores), or `--short true` (checks the bench).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESET = "sparknet-nanochat-demo"
BATCH = 8  # blocks per step, the demo's
VOCAB = 8192  # the demo's vocabulary
WAIT = 5  # steps before profiling
ACTIVE = 10  # steps profiled
SHORT = False  # a step or two (checks the bench)

# the profiler's ranges, by what they are in the step
PARTS = {"the batch (DataLoader, collation)": ("enumerate(DataLoader)",),
         "the optimizer step": ("Optimizer.step#",),
         "zero_grad": ("Optimizer.zero_grad#",)}
LOSS_OPS = ("aten::cross_entropy_loss", "NllLossBackward0", "LogSoftmaxBackward0")


def main() -> None:
    import torch
    from _synthetic import write_packed_dataset, write_tokenizer
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import TrainerCallback

    from sparknet.common import runtime
    from sparknet.config.cli import script_constants
    from sparknet.model.presets import get_preset
    from sparknet.train import run as training
    from sparknet.train.data_plan import packed_plan
    from sparknet.train.settings import TrainSettings

    runtime.setup(0)
    wait, active = (1, 2) if SHORT else (WAIT, ACTIVE)
    context = get_preset(PRESET).n_positions
    steps = wait + active + 1
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=wait - 1, warmup=1, active=active))

    class Profiled(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            prof.start()

        def on_step_end(self, args, state, control, **kw):
            prof.step()

        def on_train_end(self, args, state, control, **kw):
            prof.stop()

    build = training.build_trainer

    def with_profiler(*args, **kwargs):
        parts = build(*args, **kwargs)
        parts.trainer.add_callback(Profiled())
        return parts

    with tempfile.TemporaryDirectory(prefix="sparknet-cpu-profile-") as tmp:
        folder = Path(tmp)
        write_tokenizer(folder / "tok", VOCAB, context)
        config = {"path": "synthetic", "seed": 0, "context_length": context, "target_tokens": steps * BATCH * context,
                  "mix": [{"name": "synthetic", "split": "train", "prob": 1.0}]}
        write_packed_dataset(folder / "ds", folder / "tok", VOCAB, context, {"train": steps * BATCH + BATCH, "val": 4},
                             config)
        demo = script_constants("demo.py")
        settings = TrainSettings.from_constants(
            script_constants("train_sparknet_v5.py"), run_name="profile", model_preset=PRESET, batch_size=BATCH,
            global_batch_size=BATCH, optimizer=demo["OPTIMIZER"], learning_rate=demo["LEARNING_RATE"],
            muon_learning_rate=demo["MUON_LEARNING_RATE"], embedding_learning_rate=demo["EMBEDDING_LEARNING_RATE"],
            lr_schedule=demo["LR_SCHEDULE"], decay_ratio=demo["DECAY_RATIO"], eval_steps=10**6, save_steps=10**6,
            sample_steps=0, sample_prompts=[], logging_steps=10**6, checkpoints_dir=str(folder / "ckpt"),
            logs_dir=str(folder / "logs"), target_tokens=steps * BATCH * context)
        training.build_trainer = with_profiler
        try:
            training.train(settings, packed_plan(str(folder / "ds"), None, None))
        finally:
            training.build_trainer = build
    events = prof.key_averages()
    step_us = sum(e.cpu_time_total for e in events if e.key.startswith("ProfilerStep"))

    def total(prefixes: tuple[str, ...]) -> float:
        return sum(e.cpu_time_total for e in events if e.key.startswith(prefixes))

    backward = total(("autograd::engine::evaluate_function",))
    shares = {name: total(prefixes) for name, prefixes in PARTS.items()}
    shares["the backward pass"] = backward
    shares["the forward pass and the Trainer's own work (the rest)"] = step_us - sum(shares.values())
    print(f"\n{PRESET}, {BATCH} x {context} tokens a step, {settings.optimizer}, "
          f"{torch.get_num_threads()} compute threads; {active} steps profiled: {step_us / active / 1e3:.0f} ms a step")
    print("| part of the step | ms a step | share |\n|---|---|---|")
    for name, us in sorted(shares.items(), key=lambda item: -item[1]):
        print(f"| {name} | {us / active / 1e3:.1f} | {us / step_us:.1%} |")
    loss = total(LOSS_OPS)
    print(f"| (within those) the loss: cross-entropy, forward and backward | {loss / active / 1e3:.1f} | "
          f"{loss / step_us:.1%} |")
    print("\ntop operators by their own CPU time:")
    print(events.table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
