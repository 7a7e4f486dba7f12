"""Perplexity and bits per byte of one or several models on the same held-out text.

Every token is scored exactly once with a sliding window (each token after the first window sees at least
CONTEXT - STRIDE tokens before it); the mean is token-weighted. Bits per byte divide by the text's UTF-8 bytes, so
models with different tokenizers (a SparkNet run and gpt2) compare. Results: eval/<RUN_NAME>/perplexity.json and
perplexity.md per model, and with several models eval/<A>_vs_<B>/perplexity.md with one row per model.

DATA: a packed dataset folder (its SPLIT), a streaming run's `checkpoints/RUN/val_blocks.npy`, a mix config (the rows a
streaming run held out, or HOLDOUT_ROWS), a Hub dataset id or local folder (SPLIT, SUBSET), or JSONL, Parquet, CSV or
text files. Not set: every model is scored on the held-out data of the first model that records one (a packed run's val
split; a streaming run's validation blocks, about its VAL_TOKENS), so one table compares like with like.
"own": each model on its own held-out data, and the table says that its rows do not compare.
"""

MODELS = ["checkpoints/demo"]  # checkpoint folders (checkpoints/RUN_NAME, or a checkpoint-N inside) or Hub ids
DATA: str | None = None  # what to score (see above); None: the first run's held-out data; "own": each model's own
SPLIT = "val"  # split of a packed dataset or of a Hub dataset (e.g. test)
SUBSET: str | None = None  # subset (configuration) of a Hub dataset, e.g. wikitext-2-raw-v1
TEXT_FIELD = "text"  # column of the text in JSONL, Parquet and CSV files and Hub datasets
HOLDOUT_ROWS = 0  # mix config as DATA: rows from each source's start (0: those a streaming run among MODELS held out)
CONTEXT: int | None = None  # window length in tokens (None: the model's context)
STRIDE: int | None = None  # tokens the window moves by (None: CONTEXT // 2); STRIDE = CONTEXT: disjoint windows
BATCH_SIZE = 8  # windows per forward pass
MAX_DOCUMENTS = 0  # score only the first N documents (0: all)
EVAL_DIR = "eval"  # results go to EVAL_DIR/<RUN_NAME>/


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import check_outputs
    from sparknet.eval.models import resolve_model
    from sparknet.eval.reports import comparison_name, eval_dir, eval_outputs

    names = [resolve_model(spec).name for spec in MODELS]  # each model checked; its name names its results folder
    check_outputs(*eval_outputs(names, EVAL_DIR))
    runtime.setup(0)
    from sparknet.eval.data import DataRequest
    from sparknet.eval.perplexity import evaluate_perplexity, perplexity_table

    request = DataRequest(DATA or "", text_field=TEXT_FIELD, split=SPLIT, subset=SUBSET, max_documents=MAX_DOCUMENTS,
                          holdout_rows=HOLDOUT_ROWS)
    rows = evaluate_perplexity(MODELS, request, context=CONTEXT, stride=STRIDE, batch_size=BATCH_SIZE,
                               eval_root=EVAL_DIR)
    print(perplexity_table(rows))
    if len(names) > 1:
        out = eval_dir(comparison_name(names), EVAL_DIR) / "perplexity.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        runtime.write_text_atomic(out, perplexity_table(rows, markdown=True))
        print(f"table: {out}")
    else:
        print(f"results: {eval_dir(names[0], EVAL_DIR)}/perplexity.json")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
