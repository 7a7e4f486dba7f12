"""BENCHMARK_EVERY: the offline suite scored every N evaluations during training, into TensorBoard, changing nothing
about the training itself."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import read_events, read_steps, train_packed, train_settings


def test_the_benchmark_runs_every_n_evaluations_and_leaves_training_as_it_was(tiny_dataset: Path,
                                                                             tmp_path: Path) -> None:
    # dropout on, so that a benchmark that moved the RNG would change the weights
    run = dict(target_tokens=16 * 4 * 128, eval_steps=4, save_steps=8, sample_steps=0, dropout=0.1,
               record_batches=True)
    plain = train_packed(train_settings(tmp_path / "a", **run), tiny_dataset)
    benched = train_packed(train_settings(tmp_path / "b", benchmark_every=2, benchmark_limit=12, **run), tiny_dataset)
    assert plain.status == benched.status == "finished"

    events = read_events(tmp_path / "b" / "logs" / "run")
    acc = events["benchmark/sparknet_continuation/acc"]
    assert [step for step, _ in acc] == [0, 8, 16]  # evaluations at 0, 4, 8, 12, 16: every second one
    assert all(0.0 <= value <= 1.0 for _, value in acc)
    assert [step for step, _ in events["benchmark/sparknet_continuation/acc_norm"]] == [0, 8, 16]
    items = (benched.run_dir / "benchmark_suite" / "sparknet_continuation.jsonl").read_text().splitlines()
    assert len(items) == 12
    assert not any(tag.startswith("benchmark/") for tag in read_events(tmp_path / "a" / "logs" / "run"))

    # the same blocks, LR and weights at every step as the run without it
    expected, got = read_steps(plain.run_dir / "batches.jsonl"), read_steps(benched.run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 17))
    for step in expected:
        assert (got[step]["lr"], got[step]["blocks"], got[step]["weights"]) == (
            expected[step]["lr"], expected[step]["blocks"], expected[step]["weights"]), step
