"""Running the demo chain: each step is one of the real scripts, started as the user would start it."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from sparknet.errors import UserError
from sparknet.runtime import PROJECT_ROOT


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
        code = subprocess.call([sys.executable, *argv], cwd=PROJECT_ROOT)
        if code != 0:
            raise UserError(f"demo step '{title}' failed (exit status {code}); its messages are above")
        self.timings.append((title, time.time() - t))

    def summary(self, outputs: dict[str, str]) -> None:
        """Prints where everything went and how long each step took."""
        print(f"\n=== demo finished in {time.time() - self.started:.0f} s")
        width = max(len(title) for title, _ in self.timings) if self.timings else 0
        for title, seconds in self.timings:
            print(f"  {title:<{width}} {seconds:6.1f} s")
        print("outputs:")
        for what, where in outputs.items():
            print(f"  {what:<20} {where}")


def remove_previous_run(run_name: str) -> None:
    """Deletes the demo's own previous run, so that every demo trains afresh."""
    import shutil

    from sparknet.runtime import project_path

    for folder in (project_path("checkpoints") / run_name, project_path("logs") / run_name,
                   project_path("eval") / run_name):
        if folder.exists():
            shutil.rmtree(folder)


def report(run_name: str, dataset_dir: str, export_dir: str) -> None:
    """Prints eval loss at start and end against the corpus's unigram entropy, the final sample, the perplexity and
    benchmark tables and where the model card is; fails the demo when the model did not learn more than token
    frequencies."""
    import json

    import numpy as np

    from sparknet.data.packed import PackedDataset
    from sparknet.evaluation import unigram_entropy
    from sparknet.runtime import project_path

    run_dir = project_path("checkpoints") / run_name
    metadata = json.loads((run_dir / "training_metadata.json").read_text())
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
            print(f"\n{table.relative_to(project_path('.'))}:\n{table.read_text(encoding='utf-8').strip()}")
    card = project_path(export_dir) / "README.md"
    if card.is_file():
        print(f"\nmodel card: {card.relative_to(project_path('.'))} (Hub-ready folder: {export_dir})")
    if not m["eval_loss"] < entropy - 0.5:
        raise UserError(f"the demo model did not learn: eval loss {m['eval_loss']:.3f} is not clearly below the "
                        f"unigram entropy {entropy:.3f}")
