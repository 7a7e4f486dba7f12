"""Benchmarks the token stream alone, measured side by side in one run (ratios, not absolute times).

Throughput: `TokenStream` iterated to the end of a two-source mix (prose 0.4 / code 0.6 from the demo corpus,
`num_workers` = all cores, nothing consuming the blocks) against the tokenizer's own `encode_batch` over the same
documents on the same cores, the pipeline's ceiling. Target: ratio >= 0.8 once running (a trainer streams for
hours: the running rate is taken over the middle 60% of the blocks; the overall one, start-up included, is printed
too).

Run: `.venv/bin/python bench/stream_throughput.py` (under a minute on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

BLOCK = 1024
CODE_MB = 30
VOCAB = 8192


def main() -> None:
    from sparknet.common import runtime

    runtime.setup(0)
    from tokenizers import Tokenizer

    from sparknet.bpe import train_bpe
    from sparknet.config.mix import load_config
    from sparknet.data.spec import DataSpec
    from sparknet.data.stream.token_stream import TokenStream
    from sparknet.demo.corpus import write_demo_corpus
    from sparknet.tokenizer import EOT

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="sparknet-stream-bench-"))
    try:
        corpus = work / "corpus"
        write_demo_corpus(corpus, max_code_bytes=CODE_MB * 2**20, val_percent=1, include_tests=True)
        cfg_path = work / "mix.json"
        cfg_path.write_text(json.dumps({"seed": 0, "context_length": BLOCK, "target_tokens": 10**9, "mix": [
            {"name": "json", "prob": 0.4, "data_files": str(corpus / "prose.train.jsonl")},
            {"name": "json", "prob": 0.6, "data_files": str(corpus / "code.train.jsonl")}]}))
        config = load_config(cfg_path)
        texts = [json.loads(line)["text"] for name in ("prose", "code")
                 for line in (corpus / f"{name}.train.jsonl").open(encoding="utf-8")]
        tok = train_bpe(texts[::10], VOCAB)
        tokenizer_json, eos_id = tok.to_str(), tok.token_to_id(EOT)

        # the ceiling: the tokenizer's own batch encoding on all cores, over every document the stream reads
        tokenizer = Tokenizer.from_str(tokenizer_json)
        tokenizer.encode_batch_fast(texts[:50])  # warm the thread pool

        def encode_all() -> tuple[int, float]:
            t = time.perf_counter()
            n = sum(len(e.ids) + 1 for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False))
            return n, n / (time.perf_counter() - t)

        n_ceiling, ceiling_before = encode_all()

        # the stream, iterated to its end (both sources dry), nothing done with the blocks
        stream = TokenStream(DataSpec(config=config, tokenizer_json=tokenizer_json, eos_id=eos_id, block_size=BLOCK,
                                      seed=0, num_workers=cores))
        t = time.perf_counter()
        times = [time.perf_counter() for _ in stream]  # when each block came
        stats = stream.stats()
        stream.close()
        n_stream = len(times) * BLOCK
        # measured before and after the stream: this machine's speed drifts, and the mean is fairer to both
        ceiling_after = encode_all()[1]
        ceiling = (ceiling_before + ceiling_after) / 2
        # Running rate over the middle 60% of the blocks: the encoders' read-ahead is full at both ends of that
        # window, so it measures production, not blocks encoded during start-up and drained at the end.
        a, b = len(times) // 5, len(times) * 4 // 5
        running = (b - a) * BLOCK / (times[b] - times[a])
        overall = n_stream / (times[-1] - t)
        print(f"\n[stream throughput] {len(texts)} documents, {cores} cores, blocks of {BLOCK}, vocab {VOCAB}")
        print(f"  encode_batch (ceiling):  {n_ceiling:,} tokens, {ceiling:,.0f} tokens/s "
              f"(mean of {ceiling_before:,.0f} before and {ceiling_after:,.0f} after the stream)")
        print(f"  stream, running:         {running:,.0f} tokens/s (blocks {a} to {b} of {len(times)})")
        print(f"  stream, overall:         {n_stream:,} tokens, {overall:,.0f} tokens/s ({times[-1] - t:.1f} s, "
              f"first block after {times[0] - t:.1f} s)")
        print(f"  stream's own rate:       {stats['tokens_per_second']:,.0f} tokens/s (stats()['tokens_per_second'])")
        print(f"  ratio running/ceiling:   {running / ceiling:.2f}   (target >= 0.8)")
        print(f"  ratio overall/ceiling:   {overall / ceiling:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
