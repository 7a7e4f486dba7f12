"""Benchmarks the packed-dataset build, measured side by side in one run (ratios, not absolute times).

1. Throughput: the whole build (streaming, worker pool, mixing, packing, writing) against the tokenizer's own
   `encode_batch` over the same documents on the same cores, the pipeline's ceiling, for a first build (one-off
   start-up costs included) and a second (the steady rate). Target: ratio >= 0.8.
2. Memory: peak RSS (main process + workers) of builds of N and 10×N tokens. Target: the larger <= 1.2× the smaller.
3. Loading: random-access batch reads/s from the packed dataset against training steps/s of the 70M preset on this
   CPU, same batch shape. Target: the loader >= 100× faster.
4. Reading: a build from local Parquet shards (standing in for a Hub dataset: three sources of 8 shards each) with
   each source read ahead on its own thread against reading on demand (READ_AHEAD 0); same output (checked), the
   ratio of the build rates; then how many encoder cores one reading thread feeds (the sources read alone against
   one core's encoding). On 2 cores reading ahead is within noise (0.67-1.11) and one thread feeds ~75-85 encoders, so
   local sources are read on demand by default, and Hub sources, whose network waits release the GIL, ahead.

Run: `make bench` or `.venv/bin/python bench/pack_throughput.py` (about 4 minutes on 2 cores; `--throughput`,
`--reading`: section 1 or 4 alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
N_TOKENS = 500_000
BATCH, BLOCK = 4, 1024
TRAIN_STEPS = 2


def build_cmd(cfg: Path, tok: Path, out: Path, target: int, workers: int) -> list[str]:
    return [sys.executable, str(ROOT / "scripts/build_dataset_v5.py"), "--config", str(cfg), "--tokenizer_dir",
            str(tok), "--output_dir", str(out), "--target_tokens", str(target), "--val_tokens", str(BLOCK),
            "--num_workers", str(workers), "--shuffle_buffer", "0", "--overwrite", "true"]


def peak_rss_of(cmd: list[str]) -> tuple[float, float]:
    """Runs `cmd`, sampling the summed RSS of it and its children; returns (peak MB, seconds)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            procs = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs))
        except psutil.Error:
            pass
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"build failed: {' '.join(cmd)}")
    return peak / 2**20, time.perf_counter() - start


def main() -> None:
    from sparknet.common import runtime

    runtime.setup(0)

    from sparknet.bpe import train_tokenizer
    from sparknet.common.runtime import available_cores
    from sparknet.config.mix import load_config
    from sparknet.demo.corpus import write_demo_corpus

    cores = available_cores()
    work = Path(tempfile.mkdtemp(prefix="sparknet-bench-"))
    corpus = work / "corpus"
    write_demo_corpus(corpus, max_code_bytes=40 * 2**20, include_tests=True)
    cfg_path = work / "mix.json"
    cfg_path.write_text(json.dumps({"seed": 0, "context_length": BLOCK, "target_tokens": 10**9, "mix": [
        {"name": "json", "prob": 0.4, "data_files": str(corpus / "prose.train.jsonl")},
        {"name": "json", "prob": 0.6, "data_files": str(corpus / "code.train.jsonl")}]}))
    config = load_config(cfg_path)
    tok_dir = work / "tok"
    train_tokenizer(config, tok_dir, vocab_size=8192, max_bytes=3_000_000, heldout_docs=0)
    if "--reading" in sys.argv:  # section 4 alone
        reading(work, corpus, tok_dir, cores)
        return
    if "--throughput" in sys.argv:  # section 1 alone
        throughput(work, corpus, config, tok_dir, cores)
        return

    out = throughput(work, corpus, config, tok_dir, cores)
    memory(work, cfg_path, tok_dir, cores)
    loading(out, cores)
    reading(work, corpus, tok_dir, cores)
    import shutil

    shutil.rmtree(work, ignore_errors=True)


