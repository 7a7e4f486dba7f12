"""Training SparkNet's tokenizer: a GPT-2-compatible byte-level BPE on text sampled from a mix (read through
data/), saved with its training report.

The BPE starts from the full 256-byte alphabet, so every string encodes losslessly; `<|endoftext|>` is a real
special token (never the empty string, never padding) used as bos, eos and unk, as in GPT-2.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.common.locks import exclusive
from sparknet.common.progress import Progress
from sparknet.common.runtime import replace_folder
from sparknet.config.mix import MixConfig
from sparknet.data.mixing import Mixer, mix_texts
from sparknet.tokenizer import EOT, save, wrap

log = logging.getLogger(__name__)

REPORT_NAME = "training_report.json"


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Any:
    """Trains a byte-level BPE (`tokenizers.Tokenizer`) on `texts`, streaming them into the trainer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.encode_special_tokens = True  # special-token text in a document is text (sparknet.tokenizer's rule)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # Off: its bars draw over ours while it reads the sample (which our "sampling text" bar shows), and where
        # the output is not a terminal they leave one blank line per stage; a log line says when the merges start.
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def bytes_per_token(tok: Any, texts: list[str]) -> float | None:
    """UTF-8 bytes per token over `texts` (higher is better compression); None without text. `tok`: `train_bpe`'s,
    which encodes special-token text as text (sparknet.tokenizer's rule)."""
    if not texts:
        return None
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return sum(len(t.encode("utf-8")) for t in texts) / max(n_tokens, 1)


def utf8_bytes(text: str) -> int:
    """A document's cost when mixing for the tokenizer: its UTF-8 bytes, the unit the byte-level BPE learns from."""
    return len(text.encode("utf-8"))


