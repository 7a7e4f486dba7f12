"""What the checksums of a checkpoint's completion marker cost, against the save they follow, side by side.

A checkpoint as the Trainer writes it for PRESET: the model (save_pretrained, safetensors) and the AdamW state
(torch.save, two moments per parameter), timed; then `folders.mark_complete` (sizes and sha256 of every file),
timed, and the same verification on resume. Rounds alternate; the table gives seconds and the ratio to the save.

Run: `.venv/bin/python bench/checkpoint_checksum.py` (the 70M preset: about a minute on 2 cores, 0.8 GB of files in
a temporary folder).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

PRESET = "sparknet-70m"  # the reference run's model
VOCAB = 50257  # its vocabulary
ROUNDS = 3  # save, mark, verify, this many times


def save_checkpoint(model: object, optimizer: object, folder: Path) -> float:
    import torch

    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    return time.perf_counter() - started


def main() -> None:
    import logging

    import torch

    from sparknet.common import runtime
    from sparknet.model.presets import build_model, get_preset
    from sparknet.train.folders import damaged_file, mark_complete

    runtime.setup(0, level=logging.WARNING)
    model = build_model(get_preset(PRESET), VOCAB, eos_token_id=VOCAB - 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.randint(0, VOCAB, (1, 16)), labels=torch.randint(0, VOCAB, (1, 16))).loss.backward()
    optimizer.step()  # the moments exist, as in a real checkpoint
    rows = []
    with tempfile.TemporaryDirectory(prefix="sparknet-checksum-") as tmp:
        for round_ in range(ROUNDS):
            folder = Path(tmp) / f"checkpoint-{round_}"
            save = save_checkpoint(model, optimizer, folder)
            size = sum(p.stat().st_size for p in folder.iterdir()) / 2**30
            started = time.perf_counter()
            mark_complete(folder, round_)
            mark = time.perf_counter() - started
            started = time.perf_counter()
            assert damaged_file(folder) is None
            verify = time.perf_counter() - started
            rows.append((save, mark, verify, size))
            print(f"round {round_ + 1}: save {save:.2f} s, marker with checksums {mark:.2f} s, verify {verify:.2f} s "
                  f"({size:.2f} GB)", flush=True)
    save, mark, verify = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"\n[checkpoint checksum] {PRESET}, {rows[0][3]:.2f} GB per checkpoint, median of {ROUNDS}")
    print("| step | seconds | / save |\n|---|---:|---:|")
    for name, seconds in (("save (model + optimizer)", save), ("marker with sha256", mark),
                          ("verify on resume", verify)):
        print(f"| {name} | {seconds:.2f} | {seconds / save:.2f} |")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
