"""Sliding-window negative log-likelihood of documents by any causal LM, and the perplexity evaluation of one or
several models on the same text (scripts/eval_perplexity.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparknet.common.errors import UserError
from sparknet.eval.models import ModelRef, load_model, resolve_model, tokenizer_source
from sparknet.model.metrics import bits_per_byte, perplexity
from sparknet.model.presets import model_context

if TYPE_CHECKING:
    from sparknet.eval.data import DataRequest

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
    result = _summed(texts, _document_nll(model, tokenizer, texts, context, stride, batch_size, progress))
    _check_scored(result, len(texts), context, stride)
    return result


def _summed(texts: list[str], scores: list[tuple[float, int]]) -> NllResult:
    """The token-weighted totals of documents' (nll sum, tokens)."""
    return NllResult(nll_sum=sum(nll for nll, _ in scores), tokens=sum(n for _, n in scores),
                     bytes=sum(len(t.encode("utf-8")) for t in texts), documents=len(texts))


def _check_scored(result: NllResult, documents: int, context: int, stride: int) -> None:
    if result.tokens == 0:  # a perplexity of 1.0 from no tokens would read as a perfect score
        raise UserError(f"no tokens were scored ({documents} documents, context {context}, stride {stride}): "
                        "check DATA and CONTEXT")


def _document_nll(model: Any, tokenizer: Any, texts: list[str], context: int, stride: int, batch_size: int,
                  progress: bool) -> list[tuple[float, int]]:
    """Each document's (nll sum in nats, tokens scored), all documents' windows in one pass (one progress bar),
    batched by length."""
    import torch

    from sparknet.common.progress import progress as progress_bar

    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]  # long texts are windowed
    jobs = []  # (document, begin, stop, first_target)
    sequences = [[prefix, *ids] for ids in encoded]
    for doc, ids in enumerate(sequences):
        jobs += [(doc, *window) for window in sliding_windows(len(ids), context, stride)]
    jobs.sort(key=lambda job: job[2] - job[1])  # similar lengths together: little padding
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else prefix
    nll, counts = [0.0] * len(texts), [0] * len(texts)
    with torch.inference_mode(), progress_bar(total=len(jobs), desc="windows", unit="win",
                                              disable=not progress) as bar:
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
            rows = torch.where(keep, losses.double(), 0.0).sum(dim=1).tolist()  # one transfer per batch
            for (doc, *_), row_nll, row_tokens in zip(batch, rows, keep.sum(dim=1).tolist(), strict=True):
                nll[doc] += row_nll
                counts[doc] += int(row_tokens)
            bar.update(len(batch))
    return list(zip(nll, counts, strict=True))


def score_by_source(model: Any, tokenizer: Any, texts: list[str], labels: list[str] | None, context: int,
                    stride: int, batch_size: int = 8) -> tuple[NllResult, dict[str, NllResult]]:
    """`score_documents` over all texts, and per source label when `labels` (each text's) are given: every document
    scored once, in one pass, and its figures added to its source's; the whole is their sums (a document's windows
    never reach another's)."""
    if labels is None:
        return score_documents(model, tokenizer, texts, context, stride, batch_size), {}
    scores = _document_nll(model, tokenizer, texts, context, stride, batch_size, progress=True)
    per_source = {}
    for label in dict.fromkeys(labels):
        mine = [i for i, lab in enumerate(labels) if lab == label]
        per_source[label] = _summed([texts[i] for i in mine], [scores[i] for i in mine])
    total = NllResult()
    for figures in per_source.values():
        total.nll_sum += figures.nll_sum
        total.tokens += figures.tokens
        total.bytes += figures.bytes
        total.documents += figures.documents
    _check_scored(total, len(texts), context, stride)
    return total, per_source


PERPLEXITY_HEADER = ["model", "data", "documents", "tokens", "bytes", "nll", "perplexity", "bits/byte"]
# What the tokens column counts, beside the other counts of a packed validation split (docs/evaluation.md)
TOKENS_SCORED = ("tokens: each document's own tokens, each scored once from those before it; the build's count of the "
                 "split adds an <|endoftext|> per document, the trainer's eval (and the card's per-source rows) every "
                 "token of a block but its first")
OWN_DATA = "own"  # DATA for "each model on its own held-out data" (the table then says its rows differ)


