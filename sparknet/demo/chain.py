"""Running the demo chain: each step is one of the real scripts, started as the user would start it.

A Ctrl-C (or SIGTERM, or SIGHUP from a closed terminal) while a step runs reaches that step's script exactly once,
forwarded from here: the script runs in its own process group, so the terminal's signal to the foreground group (make,
this process) does not reach it a second time, which the trainers take as "abort, do not save". The script stops as it
would on its own (the trainer saves a checkpoint, the build its position) and the demo says how to go on.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from sparknet.common.errors import UserError
from sparknet.common.runtime import PROJECT_ROOT

DemoState = Literal["new", "finished", "interrupted"]


class Chain:
    """Runs scripts/ one after another, printing each command and its time; stops at the first failure."""

    def __init__(self) -> None:
        self.started = time.time()
        self.timings: list[tuple[str, float]] = []

    def step(self, title: str, script: str, *args: object) -> None:
        """Runs `python scripts/<script> <args>` from the project root."""
        argv = [f"scripts/{script}", *(str(a) for a in args)]
        print(f"\n=== {title}\n$ python {shlex.join(argv)}", flush=True)
        t = time.time()
        code, stopped_by = run_forwarding_signals([sys.executable, *argv])
        if stopped_by is not None or code in (129, 130, 143, -signal.SIGHUP, -signal.SIGINT, -signal.SIGTERM):
            print(f"\ndemo stopped during '{title}' (what it saved is said above): run the same command (make demo)"
                  " to resume; make clean-demo starts over", file=sys.stderr, flush=True)
            raise SystemExit(128 + (stopped_by or signal.SIGINT))
        if code != 0:
            raise UserError(f"demo step '{title}' failed (exit status {code}); its messages are above")
        self.timings.append((title, time.time() - t))

    def skip(self, title: str, reason: str) -> None:
        """A step whose output is already there (resuming an interrupted demo)."""
        print(f"\n=== {title}\n{reason}", flush=True)

    def summary(self, outputs: dict[str, str]) -> None:
        """Prints where everything went and how long each step took."""
        print(f"\n=== demo finished in {time.time() - self.started:.0f} s on {machine()}")
        width = max(len(title) for title, _ in self.timings) if self.timings else 0
        for title, seconds in self.timings:
            print(f"  {title:<{width}} {seconds:6.1f} s")
        print("outputs:")
        for what, where in outputs.items():
            print(f"  {what:<20} {where}")


def machine() -> str:
    """The CPU the timings came from: model, cores, and whether it has native bf16 (it changes what is fast)."""
    import os

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
    except OSError:
        return f"{os.cpu_count()} cores"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    native = any(flag in flags for flag in ("avx512_bf16", "amx_bf16"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} cores of {model} ({'native bf16' if native else 'no native bf16'})"


def run_forwarding_signals(command: list[str]) -> tuple[int, int | None]:
    """Runs `command` from the project root in its own process group, passing SIGINT, SIGTERM and SIGHUP on to it (see
    the module docstring); returns (its exit status, the first signal forwarded or None)."""
    child = subprocess.Popen(command, cwd=PROJECT_ROOT, process_group=0)
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, received[0] if received else None


def demo_state(run_name: str, dataset_dir: str, export_dir: str) -> tuple[DemoState, str]:
    """How the previous demo ended, and a line saying what this one does about it: "new" (no demo here),
    "finished" (trained and exported: this one starts over) or "interrupted" (a run, or a dataset build, left
    unfinished: this one resumes it)."""
    from sparknet.common.runtime import project_path
    from sparknet.run_files import METADATA, RUN_CONFIG
    from sparknet.train.folders import latest_complete_checkpoint

    run_dir = project_path("checkpoints") / run_name
    dataset = project_path(dataset_dir)
    building = dataset.with_name(f".{dataset.name}.building")
    trained = (run_dir / METADATA).is_file()
    if trained and (project_path(export_dir) / "README.md").is_file():
        return "finished", (f"a finished demo is in {_shown(run_dir)}: starting over (its run, evaluation and export "
                            "are replaced)")
    if (run_dir / RUN_CONFIG).is_file() or building.is_dir():
        checkpoint = latest_complete_checkpoint(run_dir) if run_dir.is_dir() else None
        where = ("its training finished" if trained else f"{_shown(checkpoint)} saved" if checkpoint else
                 "its dataset build stopped" if building.is_dir() else "no checkpoint yet")
        return "interrupted", (f"resuming the interrupted demo ({where}): finished steps are reused; make clean-demo "
                               "starts over")
    return "new", "no previous demo: starting one"


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def remove_previous_run(run_name: str) -> None:
    """Deletes the demo's own previous run, so that every demo trains afresh."""
    import shutil

    from sparknet.common.runtime import project_path

    for folder in (project_path("checkpoints") / run_name, project_path("logs") / run_name,
                   project_path("eval") / run_name):
        if folder.exists():
            shutil.rmtree(folder)


def report(run_name: str, dataset_dir: str, export_dir: str) -> None:
    """Prints eval loss at start and end against the corpus's unigram entropy, the final sample, the perplexity and
    benchmark tables and where the model card is; fails the demo when the model did not learn more than token
    frequencies."""
    import numpy as np

    from sparknet.common.runtime import project_path
    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.model.metrics import unigram_entropy
    from sparknet.run_files import read_metadata

    run_dir = project_path("checkpoints") / run_name
    metadata = read_metadata(run_dir)
    if metadata is None:
        raise UserError(f"{run_dir} holds no training_metadata.json: the training step did not finish")
    train = PackedDataset(dataset_dir, "train")
    entropy = unigram_entropy(np.asarray(train.tokens), train.manifest["tokenizer"]["vocab_size"])
    m = metadata["metrics"]
    print(f"\neval loss: {m['eval_loss_start']:.3f} at start -> {m['eval_loss']:.3f} at the end "
          f"(bits per byte {m['eval_bits_per_byte']:.3f}); unigram entropy of the corpus: {entropy:.3f} nats/token")
    samples = sorted(run_dir.glob("sample_step*.txt"))
    if samples:
        print(f"\nsample ({samples[-1].name}):\n{samples[-1].read_text(encoding='utf-8').strip()}")
    for name in ("perplexity.md", "benchmarks.md"):
        table = project_path("eval") / run_name / name
        if table.is_file():
            print(f"\n{_shown(table)}:\n{table.read_text(encoding='utf-8').strip()}")
    card = project_path(export_dir) / "README.md"
    if card.is_file():
        print(f"\nmodel card: {_shown(card)} (Hub-ready folder: {export_dir})")
    if not m["eval_loss"] < entropy - 0.5:
        raise UserError(f"the demo model did not learn: eval loss {m['eval_loss']:.3f} is not clearly below the "
                        f"unigram entropy {entropy:.3f}")