def train_tokenizer(
    config: MixConfig,
    out_dir: Path,
    *,
    vocab_size: int,
    max_bytes: int,
    min_frequency: int = 2,
    heldout_docs: int = 50,
    shuffle_buffer: int = 0,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Samples `max_bytes` of text from the mix (by UTF-8 bytes, in proportion to `prob`; each source read through
    the dataset build's seeded shuffle buffer of `shuffle_buffer` documents), trains the BPE, saves it with
    `save_pretrained` into `out_dir` and writes `training_report.json` there. Returns the report. One training
    into a folder at a time: a second one at once is refused in one line (it would replace the first's tokenizer)."""
    from sparknet.config.checks import check_values

    # every bad setting at once, each named with its value and the fix (the scripts' rules, sparknet.config.checks)
    check_values({"VOCAB_SIZE": vocab_size, "MAX_BYTES": max_bytes, "SHUFFLE_BUFFER": shuffle_buffer})
    with exclusive(out_dir, "a tokenizer training"):
        _check_output_dir(out_dir, overwrite)
        return _train_into(config, out_dir, vocab_size=vocab_size, max_bytes=max_bytes, min_frequency=min_frequency,
                           heldout_docs=heldout_docs, shuffle_buffer=shuffle_buffer)


def _train_into(config: MixConfig, out_dir: Path, *, vocab_size: int, max_bytes: int, min_frequency: int,
                heldout_docs: int, shuffle_buffer: int) -> dict[str, Any]:
    """`train_tokenizer`'s work, under its lock."""
    started = time.time()
    from sparknet.data.source.opening import at_commits, resolve_revisions

    # a gated or missing Hub dataset is one line before any work; each Hub source read at one commit, recorded
    commits = resolve_revisions(config)
    # By bytes, not documents: a source of long documents asked at 0.2 would otherwise supply most of the text.
    mixer = mix_texts(at_commits(config, commits), utf8_bytes, shuffle_buffer=shuffle_buffer)
    log.info("sampling %d bytes from %s and training a %d-token byte-level BPE", max_bytes, config.path, vocab_size)
    with Progress(total=max_bytes, desc="sampling text", unit="B", unit_scale=True, unit_divisor=1024) as progress:
        tok = train_bpe(_sample(mixer, max_bytes, progress), vocab_size, min_frequency)
    heldout = mixer.held_out(heldout_docs)  # the documents after the sample: text the tokenizer never saw
    _warn_about_the_sample(mixer, max_bytes, heldout, heldout_docs)
    sources = _source_report(mixer, tok, heldout, config)

    tmp = out_dir.with_name(f".{out_dir.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save(wrap(tok, config.context_length), tmp)  # its eos string encodes as the eos id for plain AutoTokenizer users
    report = {
        "config": config.path,
        "mix": config.to_dict()["mix"],
        "source_revisions": {s.label: {"revision": s.revision, "commit": commits.get(s.label)} for s in config.mix},
        "vocab_size_requested": vocab_size,
        "vocab_size": tok.get_vocab_size(),
        "min_frequency": min_frequency,
        "max_bytes": max_bytes,
        "shuffle_buffer": shuffle_buffer,
        "seed": config.seed,
        "eos_token": EOT,
        "eos_token_id": tok.token_to_id(EOT),
        "context_length": config.context_length,
        "sources": sources,
        "seconds": round(time.time() - started, 2),
    }
    (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    replace_folder(tmp, out_dir)
    if report["vocab_size"] < vocab_size:
        log.warning(
            "the sample only supports %d tokens (asked for %d): sample more text (MAX_BYTES) or lower MIN_FREQUENCY",
            report["vocab_size"],
            vocab_size,
        )
    return report


def _check_output_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuses to replace a folder that is not a tokenizer, and a tokenizer unless `overwrite`."""
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return
    ours = (out_dir / "tokenizer.json").is_file() or (out_dir / REPORT_NAME).is_file()
    if not ours:
        raise UserError(f"{out_dir} is not empty and holds no tokenizer: it is never replaced; choose another "
                        "--output_dir")
    if not overwrite:
        raise UserError(f"{out_dir} already holds a tokenizer: choose another --output_dir, or pass --overwrite "
                        "true to replace it (datasets and runs built with the old one will then refuse it)")


def _sample(mixer: Mixer[str], max_bytes: int, progress: Progress) -> Iterator[str]:
    """The mix's documents until `max_bytes` of text (the last document whole) or until every source is dry; the
    bar ends with the sample, and a line says what the BPE does next (its own bars are off: see train_bpe)."""
    for _label, text in mixer:
        progress.update(utf8_bytes(text))
        yield text
        if mixer.total_units >= max_bytes:  # the mixer's units are bytes here (the last document whole: a little
            break  # past the budget, where the bar ends full: sparknet.common.progress)
    else:
        progress.end_short("every source ran dry")
    progress.close()
    log.info("sampled %s bytes: counting pairs and computing the merges", f"{mixer.total_units:,}")


def _warn_about_the_sample(
    mixer: Mixer[str], max_bytes: int, heldout: dict[str, list[str]], heldout_docs: int
) -> None:
    """Says when the sources held less than the budget, when the sample misses the mix (as the build says of its
    splits: a share off by more than SHARE_TOLERANCE), and which sources have no held-out text left."""
    from sparknet.data.packed.manifest import SHARE_TOLERANCE

    if mixer.total_units < max_bytes:
        log.warning(
            "every source ran dry after %d of MAX_BYTES=%d bytes: the tokenizer saw all the data there is",
            mixer.total_units,
            max_bytes,
        )
    report = mixer.report()
    if any(abs(c["share"] - c["requested_share"]) > SHARE_TOLERANCE for c in report.values()):
        log.warning("the tokenizer's sample misses the mix (bytes): %s; its merges follow the sample: give a source "
                    "that ran dry more text or a lower prob, or sample more (MAX_BYTES) when one document is much of "
                    "it", ", ".join(f"{label} {c['share']:.1%} for {c['requested_share']:.1%}"
                                    + (" (ran dry)" if c["exhausted"] else "") for label, c in report.items()))
    empty = [label for label, docs in heldout.items() if not docs]
    if empty and heldout_docs > 0:
        log.warning(
            "no held-out documents left for %s (source exhausted): bytes per token not measured for it",
            ", ".join(empty),
        )


def _source_report(mixer: Mixer[str], tok: Any, heldout: dict[str, list[str]],
                   config: MixConfig) -> dict[str, dict[str, Any]]:
    """Per source: the column read, what was sampled (bytes, their realised share against the requested one,
    documents) and the bytes per token on its held-out documents."""
    from sparknet.data.source.opening import text_column

    documents = sum(count.documents for count in mixer.counts.values()) or 1
    columns = {spec.label: text_column(spec) for spec in config.mix}
    return {
        label: {
            "text_column": columns.get(label),
            "bytes": int(c["units"]),
            "byte_share": c["share"],
            "requested_share": c["requested_share"],
            "documents": int(c["documents"]),
            "document_share": c["documents"] / documents,
            "exhausted": c["exhausted"],
            "heldout_documents": len(heldout[label]),
            "heldout_bytes_per_token": bytes_per_token(tok, heldout[label]),
        }
        for label, c in mixer.report().items()
    }
