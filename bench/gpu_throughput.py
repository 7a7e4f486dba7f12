"""Benchmarks training throughput of the 70M preset on one GPU through the real trainer script.

What: `sparknet-70m` (12 layers, width 512, 8 heads, context 1024, vocab 50257) trained by
`scripts/train_sparknet_v5.py`, run as a subprocess with its own flags, eager and compiled (`--compile off/on`) at a
few micro-batch sizes (no accumulation), on a synthetic packed dataset of random tokens (bench/_synthetic.py: a
50257-token byte-level BPE made without training, blocks in the packed format). Prints one table (Markdown).

How: each run writes TensorBoard events into its own logs folder; two figures side by side:
- trainer: its own perf/tokens_per_second and perf/mfu averaged over the logging windows after the first
  (time-weighted), and its perf/device_memory_gb (torch.cuda.max_memory_allocated; RSS on the CPU).
- wall: ours, from the wall-clock stamps of the train/loss events, (steps from the first to the last logging step ×
  tokens per step) / (their time difference); MFU from that with sparknet.model.presets's FLOPs per token and the GPU's
  bf16 peak; peak memory as nvidia-smi sees it (sampled every 0.2 s, less the reading before the run: the CUDA
  context and the allocator's cache included).
The first logging window holds torch.compile's warm-up (and data start-up): both figures exclude it. "warm-up s" is
the time from the event file's creation (before the initial eval) to the first logging step.

Run: `python bench/gpu_throughput.py` on a CUDA machine (under 5 minutes on one H200: a run that would end past
TIME_BUDGET_S is skipped, and says so). Without CUDA, or with `--smoke`, the tiny preset on the CPU (CI, ~25 s on 2
cores). `--dry_run` prints the planned commands. Every constant below is a flag, e.g. `--runs '[["on", 64]]'`.
On the GPU machine: `bash bench/gpu_check.sh`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = False  # the tiny preset on the CPU with a small vocabulary (also chosen when no CUDA GPU is present)
DRY_RUN = False  # print the planned dataset and commands, run nothing
MODEL_PRESET = "sparknet-70m"  # model of the GPU runs
VOCAB_SIZE = 50257  # synthetic tokenizer's size (GPT-2's)
# [--compile, blocks per micro-step, variant], in this order, the most telling first (a run that would end past
# TIME_BUDGET_S is skipped). The variant, comma-separated: "fused" (FUSED_CROSS_ENTROPY=True), "syncdebug" (the
# places where the host waits for the GPU, from torch's sync debug warnings; its speed is not comparable) and/or step
# changes left out (SPARKNET_STEP_OFF: sparknet/train/step_speed.py). Every change on, the fused loss, each change
# off against the same micro-batch; then the micro-batch sizes; eager last.
RUNS = [["on", 64, ""], ["on", 64, "fused"], ["on", 64, "padded_head"], ["on", 64, "fp32_outputs"],
        ["on", 64, "syncdebug"], ["on", 128, "fused"], ["on", 32, ""], ["on", 128, ""], ["on", 64, "gc"],
        ["off", 32, ""]]
STEPS = 80  # optimizer steps per run (no accumulation)
LOGGING_STEPS = 10  # the trainer's logging interval: the first window (warm-up) is excluded
VAL_BLOCKS = 8  # validation blocks (the trainer evaluates at start and end)
TIME_BUDGET_S = 290.0  # skip a run whose estimated duration would end past this many seconds from the start
RUN_TIMEOUT_S = 240.0  # kill a run (its process group) still going after this many seconds
SMOKE_PRESET = "sparknet-tiny"  # model of the smoke runs
SMOKE_VOCAB_SIZE = 512  # vocabulary of the smoke runs
# runs of the smoke mode
SMOKE_RUNS = [["off", 4, ""], ["off", 8, ""], ["off", 8, "padded_head,fp32_outputs,gc"], ["off", 8, "fused"]]
SMOKE_STEPS = 30  # steps per smoke run
CONFIG = "configs/datasets_v5.json"  # mix config recorded in the synthetic manifest and passed to the trainer
SEED = 0  # seed of the synthetic tokens
KEEP = False  # keep the temporary folder (dataset, checkpoints, logs, one trainer log per run)
RESULTS_JSONL = ""  # also append each run's JSON line to this file (bench/gpu_check.sh: $OUT/gpu_throughput.jsonl)
_GUESS_S = {"off": 45.0, "on": 150.0}  # a run's duration before one of its kind has been timed
_NEVER = 10**6  # eval/save interval that never comes within a run


@dataclass
class Row:
    name: str
    compile: str = ""
    micro_batch: int = 0
    variant: str = ""  # "fused" and/or the step changes left out ("": every change on, the unfused loss)
    syncs: list[str] | None = None  # with "syncdebug": where the host waited for the GPU (file:line, once each)
    status: str = ""  # "" when the run exited 0, else why it has no or partial figures
    tps: float | None = None  # trainer's tokens/s
    own_tps: float | None = None  # from the event wall times
    mfu: float | None = None
    own_mfu: float | None = None
    mem_gb: float | None = None  # trainer's peak (torch)
    smi_gb: float | None = None  # nvidia-smi's peak over the run
    s_step: float | None = None
    warmup_s: float | None = None
    run_s: float | None = None


def trainer_command(work: Path, run_name: str, preset: str, compile_: str, batch: int, steps: int,
                    block: int) -> list[str]:
    return [sys.executable, str(ROOT / "scripts/train_sparknet_v5.py"), "--run_name", run_name, "--config", CONFIG,
            "--dataset_dir", str(work / "data"), "--model_preset", preset, "--batch_size", str(batch),
            "--global_batch_size", str(batch), "--target_tokens", str(steps * batch * block), "--compile", compile_,
            "--logging_steps", str(LOGGING_STEPS), "--eval_steps", str(_NEVER), "--save_steps", str(_NEVER),
            "--sample_steps", "0", "--sample_prompts", "[]", "--checkpoints_dir", str(work / "checkpoints"),
            "--logs_dir", str(work / "logs")]


def run_trainer(cmd: list[str], log: Path, changes_off: str = "", sync_debug: bool = False) -> tuple[int, float | None]:
    """Runs the trainer, echoing its output indented and saving it to `log`, killed with its process group after
    RUN_TIMEOUT_S. Returns (exit status, peak GPU memory in GiB above the reading before, by nvidia-smi, or None)."""
    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TORCH_LOGS": os.environ.get("TORCH_LOGS", "recompiles"),
           "SPARKNET_STEP_OFF": changes_off, "SPARKNET_SYNC_DEBUG": "1" if sync_debug else "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def kill() -> None:
        print(f"    [killed after {RUN_TIMEOUT_S:.0f} s]", flush=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(RUN_TIMEOUT_S, kill)
    timer.start()
    try:
        with log.open("w") as f:
            for line in proc.stdout or []:
                f.write(line)
                print("    " + line, end="", flush=True)
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # we were stopped (SIGTERM, Ctrl-C): the trainer and its compile workers go too
            os.killpg(proc.pid, signal.SIGKILL)
        if smi is not None:
            smi.terminate()
    if smi is None:
        return rc, None
    mib = [int(v) for v in smi.communicate(timeout=10)[0].split() if v.isdigit()]
    return rc, (max(mib) - mib[0]) / 1024 if len(mib) > 1 else None


def read_events(log_dir: Path, row: Row, tokens_per_step: int, flops_per_token: float, peak: float | None) -> None:
    """Fills `row` from the run's TensorBoard events (see the module docstring)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not log_dir.is_dir():
        return
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))
    loss = sorted(acc.Scalars("train/loss"), key=lambda e: e.step) if "train/loss" in tags else []
    if not loss:
        return
    first, last = loss[0], loss[-1]
    row.warmup_s = first.wall_time - acc.FirstEventTimestamp()
    if last.step > first.step:
        steps, seconds = last.step - first.step, last.wall_time - first.wall_time
        row.s_step, row.own_tps = seconds / steps, steps * tokens_per_step / seconds
        row.own_mfu = flops_per_token * row.own_tps / peak if peak else None

    def window_mean(tag: str) -> float | None:  # time-weighted: total steps / sum(window steps / window rate)
        points = sorted((e.step, e.value) for e in acc.Scalars(tag) if first.step < e.step <= last.step) \
            if tag in tags else []
        starts = [first.step, *(s for s, _ in points)][: len(points)]
        windows = [(s - start, v) for (s, v), start in zip(points, starts, strict=True) if v > 0]
        return sum(n for n, _ in windows) / sum(n / v for n, v in windows) if windows else None

    row.tps, row.mfu = window_mean("perf/tokens_per_second"), window_mean("perf/mfu")
    if "perf/device_memory_gb" in tags:
        row.mem_gb = max(e.value for e in acc.Scalars("perf/device_memory_gb"))


