"""Loading any tokenizer (a folder or a Hub id) with checks, its fingerprint, and saving one in a form every
transformers version loads. Below data/: it imports nothing of it (training a tokenizer, which reads the mix, is
sparknet.bpe).

SparkNet's tokenizer is GPT-2's kind: `<|endoftext|>` is a real special token (never the empty string, never
padding) used as bos, eos and unk.

Special-token text inside a document (a literal "<|endoftext|>" in a web page or a code file) is text to SparkNet,
encoded as its characters are, everywhere SparkNet encodes a document: only the eos SparkNet appends separates
documents. The tokenizer trains on it as text (sparknet.bpe `train_bpe`), the build and the stream encode it as
text (data/encoding/packer.py's DocumentEncoder), and so does every tokenizer SparkNet loads (`load_tokenizer`, which
asks for it explicitly: evaluation, generation, the trainer's samples, the benchmarks). Encoded as the eos id, a
literal would end a document where the text goes on, and evaluation would score other tokens than training saw.

The folders SparkNet writes (the tokenizer's, the run folder and its checkpoints, the export) do not carry that rule
(no `split_special_tokens` in tokenizer_config.json): loaded with plain `AutoTokenizer`, their `eos_token` string
encodes as the eos id, as in every GPT-2-kind tokenizer, so `tokenizer(text + tokenizer.eos_token)` ends a
fine-tuning document with an end of text. SparkNet's own encoding never reads the flag from a folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.common.folder_or_hub import local_path, not_found
from sparknet.common.runtime import project_path
from sparknet.config.mix import MixConfig

log = logging.getLogger(__name__)

EOT = "<|endoftext|>"
# Saved as the generic fast class (not transformers 5's `TokenizersBackend`) so transformers 4 users can load it too.
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
# A probe for lossy tokenizers: control characters, runs of spaces, combining marks, emoji, CJK.
ROUND_TRIP_PROBE = "Tab\there,\r\nNUL\x00 and  three   spaces; e\u0301 café 😀 日本語 <b>&amp;</b>\n"


def wrap(tok: Any, context_length: int) -> Any:
    """The `tokenizers.Tokenizer` as a transformers fast tokenizer with GPT-2's special-token roles."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=EOT,
        model_max_length=context_length,
        clean_up_tokenization_spaces=False,
        # not split_special_tokens: the saved folder encodes its eos string as the eos id (the module's rule);
        # SparkNet's own encoding asks for text explicitly (`load_tokenizer`, the raw backend's encode_special_tokens)
    )


LOADER_KEYS = ("is_local", "local_files_only", "_commit_hash", "cache_dir", "token", "revision")


def save(fast: Any, out_dir: Path) -> None:
    """`save_pretrained`, with a tokenizer class every transformers version can load."""
    fast.save_pretrained(str(out_dir))
    portable_config(out_dir)


