"""Benchmarks the packed build reading a Hub dataset through the loopback Hub (tests/hub_server.py) when every
request pays a network round trip, measured side by side in one run (ratios, not absolute times).

The Hub dataset: the demo corpus (stdlib prose and code, real text) cut at blank lines into rows of ~CHUNK_CHARS
characters (~8,900 rows), dealt into SHARDS Parquet shards of a `text` column with row groups of ROW_GROUP_ROWS
rows: about 3.0M tokens with the VOCAB-token byte-level BPE trained on it here. Each build is
`scripts/build_dataset_v5.py` in its own process with the server's environment and a fresh HF_HOME (nothing cached
between builds): one Hub source (prob 1), all cores encoding, shuffle buffer SHUFFLE_BUFFER, TARGET_TOKENS (most of
the dataset is read). Three configurations:

  (a) no added latency, READ_AHEAD default (8 batches for a Hub source);
  (b) LATENCY_S added to every request (metadata calls and range reads alike), READ_AHEAD default;
  (c) LATENCY_S added to every request, READ_AHEAD 0 (read on demand, on the main thread).

Rounds are interleaved (a, b, c, a, b, c, ...); each figure is the median of ROUNDS. tokens/s (wall) is the
manifest's tokens (train + val) over the build process's wall time (interpreter start, imports and the Hub's
metadata calls included, as a user waits for them); tokens/s (manifest) over the manifest's build_seconds (from
`build_dataset`'s start: no interpreter start or imports). CPU s is the build's process tree's, encoders included.
Requests are the server's log of each build: metadata (info, tree, HEAD, README) and range GETs of the shards (two per
shard, footer and body, with one more for the first), and the seconds they would add if waited for one after the
other. All configurations must give the same token file (checked). Target: (b) at least 0.8x (a).

The machine may be shared: other work running at the same time slows whichever build it overlaps, by tens of percent
on 2 cores. The per-round column and the load averages printed show how much; compare the columns of one table, and
rerun when the rounds of one configuration disagree widely.

Run: `.venv/bin/python bench/hub_latency.py` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.hub_server import HubServer

ROOT = Path(__file__).resolve().parent.parent
# the loopback Hub lives beside the tests (tests/hub_server.py), not in the package
sys.path.insert(0, str(ROOT))

REPO = "sparknet-bench/corpus"
SHARDS = 16  # Parquet files of the Hub dataset
CODE_MB = 12  # demo corpus code cap (the stdlib holds ~8.6 MB without its tests): ~10.7 MB of text in all
CHUNK_CHARS = 1500  # its documents cut at blank lines into rows of about this size: ~8,900 rows of ~1.2 KB
ROW_GROUP_ROWS = 128  # rows per Parquet row group (~150 KB)
VOCAB = 4096
BLOCK = 1024
TARGET_TOKENS = 2_500_000  # of ~3.0M in the dataset: most of it is read
VAL_TOKENS = 32 * BLOCK
SHUFFLE_BUFFER = 256  # documents (~3% of the source, as the default 10,000 is a small part of a real Hub dataset)
LATENCY_S = 0.05  # added to every request in (b) and (c)
ROUNDS = 5
CONFIGS = [  # (name, added latency, READ_AHEAD or None for the default)
    ("a: no latency, read-ahead default", 0.0, None),
    ("b: 50 ms, read-ahead default", LATENCY_S, None),
    ("c: 50 ms, READ_AHEAD 0", LATENCY_S, 0),
]


def chunks(text: str) -> list[str]:
    """The text cut at blank lines into rows of about CHUNK_CHARS characters (a paragraph longer stays whole)."""
    out, current = [], ""
    for para in text.split("\n\n"):
        if current and len(current) + len(para) + 2 > CHUNK_CHARS:
            out.append(current)
            current = para
        else:
            current = f"{current}\n\n{para}" if current else para
    return [*out, current] if current else out


def write_hub_files(corpus: Path) -> tuple[dict[str, bytes], list[str]]:
    """The corpus's documents cut into rows, dealt round-robin into SHARDS Parquet shards; (files by repo path,
    rows' texts)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.hub_server import dataset_card

    texts = [row for name in ("prose", "code") for line in (corpus / f"{name}.train.jsonl").open(encoding="utf-8")
             for row in chunks(json.loads(line)["text"])]
    readme = dataset_card("data/train-*.parquet", "The SparkNet demo corpus, for bench/hub_latency.py")
    files: dict[str, bytes] = {"README.md": readme.encode()}
    for k in range(SHARDS):
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": texts[k::SHARDS]}), buf, row_group_size=ROW_GROUP_ROWS)
        files[f"data/train-{k:05d}-of-{SHARDS:05d}.parquet"] = buf.getvalue()
    return files, texts


