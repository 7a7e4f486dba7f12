"""Muon's training step against AdamW's, side by side, on the demo preset (what `make demo` trains), and the
NanoChat block's step with Muon against both.

One plain PyTorch loop (forward, backward, clipping, optimizer step) per kind on the same batches and seed: AdamW as
the Trainer builds it (weight-decay groups), SparkNet's Muon (`sparknet.model.muon.MuonAdamW`: Newton–Schulz in fp32
off CUDA) and the same with the iteration in bf16, which is what `torch.optim.Muon` does on every device; each on
the GPT-2 demo preset, and Muon on the NanoChat one (KINDS). Rounds are interleaved; each is timed after WARMUP
steps. The table gives ms per step, the optimizer's share, and each step's ratio to AdamW's. Target: Muon/AdamW
<= 1.3 on a CPU without native bf16.

The first lines say what kind of CPU this is: whether lscpu lists avx512_bf16/amx_bf16, and a 256x1024x256 matmul
in bf16 against fp32. To see a CPU without native bf16 on one that has it, cap oneDNN and MKL at AVX2:
`ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 python bench/optimizer_step.py`.

Run: `.venv/bin/python bench/optimizer_step.py` (about a minute on 2 cores).
"""

from __future__ import annotations

import statistics
import subprocess
import time

# name -> (preset, optimizer: adamw, muon, or muon with the bf16 iteration)
KINDS = {"adamw": ("sparknet-demo", "adamw"), "muon": ("sparknet-demo", "muon"),
         "muon, bf16 iteration": ("sparknet-demo", "muon-bf16"), "nanochat + muon": ("sparknet-nanochat-demo", "muon")}
VOCAB = 8192  # the demo's vocabulary
BATCH = 8  # the demo's blocks per step
STEPS = 12  # timed steps per round
WARMUP = 3  # steps left out of each round's timing
ROUNDS = 4  # the optimizers in turn, this many times
LEARNING_RATE = 2e-3  # the demo's (AdamW's and Muon's)


def cpu_kind() -> str:
    """Native bf16 or not, from lscpu's flags and a matmul timed in bf16 and fp32."""
    import torch

    try:
        flags = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        flags = ""
    native = sorted({f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()})
    a, b = torch.randn(256, 1024), torch.randn(1024, 256)
    timings = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        for _ in range(3):
            x @ y
        start = time.perf_counter()
        for _ in range(10):
            x @ y
        timings[dtype] = (time.perf_counter() - start) / 10 * 1e3
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("Model name")), "?")
    return (f"CPU {model}, {torch.get_num_threads()} threads; native bf16 flags: {', '.join(native) or 'none'}; "
            f"256x1024x256 matmul fp32 {timings[torch.float32]:.2f} ms, bf16 {timings[torch.bfloat16]:.2f} ms "
            f"({timings[torch.bfloat16] / timings[torch.float32]:.1f}x)")


def make_optimizer(kind: str, model: object) -> object:
    import torch
    from transformers.trainer_pt_utils import get_parameter_names

    from sparknet.model.muon import MuonAdamW, parameter_groups

    if kind == "adamw":
        decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
        groups = [{"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": 0.1},
                  {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=LEARNING_RATE, betas=(0.9, 0.95))
    muon, adamw = parameter_groups(model, lr=LEARNING_RATE, muon_lr=LEARNING_RATE, weight_decay=0.1)
    return MuonAdamW(muon, adamw, betas=(0.9, 0.95), ns_dtype=torch.bfloat16 if kind == "muon-bf16" else None)


def time_round(kind: str) -> tuple[float, float]:
    """(ms per training step, ms per optimizer step), means over the timed steps."""
    import torch

    from sparknet.model.presets import build_model, get_preset

    preset_name, optimizer_kind = KINDS[kind]
    preset = get_preset(preset_name)
    torch.manual_seed(0)
    model = build_model(preset, VOCAB, eos_token_id=VOCAB - 1).train()
    optimizer = make_optimizer(optimizer_kind, model)
    batches = torch.randint(0, VOCAB, (STEPS + WARMUP, BATCH, preset.n_positions),
                            generator=torch.Generator().manual_seed(0))
    steps, optimizer_steps = [], []
    for index, ids in enumerate(batches):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        if index >= WARMUP:
            steps.append(end - start)
            optimizer_steps.append(end - before)
    return statistics.mean(steps) * 1e3, statistics.mean(optimizer_steps) * 1e3


def main() -> None:
    import logging

    from sparknet.common import runtime

    runtime.setup(0, level=logging.WARNING)
    print(cpu_kind(), flush=True)
    kinds = list(KINDS)
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for round_ in range(ROUNDS):
        for kind in kinds:
            results[kind].append(time_round(kind))
            step, opt = results[kind][-1]
            print(f"round {round_ + 1} {kind}: {step:.0f} ms/step ({opt:.0f} ms optimizer)", flush=True)
    adamw = statistics.median(step for step, _ in results["adamw"])
    print(f"\n[optimizer step] {BATCH} x 256 tokens, vocab {VOCAB}, median of {ROUNDS} rounds")
    print("| kind | preset | ms/step | ms optimizer | step / AdamW's |\n|---|---|---:|---:|---:|")
    for kind in kinds:
        step = statistics.median(s for s, _ in results[kind])
        opt = statistics.median(o for _, o in results[kind])
        print(f"| {kind} | {KINDS[kind][0]} | {step:.0f} | {opt:.0f} | {step / adamw:.2f} |")
    muon = statistics.median(s for s, _ in results["muon"])
    print(f"Muon / AdamW: {muon / adamw:.2f} (target <= 1.3 on a CPU without native bf16)")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
