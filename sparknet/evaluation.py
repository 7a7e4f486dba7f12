"""Metrics on held-out text: perplexity, bits per byte (comparable across tokenizers), unigram entropy; the
sliding-window scoring of documents by any causal LM (a run folder, a checkpoint-N, a Hub id); sampling.

Bits per byte turn a per-token loss into a per-byte one, `loss / ln 2 × tokens / bytes`, so that models with
different tokenizers compare on the same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet.errors import UserError

if TYPE_CHECKING:
    from sparknet.eval_data import DataRequest


def perplexity(loss: float) -> float:
    """exp(loss), kept finite for display (inf only when the loss itself is)."""
    if not math.isfinite(loss):
        return float("inf")
    return math.exp(min(loss, 700.0))


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """UTF-8 bytes each token id stands for (special tokens: 0), so that the bytes of any token sequence are a sum.

    Exact for byte-level BPE (GPT-2 style: each character of a token is one byte), whatever the block boundaries
    cut: decoding a block that starts inside a multi-byte character would add replacement characters instead.
    Other tokenizers fall back to decoding each token alone.
    """
    from tokenizers import decoders

    backend = tokenizer.backend_tokenizer
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    lengths = np.zeros(len(vocab), dtype=np.int64)
    byte_level = isinstance(backend.decoder, decoders.ByteLevel)
    for token_id, token in enumerate(vocab):
        if token_id in special or token is None:
            continue
        if byte_level:
            lengths[token_id] = len(token)  # one character of the byte-level alphabet per byte
        else:
            lengths[token_id] = len(tokenizer.decode([token_id]).encode("utf-8"))
    return lengths


def utf8_bytes(tokenizer: Any, tokens: np.ndarray) -> int:
    """UTF-8 bytes of the text the tokens stand for, counted per token id (special tokens count as none)."""
    lengths = token_byte_lengths(tokenizer)
    return int(lengths[np.asarray(tokens).reshape(-1).astype(np.int64)].sum())


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    """Mean loss in nats per token turned into bits per UTF-8 byte."""
    return loss / math.log(2) * tokens / max(n_bytes, 1)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the token frequencies: the loss of the best model that ignores context."""
    counts = np.bincount(np.asarray(tokens).reshape(-1), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


# ---------------------------------------------------------------------------------------------------------------
# Models to evaluate: a run folder, a checkpoint-N inside it, or a Hub id.

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class ModelRef:
    """What the user named (`spec`), what `from_pretrained` loads (`source`), and the results folder name."""

    spec: str
    source: str
    name: str  # eval/<name>/: RUN_NAME, RUN_NAME/checkpoint-N, or the Hub id with "/" as "__"
    folder: Path | None  # None for a Hub id


def resolve_model(spec: str) -> ModelRef:
    """A model folder (relative to the project root) or a Hub id; a folder that holds no model is a UserError."""
    from sparknet.runtime import project_path

    folder = project_path(spec)
    if folder.exists():
        if not (folder / "config.json").is_file() or not any((folder / w).is_file() for w in WEIGHT_FILES):
            checkpoints = sorted(folder.glob("checkpoint-*")) if folder.is_dir() else []
            held = ", ".join(c.name for c in checkpoints[-3:])
            hint = (f"; it holds {held}: pass one of those, or let the run finish" if checkpoints else
                    ": pass checkpoints/RUN_NAME of a finished run, a checkpoint-N inside it, or a Hub id such as gpt2")
            raise UserError(f"{folder} is not a model folder (no config.json and weights){hint}")
        run = folder.parent.name if folder.name.startswith("checkpoint-") else None
        return ModelRef(spec, str(folder), f"{run}/{folder.name}" if run else folder.name, folder)
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or not spec.strip():
        raise UserError(f"model folder {spec} not found (looked for {folder}): pass checkpoints/RUN_NAME or a Hub id")
    parent = project_path(spec.split("/")[0])
    if "/" in spec and _holds_models(parent):  # "checkpoints/dmeo": a mistyped run, not the Hub's user "checkpoints"
        held = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise UserError(f"model folder {spec} not found (looked for {folder}); {parent.name}/ holds: "
                        f"{', '.join(held[:10]) or 'nothing'}")
    return ModelRef(spec, spec, spec.replace("/", "__"), None)


def _holds_models(folder: Path) -> bool:
    """A local folder of runs or exports (so `folder/x` names a model folder, not a Hub repository `folder/x`)."""
    if not folder.is_dir():
        return False
    if folder.name in ("checkpoints", "exports"):
        return True
    return any((child / "config.json").is_file() or any(child.glob("checkpoint-*"))
               for child in folder.iterdir() if child.is_dir())


def tokenizer_source(ref: ModelRef) -> str:
    """The model's own tokenizer: its folder, else (a Trainer checkpoint saved without one) the run folder's."""
    if ref.folder is not None and not (ref.folder / "tokenizer.json").is_file():
        parent = ref.folder.parent
        if (parent / "tokenizer.json").is_file():
            return str(parent)
    return ref.source


def _cannot_load(ref: ModelRef, exc: Exception) -> UserError:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return UserError(f"cannot load model {ref.spec!r} ({type(exc).__name__}: {first}); Hub ids need network access "
                     "or a cached copy")


def check_loadable(ref: ModelRef) -> None:
    """Reads the model's config (cheap), so that a model that cannot be loaded is one line before any work starts."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(ref.source)
    except Exception as exc:  # noqa: BLE001 - reported against the user's value with the library's reason
        raise _cannot_load(ref, exc) from None


def load_model(ref: ModelRef, device: str | None = None) -> tuple[Any, Any, str]:
    """(model in eval mode, tokenizer, device): bf16 on a CUDA GPU that has it, fp32 elsewhere."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparknet.runtime import hide_library_progress_bars
    from sparknet.tokenizer import load_tokenizer

    hide_library_progress_bars()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(ref.source, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - reported against the user's value with the library's reason
        raise _cannot_load(ref, exc) from None
    tokenizer = load_tokenizer(tokenizer_source(ref))
    return model.to(device).eval(), tokenizer, device


def model_context(model: Any) -> int:
    """The longest input the model takes (its position table)."""
    config = model.config
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise UserError(f"cannot tell the context length of {type(model).__name__}: set CONTEXT")


# ---------------------------------------------------------------------------------------------------------------
# Sliding-window negative log-likelihood.

def sliding_windows(length: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows `(begin, stop, first)` over a sequence of `length` tokens whose token 0 is a prefix (<|endoftext|>)
    that is never a target: a window reads the tokens [begin, stop - 1) (at most `context`; every position predicts
    the next token) and scores the targets [first, stop). Every target 1..length-1 is scored exactly once; after
    the first window each target sees at least context - stride + 1 tokens of its window before it (so disjoint
    windows, stride = context, still give each target one token of context)."""
    if not 0 < stride <= context:
        raise UserError(f"STRIDE must be in 1..CONTEXT ({context}), got {stride}")
    windows, begin, scored_to = [], 0, 1
    while scored_to < length:
        stop = min(begin + context + 1, length)
        windows.append((begin, stop, scored_to))
        scored_to = stop
        begin += stride
    return windows


@dataclass
class NllResult:
    """Token-weighted totals over every document."""

    nll_sum: float = 0.0  # nats
    tokens: int = 0
    bytes: int = 0
    documents: int = 0

    @property
    def nll(self) -> float:
        return self.nll_sum / max(self.tokens, 1)

    def as_dict(self) -> dict[str, Any]:
        return {"nll": self.nll, "perplexity": perplexity(self.nll), "bits_per_byte": bits_per_byte(
            self.nll, self.tokens, self.bytes), "tokens": self.tokens, "bytes": self.bytes, "documents": self.documents}


def score_documents(model: Any, tokenizer: Any, texts: list[str], context: int, stride: int, batch_size: int = 8,
                    progress: bool = True) -> NllResult:
    """Sliding-window NLL of every token of every document, each document on its own after a <|endoftext|> prefix
    (the first token is predicted from the document boundary, as in training). Bytes are the texts' UTF-8 bytes,
    so bits per byte compare across tokenizers."""
    import torch

    from sparknet.progress import progress

    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]  # long texts are windowed
    jobs = []  # (document, begin, stop, first_target)
    result = NllResult(documents=len(texts), bytes=sum(len(t.encode("utf-8")) for t in texts))
    sequences = [[prefix, *ids] for ids in encoded]
    for doc, ids in enumerate(sequences):
        jobs += [(doc, *window) for window in sliding_windows(len(ids), context, stride)]
    jobs.sort(key=lambda job: job[2] - job[1])  # similar lengths together: little padding
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else prefix
    with torch.inference_mode(), progress(total=len(jobs), desc="windows", unit="win", disable=not progress) as bar:
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start:start + batch_size]
            width = max(stop - 1 - begin for _, begin, stop, _ in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            labels = torch.full((len(batch), width), pad, dtype=torch.long)  # labels[j] = the token after ids[j]
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            keep = torch.zeros((len(batch), width), dtype=torch.bool)  # the labels this window scores
            for row, (doc, begin, stop, first) in enumerate(batch):
                sequence = sequences[doc]
                ids[row, : stop - 1 - begin] = torch.tensor(sequence[begin: stop - 1])
                labels[row, : stop - 1 - begin] = torch.tensor(sequence[begin + 1: stop])
                mask[row, : stop - 1 - begin] = 1
                keep[row, first - 1 - begin: stop - 1 - begin] = True
            ids, labels, mask, keep = ids.to(device), labels.to(device), mask.to(device), keep.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            result.nll_sum += float(losses[keep].double().sum())
            result.tokens += int(keep.sum())
            bar.update(len(batch))
    if result.tokens == 0:  # a perplexity of 1.0 from no tokens would read as a perfect score
        raise UserError(f"no tokens were scored ({len(texts)} documents, context {context}, stride {stride}): "
                        "check DATA and CONTEXT")
    return result


PERPLEXITY_HEADER = ["model", "data", "tokens", "bytes", "nll", "perplexity", "bits/byte"]
OWN_DATA = "own"  # DATA for "each model on its own held-out data" (the table then says its rows differ)


def data_for_models(refs: list[ModelRef], data: str) -> tuple[list[str], str]:
    """What each model is scored on, and a line saying so. DATA given: that, for every model. DATA empty: the
    held-out data of the first model that records one (its packed dataset's val split, or a streaming run's
    validation blocks), for every model, so that one table compares like with like. DATA "own": each model's own."""
    from sparknet.eval_data import trained_on

    if data and data != OWN_DATA:
        return [data] * len(refs), f"every model is scored on {data}"
    if data == OWN_DATA:
        return [trained_on(ref.folder, ref.spec) for ref in refs], "each model is scored on its own held-out data"
    for ref in refs:
        try:
            source = trained_on(ref.folder, ref.spec)
        except UserError:
            continue
        return [source] * len(refs), f"every model is scored on {source}, the held-out data of {ref.spec}"
    raise UserError("no DATA given and no model among MODELS records the data it was trained on (a run folder's "
                    "training_metadata.json): set DATA")


def evaluate_perplexity(models: list[str], request: DataRequest, *, context: int | None = None,
                        stride: int | None = None, batch_size: int = 8,
                        eval_root: str = "eval") -> list[dict[str, Any]]:
    """Scores each model on the data `data_for_models` picks; writes eval/<name>/perplexity.json (results keyed by
    data, so other data's are kept) and perplexity.md; returns one result row per model."""
    import dataclasses
    import logging
    import time

    from sparknet.eval_data import data_kind, load_documents, trained_on
    from sparknet.reports import eval_dir, merge_json

    if not models:
        raise UserError("no models: set MODELS to a list of checkpoint folders or Hub ids")
    refs = [resolve_model(spec) for spec in models]  # every name checked before any is loaded
    runs = [ref.folder for ref in refs if ref.folder is not None]
    sources, line = data_for_models(refs, request.data)
    log = logging.getLogger("sparknet.eval")
    if len(refs) > 1 or not request.data:
        log.info(line)
    for ref, source in zip(refs, sources, strict=True):
        try:
            own = trained_on(ref.folder, ref.spec)
        except UserError:
            continue  # no record of its training data (a Hub model)
        if own != source and len(set(sources)) == 1:
            log.warning("%s was trained on other data (%s): it may have seen parts of %s in training", ref.spec,
                        own, source)
    documents: dict[str, list[str]] = {}
    rows = []
    for ref, source in zip(refs, sources, strict=True):
        if source not in documents:
            documents[source] = load_documents(dataclasses.replace(request, data=source, runs=runs))
        model, tokenizer, device = load_model(ref)
        window = model_context(model) if context is None else context
        if not 0 < window <= model_context(model):
            raise UserError(f"CONTEXT must be in 1..{model_context(model)} ({ref.spec}'s context), got {window}")
        step = window // 2 if stride is None else stride
        started = time.time()
        result = score_documents(model, tokenizer, documents[source], window, step, batch_size)
        kind = data_kind(source)
        row = {"model": ref.spec, "data": source, "kind": kind,
               "split": request.split if kind in ("packed", "dataset") else None,
               "context": window, "stride": step, **result.as_dict(), "device": device,
               "seconds": round(time.time() - started, 2)}
        out = eval_dir(ref.name, eval_root)
        merge_json(out / "perplexity.json", source, row)
        (out / "perplexity.md").write_text(perplexity_table([row], markdown=True))
        rows.append(row)
        del model
    return rows


def perplexity_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The results as a table (console or markdown); when its rows were scored on different data, a last line
    under it says that they do not compare."""
    from sparknet.reports import console_table, markdown_table

    table = (markdown_table if markdown else console_table)(PERPLEXITY_HEADER, [perplexity_row(r) for r in rows])
    data = sorted({row["data"] for row in rows})
    if len(data) > 1:
        note = f"note: these rows were scored on different data ({', '.join(data)}): their numbers do not compare"
        table = table.rstrip("\n") + ("\n\n" if markdown else "\n") + note + ("\n" if markdown else "")
    return table


def perplexity_row(row: dict[str, Any]) -> list[Any]:
    return [row["model"], row["data"], row["tokens"], row["bytes"], row["nll"], row["perplexity"],
            row["bits_per_byte"]]


# ---------------------------------------------------------------------------------------------------------------
# Sampling.

@dataclass
class SamplingSettings:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 50
    repetition_penalty: float = 1.0
    max_new_tokens: int = 64
    num_samples: int = 2
    seed: int = 1234

    def __post_init__(self) -> None:
        from sparknet.checks import check_values

        check_values({name.upper(): value for name, value in vars(self).items()})


def load_prompts(prompts: list[str], prompts_file: str = "") -> list[str]:
    """The prompts: one per line of `prompts_file` (blank lines skipped; `\\n` stands for a newline), else `prompts`."""
    from sparknet.runtime import project_path

    if prompts_file:
        path = project_path(prompts_file)
        if not path.is_file():
            raise UserError(f"prompts file {prompts_file} not found (looked for {path})")
        prompts = [line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise UserError("no prompts: set PROMPTS or PROMPTS_FILE")
    return prompts


def generate_samples(model: Any, tokenizer: Any, prompts: list[str], settings: SamplingSettings) -> list[list[str]]:
    """`num_samples` continuations per prompt (the generated text only). The seed is set again before each prompt,
    so a prompt's samples depend only on the model, the prompt and the settings, not on what ran before."""
    import torch
    from transformers import set_seed

    sample = settings.temperature > 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    options = dict(max_new_tokens=settings.max_new_tokens, do_sample=sample, pad_token_id=pad,
                   repetition_penalty=settings.repetition_penalty, num_return_sequences=settings.num_samples)
    if sample:
        options.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    else:
        options["num_return_sequences"] = 1  # greedy: every sample would be the same
    device = next(model.parameters()).device
    out = []
    for prompt in prompts:
        set_seed(settings.seed)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
        with torch.inference_mode():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
        out.append([tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True) for row in generated])
    return out


def generation_report(names: list[str], prompts: list[str], samples: list[list[list[str]]],
                      settings: SamplingSettings) -> str:
    """Markdown: the settings, then per prompt each model's samples side by side (one column per model)."""
    from sparknet.reports import markdown_table

    lines = ["# Samples", "", "settings: " + ", ".join(f"{k}={v}" for k, v in vars(settings).items()), ""]
    for index, prompt in enumerate(prompts):
        lines += [f"## Prompt {index + 1}", "", "```", prompt, "```", ""]
        rows = []
        for number in range(max(len(per_model[index]) for per_model in samples)):
            rows.append([number + 1] + [_cell(prompt, per_model[index][number]) if number < len(per_model[index])
                                        else "" for per_model in samples])
        lines.append(markdown_table(["#", *names], rows))
    return "\n".join(lines)


def _cell(prompt: str, text: str) -> str:
    """Prompt in bold, then the continuation, on one table line (newlines as <br>)."""
    def flat(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", "<br>")

    return f"**{flat(prompt)}**{flat(text)}"
