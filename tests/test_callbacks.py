"""The throughput window of MetricsCallback, driven through the Trainer's callback hooks with real clocks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from sparknet.train.callbacks import MetricsCallback, MetricsSpec
from tests.helpers import read_events


def _callback(tmp_path: Path, **kw: object) -> tuple[MetricsCallback, object]:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    spec = MetricsSpec(tokens_per_step=1000, block_size=100, flops_per_token=1.0, peak_flops=1e6, world_size=1,
                       eval_tokens=0, eval_bytes=0, device_kind="cpu", **kw)  # type: ignore[arg-type]
    metrics = MetricsCallback(spec=spec, writer=writer, grad_norms=[])
    return metrics, writer


def read_steps(metrics: MetricsCallback, state: TrainerState, n: int, train_s: float, pause_s: float = 0.0) -> None:
    args, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerControl()
    for _ in range(n):
        metrics.on_step_begin(args, state, control)
        time.sleep(train_s)
        state.global_step += 1
        metrics.on_step_end(args, state, control)
        if pause_s:  # sampling, then an eval, after the step: all of it is not training
            time.sleep(pause_s / 2)
            metrics.pause()
            time.sleep(pause_s / 2)
            metrics.on_evaluate(args, state, control, metrics={})
    metrics.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 0.1})


def test_pauses_are_excluded_once_and_the_compile_warmup_is_left_out(tmp_path: Path) -> None:
    metrics, writer = _callback(tmp_path, compile_warmup=True)
    state = TrainerState()
    state.max_steps = 100
    args, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerControl()
    metrics.on_train_begin(args, state, control)
    read_steps(metrics, state, 2, train_s=0.2)  # the first window: compile warm-up
    read_steps(metrics, state, 4, train_s=0.05, pause_s=0.2)  # 0.2 s of training, 0.8 s of pauses
    writer.close()  # type: ignore[attr-defined]
    events = read_events(tmp_path)
    rates = dict(events["perf/tokens_per_second"])
    assert list(rates) == [6]  # nothing for the warm-up window
    assert 4000 / 0.2 * 0.6 < rates[6] <= 4000 / 0.2 * 1.05  # 4 steps x 1000 tokens in about 0.2 s of training
    assert [s for s, _ in events["perf/mfu"]] == [6]
    assert metrics.mean_tokens_per_second is not None
    assert abs(metrics.mean_tokens_per_second - rates[6]) / rates[6] < 1e-3  # the warm-up is not in the mean


def test_the_first_window_after_a_resume_leaves_out_the_restore(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """What happens between train_begin and the first step (a resume's checkpoint restore and skipped batches) is
    not training: the first speed line and its eta are the steps' own (it read 256 tok/s, eta 43m56s)."""
    metrics, writer = _callback(tmp_path)
    state = TrainerState()
    state.max_steps, state.global_step = 100, 50  # resumed at step 50
    args, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerControl()
    metrics.on_train_begin(args, state, control)
    time.sleep(0.6)  # the restore
    with caplog.at_level("INFO", logger="sparknet"):
        read_steps(metrics, state, 4, train_s=0.05)  # 4 x 1000 tokens in about 0.2 s
    writer.close()  # type: ignore[attr-defined]
    rate = dict(read_events(tmp_path)["perf/tokens_per_second"])[54]
    assert 4000 / 0.2 * 0.6 < rate <= 4000 / 0.2 * 1.05, rate  # with the restore it would be under 4000 / 0.8
    eta = caplog.text.split("eta ")[-1].split()[0]
    assert eta in ("0m02s", "0m03s"), caplog.text  # 46 steps left at ~0.05 s each
    assert pytest.approx(rate, rel=1e-3) == metrics.mean_tokens_per_second
