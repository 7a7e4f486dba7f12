"""Does torch.compile pay on a CPU? The packed trainer with COMPILE off and on, side by side in one run.

COMPILE=auto compiles on CUDA only. On a CPU the question is the whole run, compilation counted: the demo trains
about 225 steps, so a faster step has to win back the seconds the compilation costs. Each preset of PRESETS (the
demo's NanoChat model, and the tiny presets the tests and first tries use) trains STEPS steps of the demo's batch (8
blocks) and recipe (Muon, whose step is not compiled; DEMO_RECIPE) with COMPILE off and on, ROUNDS rounds
alternating, on a small build of the demo corpus (blocks of 256, or the preset's context where shorter). Figures per
run: its wall-clock seconds (start-up and compilation included), the trainer's tokens/s (the first logging window,
which holds the compilation, left out), and the demo's training projected from them: the start-up and compilation
once, then the demo's steps at that speed.

Run: `.venv/bin/python bench/cpu_compile.py` (about 10 minutes on 2 cores), or `--short true` (checks the bench).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_threads import cpu_line, prepare, run, torch_default_threads

PRESETS: list = ["sparknet-nanochat-demo", "sparknet-demo", "sparknet-nanochat-tiny", "sparknet-tiny"]
STEPS = 60  # optimizer steps per run
BATCH_SIZE = 8  # blocks per step, the demo's
DEMO_STEPS = 225  # the demo's optimizer steps (460,000 tokens in steps of 8 x 256)
ROUNDS = 1  # each setting's runs; the median is reported
DEMO_RECIPE = True  # the demo's optimizer and schedule (Muon's step is not compiled); False: the trainer's AdamW
SHORT = False  # a few steps (checks the bench)


def main() -> None:
    from sparknet.config.cli import script_constants
    from sparknet.model.presets import get_preset

    python = sys.executable
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    print(cpu_line(torch_default_threads(python, env)), flush=True)
    steps, rounds = (6, 1) if SHORT else (STEPS, ROUNDS)
    demo = script_constants("demo.py")  # the demo's recipe: Muon, its learning rates, wsd
    recipe = [] if not DEMO_RECIPE else [
        "--optimizer", demo["OPTIMIZER"], "--learning_rate", demo["LEARNING_RATE"], "--muon_learning_rate",
        demo["MUON_LEARNING_RATE"], "--embedding_learning_rate", demo["EMBEDDING_LEARNING_RATE"], "--lr_schedule",
        demo["LR_SCHEDULE"], "--decay_ratio", demo["DECAY_RATIO"]]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="sparknet-cpu-compile-") as tmp:
        work = Path(tmp)
        for block in sorted({min(256, get_preset(preset).n_positions) for preset in PRESETS}):
            prepare(work, python, env, steps * BATCH_SIZE * block * 2, block)
        for round_ in range(rounds):
            for preset in PRESETS:
                block = min(256, get_preset(preset).n_positions)
                for setting in ("off", "on"):
                    name = f"{preset}-{setting}-{round_}"
                    seconds, _ = run([python, "scripts/train_sparknet_v5.py", "--run_name", name, "--dataset_dir",
                                      work / f"ds{block}", "--model_preset", preset, "--max_steps",
                                      steps, "--global_batch_size", BATCH_SIZE, "--batch_size", BATCH_SIZE, *recipe,
                                      "--compile", setting, "--eval_steps", 10_000, "--save_steps", 10_000,
                                      "--sample_steps", 0, "--logging_steps", max(1, steps // 6),
                                      "--checkpoints_dir", work / "ckpt", "--logs_dir", work / "logs"], env)
                    metadata = json.loads((work / "ckpt" / name / "training_metadata.json").read_text())
                    speed = metadata["metrics"]["tokens_per_second_mean"]
                    results.setdefault((preset, setting), []).append((seconds, speed))
                    print(f"  {preset}, compile {setting}: {seconds:.0f} s, {speed:,.0f} tokens/s", flush=True)
    print(f"\n{steps} steps of {BATCH_SIZE} blocks; median of {rounds} round(s); the demo projected: the run's "
          f"seconds less its steps at its speed (start-up, compilation), plus {DEMO_STEPS} steps at its speed")
    print("| preset | compile | run seconds | tokens/s | on against off (tokens/s) | the demo projected (s) |\n"
          "|---|---|---|---|---|---|")
    for preset in PRESETS:
        block = min(256, get_preset(preset).n_positions)
        per_step = BATCH_SIZE * block
        off_speed = statistics.median(s for _, s in results[(preset, "off")])
        for setting in ("off", "on"):
            seconds = statistics.median(r for r, _ in results[(preset, setting)])
            speed = statistics.median(s for _, s in results[(preset, setting)])
            fixed = seconds - steps * per_step / speed
            projected = fixed + DEMO_STEPS * per_step / speed
            print(f"| {preset} | {setting} | {seconds:.0f} | {speed:,.0f} | {speed / off_speed:.2f}x | "
                  f"{projected:.0f} |")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