def throughput(work: Path, corpus: Path, config: Any, tok_dir: Path, cores: int) -> Path:
    """Section 1; returns the built dataset (read by section 3)."""
    from tokenizers import Tokenizer

    from sparknet.data.packed.build import BuildSpec, build_dataset

    # 1. Throughput: a target beyond the corpus makes the build consume every document, as encode_batch does.
    texts = [json.loads(line)["text"] for name in ("prose", "code")
             for line in (corpus / f"{name}.train.jsonl").open(encoding="utf-8")]
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    tokenizer.encode_batch_fast(texts[:50])  # warm the thread pool
    t = time.perf_counter()
    n_ceiling = sum(len(e.ids) + 1 for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False))
    ceiling = n_ceiling / (time.perf_counter() - t)
    # The first build in a process pays one-off costs (importing transformers to load the tokenizer, spawning the
    # encoders, datasets' first look at the files): about a second, a fifth of this small build and nothing in a
    # real one. The second build, into a fresh folder, shows the steady rate.
    rates = []
    for run in ("first", "second"):
        out = work / f"full-{run}"
        t = time.perf_counter()
        manifest = build_dataset(BuildSpec(config=config, tokenizer=str(tok_dir), output_dir=out,
                                           target_tokens=10**9, val_tokens=BLOCK, block_size=BLOCK, seed=0,
                                           num_workers=cores))
        build_s = time.perf_counter() - t
        n_build = sum(sum(s["tokens"] for s in manifest["splits"][k]["sources"].values()) for k in ("train", "val"))
        rates.append((run, n_build, build_s))
    print(f"\n[throughput] {len(texts)} documents, {cores} cores")
    print(f"  encode_batch (ceiling): {n_ceiling:,} tokens, {ceiling:,.0f} tokens/s")
    for run, n_build, build_s in rates:
        print(f"  {run} build:{' ' * (13 - len(run))}{n_build:,} tokens, {n_build / build_s:,.0f} tokens/s "
              f"({build_s:.1f} s incl. start-up), ratio build/ceiling {n_build / build_s / ceiling:.2f}")
    print(f"  ratio build/ceiling:    {rates[-1][1] / rates[-1][2] / ceiling:.2f}   (second build; target >= 0.8)")

    return out


def memory(work: Path, cfg_path: Path, tok_dir: Path, cores: int) -> None:
    """Section 2."""
    # 2. Peak memory of builds of N and 10N tokens, each in its own process tree.
    small, t_small = peak_rss_of(build_cmd(cfg_path, tok_dir, work / "n", N_TOKENS, cores))
    large, t_large = peak_rss_of(build_cmd(cfg_path, tok_dir, work / "10n", 10 * N_TOKENS, cores))
    print(f"\n[memory] peak RSS, main process + {cores} workers")
    print(f"  {N_TOKENS:>10,} tokens: {small:7.0f} MB ({t_small:.1f} s)")
    print(f"  {10 * N_TOKENS:>10,} tokens: {large:7.0f} MB ({t_large:.1f} s)")
    print(f"  ratio 10N/N:            {large / small:.2f}   (target <= 1.20)")



