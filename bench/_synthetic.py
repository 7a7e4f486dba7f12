"""Synthetic inputs for the benchmarks, made in seconds and without network: a byte-level BPE tokenizer of exactly
the vocabulary size asked for, and a packed dataset of random tokens in the format `sparknet/data/packed/dataset.py`
reads.

A helper module, not a benchmark: run as a script (as `make bench` does with every bench/*.py) it does nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

EOT = "<|endoftext|>"


def write_tokenizer(folder: Path, vocab_size: int, context: int) -> str:
    """Writes into `folder` a GPT-2-style byte-level BPE loadable with `AutoTokenizer` (offline) of exactly
    `vocab_size` tokens: the 256-symbol byte alphabet, `vocab_size - 257` synthetic merges of two alphabet symbols
    (no training) and `<|endoftext|>` last (id `vocab_size - 1`) as bos, eos and unk. Returns the sha256 of its
    tokenizer.json, as the dataset manifest records it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_merges = vocab_size - len(alphabet) - 1
    if not 0 <= n_merges <= len(alphabet) ** 2:
        raise ValueError(f"vocab_size {vocab_size}: expected {len(alphabet) + 1} to {len(alphabet) ** 2 + 257}")
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merges = list(itertools.islice(itertools.product(alphabet, alphabet), n_merges))
    vocab.update({a + b: len(alphabet) + i for i, (a, b) in enumerate(merges)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    if tok.get_vocab_size() != vocab_size or tok.token_to_id(EOT) != vocab_size - 1:
        raise RuntimeError(f"synthetic tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
              "model_max_length": context, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()


def write_packed_dataset(folder: Path, tokenizer_dir: Path, vocab_size: int, block_size: int,
                         blocks: dict[str, int], config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Writes a packed dataset of tokens drawn uniformly from the vocabulary (deterministic for a seed), with
    `blocks[split]` blocks per split ("train", "val"), a manifest with every field training reads, and the
    tokenizer written by `write_tokenizer` recorded by path and hash. `config` is the mix config as the manifest
    holds it (`{"path": ..., **MixConfig.to_dict()}`). Returns the manifest."""
    from sparknet.data.packed.dataset import (  # the version the reader accepts
        FORMAT_VERSION,
        ContentHash,  # the hashes the reader checks, taken as the build does
        sealed,
        write_source_ids,
    )

    started = time.time()
    sha = hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()
    dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, n_blocks in blocks.items():
        content = ContentHash(block_size * dtype.itemsize)
        with (folder / f"{split}.bin").open("wb") as f:
            for start in range(0, n_blocks, 1024):  # in chunks: memory stays small for any size
                n = min(1024, n_blocks - start)
                data = rng.integers(0, vocab_size, size=(n, block_size)).astype(dtype)
                f.write(data.tobytes())
                content.update(data)
        tokens = n_blocks * block_size
        splits[split] = {"file": f"{split}.bin", "blocks": n_blocks, "tokens": tokens, "documents": n_blocks,
                         "sha256": content.record(),
                         "sources": {"synthetic": {"tokens": tokens, "documents": n_blocks, "share": 1.0,
                                                   "requested_share": 1.0}}}
    if "val" in splits:  # every validation token from the one source, as the build records it
        splits["val"]["source_ids"] = write_source_ids(folder, np.zeros(blocks["val"] * block_size), ["synthetic"],
                                                       block_size)
    inputs = {"format_version": FORMAT_VERSION, "synthetic": "uniform random tokens", "tokenizer_sha256": sha,
              "vocab_size": vocab_size, "seed": seed, "block_size": block_size, "dtype": dtype.name, "blocks": blocks}
    manifest = {
        "splits": splits, "exhausted_sources": [], "complete": True, "requested_blocks": blocks,
        "format_version": FORMAT_VERSION, "inputs": inputs,
        "tokenizer": {"path": str(tokenizer_dir), "sha256": sha, "vocab_size": vocab_size,
                      "eos_token_id": vocab_size - 1, "eos_token": EOT},
        "config": config, "seed": seed, "block_size": block_size, "dtype": dtype.name,
        "build_seconds": round(time.time() - started, 2),
    }
    manifest = sealed(manifest)  # as the build writes it: read_manifest checks the seal
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
