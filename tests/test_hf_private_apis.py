"""The private library APIs SparkNet relies on, each where no public one does the same (the reasons are written
where they are used): these tests fail when a new transformers or torch changes them, before a run misbehaves."""

from __future__ import annotations

import inspect
import math

from transformers import Trainer, TrainingArguments


def _source(function: object) -> str:
    return inspect.getsource(function)  # type: ignore[arg-type]


def test_trainer_private_methods_sparknet_overrides_or_calls() -> None:
    assert list(inspect.signature(Trainer._get_grad_norm).parameters) == ["self", "model", "grad_norm"]
    # the training loop takes the norm through it, once per optimizer step, before the optimizer steps
    loop = inspect.getsource(Trainer)
    call, step = loop.find("grad_norm = self._get_grad_norm(model"), loop.find("self.optimizer.step()")
    assert 0 < call < step, "Trainer no longer takes the grad norm through _get_grad_norm before optimizer.step()"
    assert list(inspect.signature(Trainer._prepare_input).parameters) == ["self", "data"]
    assert "self._prepare_input(" in _source(Trainer._prepare_inputs)
    assert list(inspect.signature(Trainer._load_best_model).parameters) == ["self"]
    # the step's item count: taken through _get_num_items_in_batch, and the loss scaled back by the process count
    # (so the count must be the sum over the processes)
    assert list(inspect.signature(Trainer._get_num_items_in_batch).parameters) == ["self", "batch_samples", "device"]
    assert "self._get_num_items_in_batch(batch_samples, device)" in _source(Trainer.get_batch_samples)
    assert "self.accelerator.num_processes" in _source(Trainer.compute_loss)
    assert list(inspect.signature(Trainer._load_from_checkpoint).parameters)[:2] == ["self", "resume_from_checkpoint"]


def test_warmup_steps_below_one_is_a_fraction_of_the_steps(tmp_path) -> None:  # noqa: ANN001
    args = TrainingArguments(output_dir=str(tmp_path), warmup_steps=0.05, max_steps=200, report_to="none",
                             use_cpu=True)
    assert args.get_warmup_steps(200) == math.ceil(0.05 * 200)
    assert args.get_warmup_steps(200) == 10


def test_summary_writer_file_writer_takes_a_described_summary(tmp_path) -> None:  # noqa: ANN001
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path)) as writer:
        file_writer = writer._get_file_writer()
        assert callable(file_writer.add_summary)
        file_writer.add_summary(Summary(value=[Summary.Value(tag="t", simple_value=1.0)]), 1)


def test_process_pool_starts_every_worker_first_when_told_it_cannot_spawn_later() -> None:
    """sparknet.data.encoder_pool sets the executor's fork flag so that all workers start before its manager
    thread (a later start races that thread's reading of its process table)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    executor = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))
    assert executor._safe_to_dynamically_spawn_children is True  # the default for spawn: one per submit
    executor._safe_to_dynamically_spawn_children = False
    try:
        assert executor.submit(abs, -3).result(timeout=60) == 3
        assert len(executor._processes) == 2  # both started with the first task
    finally:
        executor.shutdown()


def test_trainer_takes_its_training_sampler_from_get_train_sampler() -> None:
    """sparknet.train.hf_trainer overrides Trainer._get_train_sampler(train_dataset) to draw whole global batches
    (sparknet.train.batch.GlobalBatchSampler); the Trainer must still build its training loader through it."""
    import inspect

    from transformers import Trainer

    assert "train_dataset" in inspect.signature(Trainer._get_train_sampler).parameters
    assert "_get_train_sampler" in inspect.getsource(Trainer.get_train_dataloader)
