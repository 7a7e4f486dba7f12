"""Results kept per evaluation setting (sparknet.eval.results): a smaller evaluation of the same data is kept beside
a fuller one and never replaces it, and the fullest one is what stands for the model; written as the scripts write
them (merge_json, save_results) and read back from the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparknet.common.errors import UserError
from sparknet.eval.benchmarks import save_results
from sparknet.eval.reports import merge_json
from sparknet.eval.results import check_benchmarks, check_perplexities, fullest_perplexities, perplexity_setting


def _row(documents: int, tokens: int, nll: float, data: str = "val.jsonl", context: int = 16) -> dict:
    return {"model": "m", "data": data, "split": None, "documents": documents, "tokens": tokens, "context": context,
            "stride": context // 2, "nll": nll}


def test_a_partial_perplexity_is_kept_beside_the_full_one_which_stands(tmp_path: Path) -> None:
    path = tmp_path / "perplexity.json"
    full, partial, other = _row(40, 40_011, 2.32), _row(3, 1_837, 2.10), _row(5, 900, 3.0, data="other.jsonl")
    for row in (full, partial, partial, other):  # the partial one twice: the same setting, one entry
        merge_json(path, perplexity_setting(row), row)
    kept = json.loads(path.read_text())
    assert list(kept.values()) == [full, partial, other]
    assert fullest_perplexities(kept) == [full, other]  # one per data, the fullest
    again = _row(40, 40_011, 2.31, context=32)  # as full, another window: the last written stands
    merge_json(path, perplexity_setting(again), again)
    assert fullest_perplexities(json.loads(path.read_text())) == [again, other]
    # a file from before settings were kept (keyed by data, no documents) is refused in one line, never read
    with pytest.raises(UserError, match=r"perplexity.json: the result 'val.jsonl' does not record its documents "
                                        r"\(written by an older SparkNet\): the file is not read; move it away"):
        check_perplexities(path, {"val.jsonl": {"data": "val.jsonl", "tokens": 10}, **kept})
    check_perplexities(path, kept)


def test_a_limited_benchmark_is_kept_beside_the_full_one_which_stands(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.json"
    full = {"acc": 0.41, "acc_stderr": 0.05, "items": 100, "shots": 0}
    limited = {"acc": 0.5, "acc_stderr": 0.07, "items": 50, "shots": 0}
    save_results(path, {"hellaswag": full, "piqa": {"acc": 0.6, "items": 20, "shots": 0}})
    save_results(path, {"hellaswag": limited})
    saved = json.loads(path.read_text())
    assert saved["results"] == {"hellaswag": full, "piqa": {"acc": 0.6, "items": 20, "shots": 0}}
    assert sorted((e["task"], e["items"]) for e in saved["settings"].values()) == [("hellaswag", 50),
                                                                                  ("hellaswag", 100), ("piqa", 20)]
    check_benchmarks(path, saved)
    # a file from before settings were kept, or a result in it without its items: refused in one line, never read
    with pytest.raises(UserError, match=r"keeps results without the settings .* move it away and evaluate again"):
        check_benchmarks(path, {"results": {"hellaswag": {"acc": 0.3}}})
    with pytest.raises(UserError, match=r"the result 'hellaswag, 100 items, 0-shot' does not record its items"):
        check_benchmarks(path, {**saved, "settings": {"hellaswag, 100 items, 0-shot": {"task": "hellaswag",
                                                                                       "shots": 0}}})


def test_what_a_benchmark_was_computed_on_as_lm_eval_reports_it() -> None:
    """The items and shots of a task, and of a group (its subtasks' items together; its shots where they agree),
    from the parts of lm-eval's output that say so (as lm_eval.evaluator_utils writes them)."""
    from sparknet.harness import computed_on

    output = {"n-samples": {"a": {"original": 80, "effective": 50}, "b": {"original": 30, "effective": 30},
                            "c": {"original": 9, "effective": 9}},
              "n-shot": {"a": 0, "b": 0, "c": 5, "ab": 0},
              "group_subtasks": {"ab": ["a", "b"], "abc": ["ab", "c"], "a": [], "b": [], "c": []}}
    assert computed_on(output, "a") == {"items": 50, "shots": 0}
    assert computed_on(output, "ab") == {"items": 80, "shots": 0}
    assert computed_on(output, "abc") == {"items": 89, "shots": "mixed"}


def _add_results(path: str, writer: int, n: int) -> None:
    from sparknet.eval.reports import merge_json

    for i in range(n):
        merge_json(Path(path), f"writer{writer}-{i}", {"bits_per_byte": float(i)})


def test_evaluations_writing_one_results_file_at_once_keep_every_result(tmp_path: Path) -> None:
    """Four processes adding 25 results each to one perplexity.json at the same time (evaluations of one model run
    side by side): every one of the 100 is in the file, none lost to another's write."""
    import multiprocessing

    path = tmp_path / "eval" / "run" / "perplexity.json"
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_add_results, args=(str(path), writer, 25)) for writer in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    assert sorted(json.loads(path.read_text())) == sorted(f"writer{w}-{i}" for w in range(4) for i in range(25))