def portable_config(out_dir: Path) -> None:
    """The saved tokenizer_config.json with a class every transformers version can load, no `split_special_tokens`
    (the module's rule: loaded with plain `AutoTokenizer`, the folder encodes `tokenizer.eos_token` in text as the eos
    id, as every GPT-2-kind tokenizer does; a tokenizer loaded by `load_tokenizer` would save it as true), and nothing
    about how this copy was loaded (for a tokenizer saved by someone else, e.g. the Trainer)."""
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = TOKENIZER_CLASS
    cfg.pop("split_special_tokens", None)
    for key in LOADER_KEYS:  # how this copy was loaded, not what the tokenizer is: wrong for whoever downloads it
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(name_or_path: str) -> Any:
    """Loads a tokenizer from a folder (relative to the project root) or a Hub id (e.g. `gpt2`), checking that it
    has an end-of-text token and round-trips text losslessly."""
    from transformers import AutoTokenizer

    folder = local_path(name_or_path)  # None: a Hub id (the rule: sparknet.common.folder_or_hub)
    near = None if folder is not None and folder.exists() else _nearest_tokenizer_folder(name_or_path)
    if folder is None and near is not None:
        folder = project_path(name_or_path)  # a near miss of a local tokenizer folder's name (tokenizr-demo)
    if folder is not None and folder.exists():
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
            raise UserError(
                f"{folder} holds no tokenizer (no tokenizer.json): train one with "
                "scripts/train_tokenizer_v5.py or point the script at another tokenizer folder or Hub id"
            )
        source = str(folder)
    elif folder is not None:
        hint = f" Did you mean {near}?" if near else ""
        raise UserError(
            f"{not_found('tokenizer folder', name_or_path, folder)}.{hint} Train one with "
            "scripts/train_tokenizer_v5.py, or pass a Hub id such as gpt2"
        )
    else:
        source = name_or_path
    try:
        # special-token text in a document is text (the module's rule), for any tokenizer, whatever its folder's
        # tokenizer_config.json says (SparkNet's own folders say nothing: their users' eos string is the eos id)
        with _quiet_hub_retries():
            tok = AutoTokenizer.from_pretrained(source, split_special_tokens=True)
    except Exception as exc:  # reported against the user's value with the library's reason
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if folder is not None:
            raise UserError(f"the tokenizer in {folder} cannot be read ({reason}): a file of it is damaged or "
                            "truncated; train it again with scripts/train_tokenizer_v5.py (--overwrite true) or "
                            "restore the folder") from None
        raise UserError(
            f"cannot load tokenizer {name_or_path!r}: no folder {project_path(name_or_path)} and the Hub id failed "
            f"({reason}). Train one with "
            "scripts/train_tokenizer_v5.py; Hub ids need network access or a cached copy"
        ) from None
    if tok.eos_token_id is None:
        raise UserError(f"tokenizer {name_or_path!r} has no end-of-text (eos) token: documents could not be separated")
    if tok.eos_token in ("", None):
        raise UserError(f"tokenizer {name_or_path!r} has an empty end-of-text token")
    ids = tok.encode(ROUND_TRIP_PROBE, add_special_tokens=False)
    if tok.decode(ids, clean_up_tokenization_spaces=False) != ROUND_TRIP_PROBE:
        log.warning(
            "tokenizer %s does not round-trip text exactly (decode(encode(s)) != s): bits-per-byte and "
            "generated samples will differ from the original text",
            name_or_path,
        )
    return tok


def _nearest_tokenizer_folder(name: str) -> str | None:
    """The local tokenizer folder (one holding tokenizer.json, in the project or the current folder) whose name is
    nearest `name`, if one is near."""
    import difflib

    candidates = {child.name for root in (project_path("."), Path(os.getcwd())) if root.is_dir()
                  for child in root.iterdir() if child.is_dir() and (child / "tokenizer.json").is_file()}
    near = difflib.get_close_matches(name.rstrip("/").split("/")[-1], sorted(candidates), n=1, cutoff=0.75)
    return near[0] if near else None


@contextlib.contextmanager
def _quiet_hub_retries() -> Iterator[None]:
    """huggingface_hub logs each retry of a failing request as a raw warning; the error that follows says it all."""
    hub = logging.getLogger("huggingface_hub")
    level = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(level)


def tokenizer_fingerprint(name_or_path: str, tok: Any) -> str:
    """sha256 of the tokenizer's tokenizer.json (of its serialised form for a Hub tokenizer): its identity."""
    path = project_path(name_or_path) / "tokenizer.json"
    data = path.read_bytes() if path.is_file() else tok.backend_tokenizer.to_str().encode()
    return hashlib.sha256(data).hexdigest()


def check_source_tokenizers(config: MixConfig, name_or_path: str, tok: Any) -> None:
    """A pre-tokenized source that records its tokenizer (the mix entry's "tokenizer") must have been tokenized with
    the run's (`tok`, loaded from `name_or_path`): its ids would mean other tokens. One line otherwise, before any
    work."""
    ours = tok.backend_tokenizer.to_str()
    for spec in config.mix:
        if spec.tokenizer is not None and load_tokenizer(spec.tokenizer).backend_tokenizer.to_str() != ours:
            raise UserError(f"source {spec.label!r} was tokenized with {spec.tokenizer} (its \"tokenizer\"), not "
                            f"with this run's tokenizer {name_or_path}: use that tokenizer (TOKENIZER_DIR="
                            f"{spec.tokenizer}), or tokenize the source again with this one")