def data_for_models(refs: list[ModelRef], data: str) -> tuple[list[str], str]:
    """What each model is scored on, and a line saying so. DATA given: that, for every model. DATA empty: the
    held-out data of the first model that records one (its packed dataset's val split, or a streaming run's
    validation blocks), for every model, so that one table compares like with like. DATA "own": each model's own."""
    from sparknet.eval.data import trained_on

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
    their setting, sparknet.eval.results: other data's, and fuller or smaller evaluations of the same data, are kept)
    and perplexity.md (every result kept); returns one result row per model."""
    import dataclasses
    import logging
    import time

    from sparknet.common.runtime import write_text_atomic
    from sparknet.eval.data import check_unchanged, data_kind, load_labelled_documents
    from sparknet.eval.reports import check_results, eval_dir, merge_json, results_kept
    from sparknet.eval.results import check_perplexities, perplexity_setting

    if not models:
        raise UserError("no models: set MODELS to a list of checkpoint folders or Hub ids")
    refs = [resolve_model(spec) for spec in models]  # every name checked before any is loaded
    runs = [ref.folder for ref in refs if ref.folder is not None]
    check_results([eval_dir(ref.name, eval_root) / "perplexity.json" for ref in refs], check_perplexities)
    sources, line = data_for_models(refs, request.data)
    for ref, source in zip(refs, sources, strict=True):
        check_unchanged(ref.folder, source)
    log = logging.getLogger("sparknet.eval")
    if len(refs) > 1 or not request.data:
        log.info(line)
    documents: dict[str, tuple[list[str], list[str] | None]] = {}
    rows = []
    for ref, source in zip(refs, sources, strict=True):
        if source not in documents:
            # a pre-tokenized source is decoded with the first model's tokenizer
            documents[source] = load_labelled_documents(dataclasses.replace(
                request, data=source, runs=runs, decode_with=tokenizer_source(refs[0])))
        _say_what_it_may_have_seen(ref, source, request.split, *documents[source])
        model, tokenizer, device = load_model(ref)
        window = model_context(model) if context is None else context
        if not 0 < window <= model_context(model):
            raise UserError(f"CONTEXT must be in 1..{model_context(model)} ({ref.spec}'s context), got {window}")
        step = window // 2 if stride is None else stride
        started = time.time()
        result, per_source = score_by_source(model, tokenizer, *documents[source], window, step, batch_size)
        kind = data_kind(source)
        row = {"model": ref.spec, "data": source, "kind": kind,
               "split": request.split if kind in ("packed", "dataset") else None,
               "context": window, "stride": step, **result.as_dict(), "device": device,
               "seconds": round(time.time() - started, 2)}
        if per_source:
            row["sources"] = {label: figures.as_dict() for label, figures in per_source.items()}
        out = eval_dir(ref.name, eval_root)
        rows.append(row)
        # a write fault loses none of the scores: the rows so far printed and saved elsewhere, in one line
        with results_kept("perplexity results", rows, perplexity_table(rows)):
            kept = merge_json(out / "perplexity.json", perplexity_setting(row), row)
            write_text_atomic(out / "perplexity.md", perplexity_table(list(kept.values()), markdown=True))
        _say_when_fuller_is_kept(row, kept)
        del model
    return rows


def _say_what_it_may_have_seen(ref: ModelRef, source: str, split: str, texts: list[str],
                               labels: list[str] | None) -> None:
    """A warning when a model is scored on data other than its own held-out data and some of the documents come from
    sources it was trained on (their files' sha256s, or Hub ids, against its run's records), with how many; none for
    its own held-out data (a packed dataset's validation split equal to a streaming run's hold-out included), for
    data it never trained on, and for a model that records no training data."""
    import logging

    from sparknet.common.runtime import project_path
    from sparknet.eval.data import data_kind, is_runs_hold_out, streamed_from, trained_on
    from sparknet.eval.overlap import documents_trained_on

    try:
        own = trained_on(ref.folder, ref.spec)
    except UserError:
        return  # no record of its training data (a Hub model)
    if project_path(own).resolve() == project_path(source).resolve():  # its own held-out data, however spelled
        return
    if streamed_from(ref.folder, source):  # a streaming run's own mix: its held-out rows, which it never trained on
        return
    if is_runs_hold_out(ref.folder, source, split):  # the build of its config: val.bin is its own hold-out
        return
    kind = data_kind(source)
    found = documents_trained_on(ref.folder, source, kind, labels, len(texts))
    if found is None or not found[0]:
        return
    count, names = found
    logging.getLogger("sparknet.eval").warning(
        "%s may have trained on up to %d of the %d documents of %s: they come from sources it was trained on (%s), "
        "and only its own held-out data (%s) is known to be unseen", ref.spec, count, len(texts), source,
        ", ".join(names), own)


def _say_when_fuller_is_kept(row: dict[str, Any], kept: dict[str, Any]) -> None:
    """One line when this result is smaller than one already kept on the same data (MAX_DOCUMENTS): both are kept,
    and the card shows the fuller one."""
    import logging

    from sparknet.eval.results import fullest_perplexities

    fuller = [other for other in fullest_perplexities(kept) if other is not row
              and (other.get("data"), other.get("split")) == (row["data"], row["split"])]
    if fuller:
        logging.getLogger("sparknet.eval").info(
            "%s: this result (%s documents, %s tokens) is kept beside a fuller one on the same data (%s documents, "
            "%s tokens): the card shows the fuller result", row["model"], row["documents"], row["tokens"],
            fuller[0].get("documents", "?"), fuller[0].get("tokens", "?"))


def perplexity_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The results as a table (console or markdown); when its rows were scored on different data, a last line
    under it says that they do not compare."""
    from sparknet.eval.reports import console_table, markdown_table

    # under each result, a row per mix source when it has them ("data [label]")
    lines = [line for r in rows for line in [perplexity_row(r), *(
        perplexity_row({**r, **figures, "data": f"{r.get('data', '-')} [{label}]"})
        for label, figures in r.get("sources", {}).items())]]
    table = (markdown_table if markdown else console_table)(PERPLEXITY_HEADER, lines)
    # what the tokens column counts, under the table (the markdown table ends in a newline, the console one not)
    table += f"\n{TOKENS_SCORED[0].upper()}{TOKENS_SCORED[1:]}.\n" if markdown else f"\n{TOKENS_SCORED}"
    data = sorted({str(row.get("data")) for row in rows})
    if len(data) > 1:
        note = f"note: these rows were scored on different data ({', '.join(data)}): their numbers do not compare"
        table = table.rstrip("\n") + ("\n\n" if markdown else "\n") + note + ("\n" if markdown else "")
    return table


def perplexity_row(row: dict[str, Any]) -> list[Any]:
    return [row.get("model", "-"), row.get("data", "-"), row.get("documents", "-"), row.get("tokens", "-"),
            row.get("bytes", "-"), row.get("nll", "-"), row.get("perplexity", "-"), row.get("bits_per_byte", "-")]
