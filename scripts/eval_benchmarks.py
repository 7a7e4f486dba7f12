"""Benchmarks through lm-eval-harness: the usual small-model tasks from the Hub, and the project's offline suite
(sparknet_continuation: multiple-choice continuations of held-out documents, generated from SUITE_DATA into
SUITE_DIR). Results: eval/<RUN_NAME>/benchmarks.json (read by scripts/export_model.py for the card's model-index)
and a markdown table with one column per model (several models: eval/<A>_vs_<B>/benchmarks.md).
"""

MODELS = ["checkpoints/demo"]  # checkpoint folders (checkpoints/RUN_NAME, or a checkpoint-N inside) or Hub ids
TASKS = ["sparknet_continuation"]  # lm-eval task names; the Hub ones: hellaswag, piqa, arc_easy, arc_challenge, ...
LIMIT = 0  # items per task (0: all)
BATCH_SIZE = 8  # lm-eval batch size
NUM_FEWSHOT: int | None = None  # few-shot examples (None: the task's default)
SUITE_DATA = "data/demo/prose.val.jsonl"  # held-out documents the offline suite is made from (JSONL/text/packed)
SUITE_ITEMS = 200  # items of the offline suite
SUITE_DIR = "eval/suite"  # where the offline suite's JSONL and task YAML are written
SEED = 0  # seed of the offline suite's items
EVAL_DIR = "eval"  # results go to EVAL_DIR/<RUN_NAME>/


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.errors import UserError
    from sparknet.common.outputs import Output, check_outputs
    from sparknet.eval.models import resolve_model
    from sparknet.eval.reports import eval_outputs
    from sparknet.harness import SUITE_TASK

    if not MODELS or not TASKS:
        raise UserError("set MODELS and TASKS (JSON lists)")
    refs = [resolve_model(spec) for spec in MODELS]
    suite = [Output("SUITE_DIR", runtime.project_path(SUITE_DIR))] if SUITE_TASK in TASKS else []
    check_outputs(*suite, *eval_outputs([ref.name for ref in refs], EVAL_DIR))
    runtime.setup(SEED)
    from sparknet.eval.benchmarks import benchmark_table, save_results
    from sparknet.eval.data import load_documents
    from sparknet.eval.models import check_loadable, tokenizer_source
    from sparknet.eval.reports import (
        check_results,
        comparison_name,
        console_table,
        eval_dir,
        markdown_table,
        results_kept,
    )
    from sparknet.eval.results import check_benchmarks
    from sparknet.harness import run_benchmarks, write_offline_suite
    from sparknet.tokenizer import load_tokenizer

    for ref in refs:
        check_loadable(ref)
    check_results([eval_dir(ref.name, EVAL_DIR) / "benchmarks.json" for ref in refs], check_benchmarks)
    include = None
    if SUITE_TASK in TASKS:
        include = write_offline_suite(load_documents(SUITE_DATA), runtime.project_path(SUITE_DIR), SUITE_ITEMS, SEED)
    results = []
    for ref in refs:
        # loaded by SparkNet, not by lm-eval from the folder: special-token text in a task's text is text, as in
        # training (sparknet.tokenizer's rule; the folder's own config encodes it as the eos id, as users expect)
        scores = run_benchmarks(ref.source, load_tokenizer(tokenizer_source(ref)), TASKS, include, limit=LIMIT or None,
                                batch_size=BATCH_SIZE, num_fewshot=NUM_FEWSHOT)
        results.append(scores)
        done = [r.spec for r in refs[:len(results)]]
        # a write fault loses none of the scores: those so far printed and saved elsewhere, in one line
        with results_kept("benchmark results", dict(zip(done, results, strict=True)),
                          console_table(*benchmark_table(done, results))):
            save_results(eval_dir(ref.name, EVAL_DIR) / "benchmarks.json", scores)
    header, rows = benchmark_table([ref.spec for ref in refs], results)
    print(console_table(header, rows))
    out = eval_dir(comparison_name([r.name for r in refs]) if len(refs) > 1 else refs[0].name, EVAL_DIR)
    out.mkdir(parents=True, exist_ok=True)
    runtime.write_text_atomic(out / "benchmarks.md", markdown_table(header, rows))
    print(f"table: {out / 'benchmarks.md'}")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