def print_table(rows: list[Row]) -> None:
    def f(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    print("\n| run | tok/s trainer | tok/s wall | MFU trainer | MFU wall | peak GiB torch | peak GiB smi | s/step "
          "| warm-up s | run s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        name = f"{r.name} ({r.status})" if r.status else r.name
        print(f"| {name} | {f(r.tps, ',.0f')} | {f(r.own_tps, ',.0f')} | {f(r.mfu, '.1%')} | {f(r.own_mfu, '.1%')} "
              f"| {f(r.mem_gb, '.1f')} | {f(r.smi_gb, '.1f')} | {f(r.s_step, '.3f')} | {f(r.warmup_s, '.0f')} "
              f"| {f(r.run_s, '.0f')} |")


def sync_places(log: str) -> list[str]:
    """The places torch's sync debug mode warned about ("path:line: UserWarning: called a synchronizing CUDA
    operation"), in order, once each."""
    places = [line.split(": UserWarning:")[0].strip() for line in log.splitlines()
              if "synchronizing CUDA operation" in line and ": UserWarning:" in line]
    return list(dict.fromkeys(places))


def report_json(row: Row) -> None:
    """One JSON line per run ("JSON {...}" in the output, and in RESULTS_JSONL when set): the figures of each
    configuration, machine-readable, from the first GPU run on."""
    line = json.dumps(asdict(row))
    print(f"JSON {line}", flush=True)
    if RESULTS_JSONL:
        with open(RESULTS_JSONL, "a") as f:
            f.write(line + "\n")


def main() -> None:
    import torch
    from _synthetic import write_packed_dataset, write_tokenizer

    from sparknet.config.mix import load_config
    from sparknet.model.presets import flops_per_token, get_preset, parameter_count, peak_flops

    cuda = torch.cuda.is_available()
    smoke = SMOKE or not (cuda or DRY_RUN)
    if smoke and not SMOKE:
        print("no CUDA GPU here: smoke mode (the tiny preset on the CPU)")
    preset_name, vocab, runs, steps = ((SMOKE_PRESET, SMOKE_VOCAB_SIZE, SMOKE_RUNS, SMOKE_STEPS) if smoke
                                       else (MODEL_PRESET, VOCAB_SIZE, RUNS, STEPS))
    preset = get_preset(preset_name)
    block = preset.n_positions
    device = torch.cuda.get_device_name() if cuda and not smoke else "cpu"
    peak = peak_flops(device, "bf16") if device != "cpu" else None  # the trainer uses bf16 on every GPU with it
    fpt = flops_per_token(preset, vocab, block)
    train_blocks = steps * max(run[1] for run in runs)
    print(f"{preset_name}: {parameter_count(preset, vocab):,} parameters, vocab {vocab}, context {block}, "
          f"{fpt / 1e6:.0f} MFLOP/token; {steps} steps per run, logging every {LOGGING_STEPS}; device {device}"
          f"{f', bf16 peak {peak / 1e12:.1f} TFLOP/s' if peak else ', MFU n/a'}; torch {torch.__version__}")
    print(f"synthetic dataset: {train_blocks} train + {VAL_BLOCKS} val blocks of {block} random tokens")
    work = Path(tempfile.mkdtemp(prefix="sparknet-gpubench-"))
    rows: list[Row] = []
    try:
        if not DRY_RUN:
            write_tokenizer(work / "tokenizer", vocab, block)
            config = load_config(CONFIG)
            write_packed_dataset(work / "data", work / "tokenizer", vocab, block,
                                 {"train": train_blocks, "val": VAL_BLOCKS}, {"path": config.path, **config.to_dict()},
                                 SEED)
        started, took = time.perf_counter(), {k: 0.0 if smoke else v for k, v in _GUESS_S.items()}
        for compile_, batch, *rest in runs:
            row, run_name, (fused, sync_debug, off) = named_run(compile_, batch, rest[0] if rest else "")
            cmd = trainer_command(work, run_name, preset_name, compile_, batch, steps, block)
            cmd += ["--fused_cross_entropy", "true"] if fused else []
            if DRY_RUN:
                print(f"\n[{row.name}] {shlex.join(cmd)}")
                continue
            elapsed = time.perf_counter() - started
            if elapsed + took[compile_] > TIME_BUDGET_S:
                row.status = f"skipped: {elapsed:.0f} s + ~{took[compile_]:.0f} s > TIME_BUDGET_S {TIME_BUDGET_S:.0f}"
                print(f"\n[{row.name}] {row.status}")
                rows.append(row)
                continue
            print(f"\n[{row.name}] {shlex.join(cmd)}", flush=True)
            t = time.perf_counter()
            rc, row.smi_gb = run_trainer(cmd, work / f"{run_name}.log", off, sync_debug)
            if sync_debug:
                row.syncs = sync_places((work / f"{run_name}.log").read_text())
            row.run_s = took[compile_] = time.perf_counter() - t
            row.status = "" if rc == 0 else f"exit {rc}"
            try:
                read_events(work / "logs" / run_name, row, batch * block, fpt, peak)
            except Exception as exc:  # a broken event file is a finding, not a reason to lose the table
                row.status += f"{'; ' if row.status else ''}events unreadable: {type(exc).__name__}: {exc}"
            if row.own_tps is None:
                row.status += f"{'; ' if row.status else ''}no throughput figure"
            rows.append(row)
            print_table(rows[-1:])
            report_json(row)
        if rows:
            print_table(rows)
    finally:
        if KEEP:
            print(f"\nkept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = any(r.status and not r.status.startswith("skipped") for r in rows)
    if failed or (rows and not any(r.own_tps for r in rows)):
        raise SystemExit(1)


def named_run(compile_: str, batch: int, variant: str) -> tuple[Row, str, tuple[bool, bool, str]]:
    """A run's table row and run name, and what its variant asks: (fused loss, sync debug, step changes off)."""
    parts = [v.strip() for v in variant.split(",") if v.strip()]
    fused, sync_debug = "fused" in parts, "syncdebug" in parts
    off = ",".join(v for v in parts if v not in ("fused", "syncdebug"))
    row = Row(f"{'compiled' if compile_ == 'on' else 'eager'} bs{batch}" + (" fused" if fused else "")
              + (" sync debug" if sync_debug else "") + (f" without {off}" if off else ""), compile_, batch, variant)
    run_name = f"bench-{compile_}-bs{batch}" + ("-fused" if fused else "") + (
        "-syncdebug" if sync_debug else "") + (f"-no-{off.replace(',', '-')}" if off else "")
    return row, run_name, (fused, sync_debug, off)


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` around us: clean up the run in flight
    from sparknet.config.cli import run_script

    run_script(globals(), main)
