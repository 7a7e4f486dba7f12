"""FSDP through the real trainer on a GPU machine (a check, not a benchmark): one process under
`accelerate launch --config_file configs/accelerate_fsdp.yaml --num_processes 1`, which still takes FSDP's sharded
save, resume and export paths. For each tiny preset (GPT-2 and Llama), on a synthetic packed dataset:

1. the run is stopped by SIGINT after its first checkpoint, whose completion marker must list the sharded state
   (files in sub-folders);
2. the same command resumes from it and finishes;
3. the export holds full safetensors weights: `AutoModelForCausalLM` loads them, every tensor has its full shape,
   and the logits are finite.

Without CUDA it checks the one thing a CPU can: that the launch is refused in one line. Prints PASS/FAIL per
preset; exit status 1 on any failure. Run: `python3 bench/gpu_fsdp_check.py` (about a minute on a GPU); part of
bench/gpu_check.sh (FSDP=1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
PRESETS = ["sparknet-tiny", "sparknet-llama-tiny"]
VOCAB = 512
STEPS = 20  # optimizer steps per run; a checkpoint every 5
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def command(work: Path, preset: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "configs/accelerate_fsdp.yaml"), "--num_processes", "1", "--mixed_precision", "no",
            str(ROOT / "scripts/train_sparknet_v5.py"), "--run_name", preset, "--config", "configs/datasets_v5.json",
            "--dataset_dir", str(work / "data"), "--model_preset", preset, "--global_batch_size", "8",
            "--batch_size", "8", "--target_tokens", str(STEPS * 8 * 128), "--eval_steps", "5", "--save_steps", "5",
            "--sample_steps", "0", "--logging_steps", "5", "--compile", "off",
            "--checkpoints_dir", str(work / "ckpt"), "--logs_dir", str(work / "logs")]


def check(work: Path, preset: str) -> list[str]:
    """The problems found for one preset (empty: it passed)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    run_dir = work / "ckpt" / preset
    proc = subprocess.Popen(command(work, preset), env=ENV, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while not (run_dir / "checkpoint-5" / ".complete").exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            return [f"no complete checkpoint-5 (exit {proc.poll()}):\n{proc.communicate()[0][-3000:]}"]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    first = proc.communicate(timeout=120)[0]
    problems = []
    checkpoints = sorted(run_dir.glob("checkpoint-*"))
    if "checkpoint saved in" not in first:
        problems.append(f"SIGINT did not save a checkpoint:\n{first[-2000:]}")
    marker = json.loads((checkpoints[-1] / ".complete").read_text())
    listed = list(marker["files"])
    print(f"{preset}: {checkpoints[-1].name} marker lists {len(listed)} files: {listed[:8]}")
    if not any("/" in name for name in listed):
        problems.append("the checkpoint's marker lists no sharded state in a sub-folder")
    second = subprocess.run(command(work, preset), env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = second.stdout + second.stderr
    if second.returncode != 0 or "resuming from" not in out:
        return [*problems, f"the resume failed (exit {second.returncode}):\n{out[-3000:]}"]
    weights = run_dir / "model.safetensors"
    if not weights.is_file():
        return [*problems, f"the export holds no model.safetensors: {sorted(p.name for p in run_dir.iterdir())}"]
    model = AutoModelForCausalLM.from_pretrained(str(run_dir))
    with safe_open(str(weights), "pt") as f:
        saved = {key: f.get_slice(key).get_shape() for key in f.keys()}  # safe_open has no iterator
    expected = {name: list(p.shape) for name, p in model.named_parameters()}
    short = {k: (saved.get(k), v) for k, v in expected.items() if k in saved and list(saved[k]) != v}
    if short:
        problems.append(f"exported tensors are not full (saved, expected): {short}")
    if not torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all():
        problems.append("the exported model's logits are not finite")
    meta = json.loads((run_dir / "training_metadata.json").read_text())
    if meta["steps"] != STEPS or meta["tokens_seen"] != STEPS * 8 * 128:
        problems.append(f"metadata: steps {meta['steps']}, tokens_seen {meta['tokens_seen']}")
    return problems


def main() -> None:
    import torch
    from _synthetic import write_packed_dataset, write_tokenizer

    from sparknet.config.mix import load_config

    work = Path(tempfile.mkdtemp(prefix="sparknet-fsdp-"))
    write_tokenizer(work / "tokenizer", VOCAB, 128)
    config = load_config("configs/datasets_v5.json")
    write_packed_dataset(work / "data", work / "tokenizer", VOCAB, 128, {"train": 400, "val": 16},
                         {"path": config.path, **config.to_dict()})
    if not torch.cuda.is_available():
        proc = subprocess.run(command(work, PRESETS[0]), env=ENV, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        refused = "an FSDP launch" in proc.stdout + proc.stderr and proc.returncode != 0
        print(f"no CUDA: the FSDP launch is {'refused in one line: PASS' if refused else 'not refused: FAIL'}")
        raise SystemExit(0 if refused else 1)
    failed = False
    for preset in PRESETS:
        problems = check(work, preset)
        print(f"{preset}: {'PASS' if not problems else 'FAIL'}")
        for problem in problems:
            print(f"  {problem}")
        failed |= bool(problems)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
