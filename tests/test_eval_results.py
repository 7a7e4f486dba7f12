"""Results kept per evaluation setting (sparknet.eval.results): a smaller evaluation of the same data is kept beside
a fuller one and never replaces it, and the fullest one is what stands for the model; written as the scripts write
them (merge_json, save_results) and read back from the file."""

from __future__ import annotations

import json
from pathlib import Path

from sparknet.eval.benchmarks import save_results
from sparknet.eval.reports import merge_json
from sparknet.eval.results import fullest_perplexities, perplexity_setting


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
    # a file from before settings were kept (keyed by data, no documents) reads too
    assert fullest_perplexities({"val.jsonl": {"data": "val.jsonl", "tokens": 10}, **kept}) == [full, other]


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
    # a file from before settings were kept: its results are kept, as of unknown size (a recorded one stands)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"results": {"hellaswag": {"acc": 0.3}}}))
    save_results(old, {"hellaswag": limited})
    saved = json.loads(old.read_text())
    assert saved["results"] == {"hellaswag": limited}
    assert {"task": "hellaswag", "acc": 0.3} in saved["settings"].values()


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