def build(hub: HubServer, work: Path, run: str, cfg: Path, tok_dir: Path, latency: float,
          read_ahead: int | None) -> dict[str, Any]:
    """One build in its own process, HF_HOME fresh; its tokens, seconds and the requests it made."""
    folder = work / run
    folder.mkdir()
    cmd = [sys.executable, str(ROOT / "scripts/build_dataset_v5.py"), "--config", str(cfg), "--tokenizer_dir",
           str(tok_dir), "--output_dir", str(folder / "ds"), "--target_tokens", str(TARGET_TOKENS),
           "--val_tokens", str(VAL_TOKENS), "--block_size", str(BLOCK), "--shuffle_buffer", str(SHUFFLE_BUFFER),
           "--checkpoint_seconds", "0"]
    if read_ahead is not None:
        cmd += ["--read_ahead", str(read_ahead)]
    hub.latency = latency
    before = len(hub.requests)
    cpu = _children_cpu()
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=hub.env(folder), capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t
    cpu = _children_cpu() - cpu
    hub.latency = 0.0
    if proc.returncode != 0:
        raise SystemExit(f"build {run} failed:\n{proc.stderr[-3000:]}")
    manifest = json.loads((folder / "ds" / "manifest.json").read_text())
    tokens = sum(manifest["splits"][split]["tokens"] for split in ("train", "val"))
    documents = sum(manifest["splits"][split]["documents"] for split in ("train", "val"))
    requests = hub.requests[before:]
    digest = hashlib.sha256((folder / "ds" / "train.bin").read_bytes()).hexdigest()
    ranges = [_range_bytes(r.range) for r in requests if r.kind == "resolve-get" and r.range]
    shutil.rmtree(folder, ignore_errors=True)
    return {"tokens": tokens, "documents": documents, "seconds": seconds, "build_seconds": manifest["build_seconds"],
            "cpu": cpu, "sha256": digest,
            "requests": len(requests), "gets": len(ranges), "get_mb": sum(ranges) / 2**20,
            "meta": len(requests) - len(ranges), "serial_wait": len(requests) * latency}


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes, the builds' encoders included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _range_bytes(header: str | None) -> int:
    if not header:
        return 0
    first, _, last = header.partition("=")[2].split(",")[0].partition("-")
    return int(last) - int(first) + 1 if first and last else 0


def main() -> None:
    from sparknet.common import runtime

    runtime.setup(0)
    from sparknet.bpe import train_bpe
    from sparknet.common.runtime import available_cores
    from sparknet.demo.corpus import write_demo_corpus
    from sparknet.tokenizer import save, wrap
    from tests.hub_server import HubServer

    started = time.perf_counter()
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="sparknet-hub-latency-"))
    hub = HubServer().start()
    try:
        write_demo_corpus(work / "corpus", max_code_bytes=CODE_MB * 2**20, val_percent=0)
        files, texts = write_hub_files(work / "corpus")
        hub.add_dataset(REPO, files)
        tok_dir = work / "tok"
        tok_dir.mkdir()
        save(wrap(train_bpe(texts[::4], VOCAB), BLOCK), tok_dir)
        cfg = work / "mix.json"
        cfg.write_text(json.dumps({"seed": 0, "context_length": BLOCK, "target_tokens": TARGET_TOKENS,
                                   "mix": [{"name": REPO, "split": "train", "prob": 1.0}]}))
        shard_mb = sum(len(v) for k, v in files.items() if k.endswith(".parquet")) / 2**20
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in CONFIGS}
        for round_ in range(ROUNDS):
            for i, (name, latency, read_ahead) in enumerate(CONFIGS):
                r = build(hub, work, f"r{round_}-{i}", cfg, tok_dir, latency, read_ahead)
                results[name].append(r)
                print(f"  round {round_ + 1} {name}: {r['tokens'] / r['seconds']:,.0f} tokens/s "
                      f"({r['seconds']:.1f} s wall, {r['build_seconds']:.1f} s in the build, {r['cpu']:.1f} CPU s, "
                      f"{r['requests']} requests)", file=sys.stderr)
        assert not hub.errors, hub.errors
        digests = {r["sha256"] for runs in results.values() for r in runs}
        assert len(digests) == 1, "the configurations built different datasets"
    finally:
        hub.close()
        shutil.rmtree(work, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def rates(name: str, seconds: str) -> list[float]:
        return [r["tokens"] / r[seconds] for r in results[name]]

    wall = {name: statistics.median(rates(name, "seconds")) for name in results}
    inner = {name: statistics.median(rates(name, "build_seconds")) for name in results}
    base, b, c = (name for name, _, _ in CONFIGS)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nHub dataset: {SHARDS} Parquet shards ({shard_mb:.1f} MB, row groups of {ROW_GROUP_ROWS} rows), "
          f"{len(texts):,} rows of up to ~{CHUNK_CHARS} characters; vocab {VOCAB}, blocks of {BLOCK}, "
          f"{available_cores()} encoder processes, shuffle buffer {SHUFFLE_BUFFER}; every build packed "
          f"{median(base, 'documents'):,.0f} documents into the same token file. Median of {ROUNDS} interleaved "
          f"rounds, a fresh HF_HOME per build. Load average before the builds {load_before}, after {load} (on "
          f"{os.cpu_count()} CPUs: other work may have run meanwhile).\n")
    print("| configuration | tokens | wall s | tokens/s (wall) | vs (a) | per round | build s (manifest) "
          "| tokens/s (manifest) | vs (a) | CPU s | requests: metadata + range GETs | GET MB | latency if serial, s |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in results:
        per_round = ", ".join(f"{x / 1e3:,.0f}k" for x in rates(name, "seconds"))
        print(f"| {name} | {median(name, 'tokens'):,.0f} | {median(name, 'seconds'):.1f} | {wall[name]:,.0f} | "
              f"{wall[name] / wall[base]:.2f} | {per_round} | {median(name, 'build_seconds'):.1f} | "
              f"{inner[name]:,.0f} | {inner[name] / inner[base]:.2f} | {median(name, 'cpu'):.1f} | "
              f"{median(name, 'meta'):.0f} + {median(name, 'gets'):.0f} | {median(name, 'get_mb'):.1f} | "
              f"{median(name, 'serial_wait'):.1f} |")
    print(f"\nratio b/a: {wall[b] / wall[base]:.2f} wall, {inner[b] / inner[base]:.2f} manifest   (target >= 0.8)")
    print(f"ratio c/a: {wall[c] / wall[base]:.2f} wall, {inner[c] / inner[base]:.2f} manifest")
    print(f"({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