def loading(out: Path, cores: int) -> None:
    """Section 3."""
    import numpy as np
    import torch

    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.model.presets import build_model, get_preset

    # 3. Random batch reads from the memmap against 70M-preset training steps, same batch shape.
    ds = PackedDataset(out, "train")
    rng = np.random.default_rng(0)
    n_reads = 2000
    t = time.perf_counter()
    for _ in range(n_reads):
        idx = rng.integers(0, len(ds), BATCH)
        batch = torch.stack([ds[int(i)]["input_ids"] for i in idx])
    reads = n_reads / (time.perf_counter() - t)
    torch.manual_seed(0)
    model = build_model(get_preset("sparknet-70m"), vocab_size=50257, eos_token_id=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    t = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        step()
    steps = TRAIN_STEPS / (time.perf_counter() - t)
    print(f"\n[loading] batches of {BATCH}x{BLOCK} tokens")
    print(f"  random batch reads:     {reads:,.0f} /s")
    print(f"  70M training steps:     {steps:.4f} /s ({1 / steps:.1f} s per step, fp32, {cores} cores)")
    print(f"  ratio reads/steps:      {reads / steps:,.0f}   (target >= 100)")


def reading(work: Path, corpus: Path, tok_dir: Path, cores: int) -> None:
    """Section 4: the same Parquet build read ahead on threads and read on demand."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparknet.config.mix import load_config
    from sparknet.data.packed.build import BuildSpec, build_dataset

    mix = []
    for name, prob in (("prose", 0.3), ("code", 0.5), ("tests", 0.2)):
        source = "code" if name == "tests" else name
        texts = [json.loads(line)["text"] for line in (corpus / f"{source}.train.jsonl").open(encoding="utf-8")]
        texts = texts[len(texts) // 2:] if name == "tests" else texts  # a third source: another part of the code
        shards = []
        for k in range(8):
            path = work / "parquet" / name / f"train-{k:05d}-of-00008.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"text": texts[k::8]}), path, row_group_size=256)
            shards.append(str(path))
        mix.append({"name": "parquet", "prob": prob, "data_files": shards})
    cfg_path = work / "parquet.json"
    cfg_path.write_text(json.dumps({"seed": 0, "context_length": BLOCK, "target_tokens": 10**9, "mix": mix}))
    config = load_config(cfg_path)
    rates, files = {}, {}
    for attempt, read_ahead in enumerate((0, 8, 0, 8)):  # alternated, best of two each: the machine is noisy
        out = work / f"parquet-{attempt}"
        t = time.perf_counter()
        spec = BuildSpec(config=config, tokenizer=str(tok_dir), output_dir=out, target_tokens=2_000_000,
                         val_tokens=BLOCK, block_size=BLOCK, seed=0, num_workers=cores, shuffle_buffer=1000,
                         read_ahead=read_ahead, overwrite=True)
        manifest = build_dataset(spec)
        tokens = manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"]
        rates[read_ahead] = max(rates.get(read_ahead, 0.0), tokens / (time.perf_counter() - t))
        files[read_ahead] = (out / "train.bin").read_bytes()
    assert files[0] == files[8], "reading ahead changed the dataset"
    print(f"\n[reading] 3 Parquet sources x 8 shards, {cores} encoder processes, shuffle buffer 1000")
    print(f"  read on demand:         {rates[0]:,.0f} tokens/s")
    print(f"  read ahead (threads):   {rates[8]:,.0f} tokens/s (same bytes)")
    print(f"  ratio ahead/on demand:  {rates[8] / rates[0]:.2f}")
    reading_headroom(config, tok_dir)


def reading_headroom(config: Any, tok_dir: Path) -> None:
    """How many encoder cores one reading thread can feed: the sources read alone (one thread, shuffle buffer on),
    in tokens/s, against one core's `encode_batch` rate on the same documents."""
    from tokenizers import Tokenizer

    from sparknet.data.source.rank_reader import SourceReader

    texts: list[str] = []
    t = time.perf_counter()
    for spec in config.mix:
        texts += [text for text, _ in SourceReader(spec, shuffle_buffer=1000, seed=0)]
    read_s = time.perf_counter() - t
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    t = time.perf_counter()  # one document at a time: one core, as in one encoder process
    tokens = sum(len(tokenizer.encode(text, add_special_tokens=False).ids) + 1 for text in texts)
    encode_s = time.perf_counter() - t
    print(f"\n[reading headroom] {len(texts)} documents, {tokens:,} tokens")
    print(f"  read alone (1 thread):  {tokens / read_s:,.0f} tokens/s")
    print(f"  encode on 1 core:       {tokens / encode_s:,.0f} tokens/s")
    print(f"  cores one reader feeds: {encode_s / read_s:.1f}   (reading limits a build beyond this many encoders)")


if __name__ == "__main__":
    main()
