"""Every private name of a library that SparkNet reads, assigns, overrides, calls or filters by, each where no public
one does the same (the reasons are written where they are used): these tests fail on the first one a new
transformers, datasets, accelerate, huggingface_hub or torch changes, before a run misbehaves. requirements.lock pins
the versions they pass with; `make lock` moves them and runs these tests.

| library | name | used in |
| --- | --- | --- |
| transformers | Trainer._get_grad_norm, _prepare_input, _get_train_sampler, _get_num_items_in_batch (overridden) | train/hf_trainer.py |
| transformers | Trainer._save_checkpoint, _load_best_model, _load_from_checkpoint (called) | train/hf_trainer.py |
| transformers | Trainer._train_batch_size, _loss_shifts_labels, model_accepts_loss_kwargs (read) | train/hf_trainer.py |
| transformers | PreTrainedModel._from_config(config, attn_implementation=) | model.py |
| datasets | config.STREAMING_{READ,OPEN}_MAX_RETRIES, _RETRY_INTERVAL, READ_*_RETRY_INTERVAL (assigned) | data/source/hub_retries.py |
| datasets | utils.file_utils' log records from read_with_retries and xopen (filtered by funcName) | data/source/hub_retries.py |
| datasets | IterableDataset._ex_iterable, .ex_iterable, .kwargs["files"], state "shard_idx"/"examples_iterable" | data/source/opening.py |
| accelerate | utils.operations.ConvertOutputsToFp32 (.model_forward; a prepared forward's __func__.__wrapped__) | train/step_speed.py |
| torch | a compiled module's _orig_mod; SummaryWriter._get_file_writer | train/callbacks.py |
| torch | _inductor.cpp_builder.get_cpp_compiler, _inductor.exc.InvalidCxxCompiler (called, caught) | train/hf_trainer.py |
| lm_eval | api.task, api.model, models.huggingface: their module-level `tqdm` (assigned) | harness.py |
| (stdlib) | ProcessPoolExecutor._safe_to_dynamically_spawn_children, _processes, _result_queue._writer | data/encoding/encoder_pool.py |
"""  # noqa: E501 - a table

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
from transformers import Trainer, TrainingArguments


def _source(function: object) -> str:
    return inspect.getsource(function)  # type: ignore[arg-type]


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


# -- transformers -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    """A plain transformers Trainer of SparkNet's tiny GPT-2, as SparkTrainer's parent is built."""
    from sparknet.model.presets import build_model, get_preset

    model = build_model(get_preset("sparknet-tiny"), 64, eos_token_id=0)
    args = TrainingArguments(output_dir=str(tmp_path_factory.mktemp("trainer")), per_device_train_batch_size=3,
                             report_to="none", use_cpu=True)
    return Trainer(model=model, args=args)


def test_trainer_private_methods_sparknet_overrides_or_calls() -> None:
    assert _parameters(Trainer._get_grad_norm) == ["self", "model", "grad_norm"]
    # the training loop takes the norm through it, once per optimizer step, before the optimizer steps
    loop = inspect.getsource(Trainer)
    call, step = loop.find("grad_norm = self._get_grad_norm(model"), loop.find("self.optimizer.step()")
    assert 0 < call < step, "Trainer no longer takes the grad norm through _get_grad_norm before optimizer.step()"
    assert _parameters(Trainer._prepare_input) == ["self", "data"]
    assert "self._prepare_input(" in _source(Trainer._prepare_inputs)
    assert _parameters(Trainer._load_best_model) == ["self"]
    # the step's item count: taken through _get_num_items_in_batch, and the loss scaled back by the process count
    # (so the count must be the sum over the processes)
    assert _parameters(Trainer._get_num_items_in_batch) == ["self", "batch_samples", "device"]
    assert _parameters(Trainer.get_batch_samples) == ["self", "epoch_iterator", "num_batches", "device"]
    assert "self._get_num_items_in_batch(batch_samples, device)" in _source(Trainer.get_batch_samples)
    assert "self.accelerator.num_processes" in _source(Trainer.compute_loss)
    assert _parameters(Trainer._load_from_checkpoint)[:2] == ["self", "resume_from_checkpoint"]
    # the outage checkpoint: the Trainer's own save of a checkpoint folder, as at a save step
    assert _parameters(Trainer._save_checkpoint) == ["self", "model", "trial"]
    assert "self._save_checkpoint(model, trial)" in _source(Trainer._maybe_log_save_evaluate)


def test_trainer_takes_its_training_sampler_from_get_train_sampler() -> None:
    """sparknet.train.hf_trainer overrides Trainer._get_train_sampler(train_dataset) to draw whole global batches
    (sparknet.train.batch.GlobalBatchSampler); the Trainer must still build its training loader through it."""
    assert "train_dataset" in inspect.signature(Trainer._get_train_sampler).parameters
    assert "_get_train_sampler" in _source(Trainer.get_train_dataloader)


def test_trainer_attributes_sparknet_reads(trainer: Trainer) -> None:
    """The stream's loader takes the Trainer's micro-batch (_train_batch_size); the host item count goes the
    Trainer's way unless the model takes the count as its loss's divisor and shifts the labels itself."""
    assert trainer._train_batch_size == 3
    assert trainer.model_accepts_loss_kwargs is True  # GPT-2's forward takes **kwargs (num_items_in_batch)
    assert trainer._loss_shifts_labels is True  # GPT-2's loss shifts the labels: the count skips each first label
    source = _source(Trainer._get_num_items_in_batch)
    assert "_loss_shifts_labels" in source and "[..., 1:]" in source  # the count SparkTrainer repeats on the host


def test_from_config_takes_the_attention_implementation() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2LMHeadModel._from_config(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2),
                                        attn_implementation="sdpa")
    llama = LlamaForCausalLM._from_config(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                      num_hidden_layers=1, num_attention_heads=2,
                                                      num_key_value_heads=2), attn_implementation="sdpa")
    assert gpt2.config._attn_implementation == llama.config._attn_implementation == "sdpa"


def test_warmup_steps_below_one_is_a_fraction_of_the_steps(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), warmup_steps=0.05, max_steps=200, report_to="none",
                             use_cpu=True)
    assert args.get_warmup_steps(200) == math.ceil(0.05 * 200)
    assert args.get_warmup_steps(200) == 10


# -- datasets ----------------------------------------------------------------------------------------------------------

STREAMING_RETRIES = ("STREAMING_READ_MAX_RETRIES", "STREAMING_OPEN_MAX_RETRIES", "STREAMING_READ_RETRY_INTERVAL",
                     "STREAMING_OPEN_RETRY_INTERVAL", "STREAMING_READ_SERVER_UNAVAILABLE_RETRY_INTERVAL",
                     "STREAMING_READ_RATE_LIMIT_RETRY_INTERVAL")


def test_the_streaming_retry_settings_sparknet_assigns_are_read_by_datasets() -> None:
    """Assigning a setting datasets no longer reads would silently leave its 20 retries on (a new attribute)."""
    from datasets import config
    from datasets.utils import file_utils

    source = inspect.getsource(file_utils)
    for name in STREAMING_RETRIES:
        assert isinstance(getattr(config, name), (int, float)), name
        assert f"config.{name}" in source, f"datasets.utils.file_utils no longer reads config.{name}"


def test_the_retry_lines_sparknet_filters_come_from_the_functions_it_names() -> None:
    """sparknet.data.source.hub_retries drops datasets' "Retrying in ..." lines by the name of the function that logs
    them (the log record's funcName): those are the functions of datasets.utils.file_utils that log such a line."""
    import ast
    import logging

    from datasets.utils import file_utils

    from sparknet.data.source.hub_retries import _drop_datasets_retry_line

    logging_retries = set()
    for node in ast.walk(ast.parse(inspect.getsource(file_utils))):
        if isinstance(node, ast.FunctionDef):
            direct = [n for n in ast.walk(node) if isinstance(n, ast.Call) and "Retrying in" in ast.unparse(n)
                      and ast.unparse(n.func) == "logger.warning"]
            inner = [n for n in ast.walk(node) if isinstance(n, ast.FunctionDef) and n is not node]
            if direct and not any(call in ast.walk(f) for f in inner for call in direct):
                logging_retries.add(node.name)
    assert logging_retries == {"read_with_retries", "xopen"}, logging_retries
    assert file_utils.logger.name == "datasets.utils.file_utils"
    for name in logging_retries:
        record = logging.LogRecord(file_utils.logger.name, logging.WARNING, __file__, 1, "Retrying in 5sec", None,
                                   None, func=name)
        assert not _drop_datasets_retry_line(record), name


def test_the_file_being_read_is_found_from_a_streams_position(tmp_path: Path) -> None:
    """sparknet.data.source.opening._file_being_read walks the stream's private iterables to name the shard being read
    (its fallback names all of a source's files): read into the second of two files, it must name that one."""
    from sparknet.config.mix import SourceSpec
    from sparknet.data.source.opening import _file_being_read, open_source
    from tests.helpers import write_jsonl

    files = [write_jsonl(tmp_path / f"part-{i}.jsonl", [f"row {i}.{j}" for j in range(3)]) for i in range(2)]
    rows = open_source(SourceSpec(name="json", prob=1, data_files=[str(f) for f in files], label="part-0"))
    iterator = iter(rows)
    assert _file_being_read(rows) == str(files[0])
    for _ in range(4):  # into the second file
        next(iterator)
    assert _file_being_read(rows) == str(files[1])


# -- accelerate --------------------------------------------------------------------------------------------------------

def test_accelerates_fp32_output_conversion_is_found_and_removed_from_a_prepared_model() -> None:
    import torch
    from accelerate import Accelerator

    from sparknet.train.step_speed import drop_fp32_outputs

    model = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(torch.nn.Linear(4, 4))
    assert drop_fp32_outputs(model) is True  # the wrapped forward held a ConvertOutputsToFp32
    assert drop_fp32_outputs(model) is False  # and no longer does


# -- torch -------------------------------------------------------------------------------------------------------------

def test_a_compiled_module_keeps_the_original_as_orig_mod() -> None:
    import torch

    module = torch.nn.Linear(2, 2)
    assert torch.compile(module)._orig_mod is module


def test_inductor_finds_its_cpp_compiler_from_cxx_or_raises_invalid_cxx_compiler(tmp_path: Path) -> None:
    """hf_trainer's check that torch.compile can build CPU kernels asks inductor's own search: the compiler found
    (this machine's, as the tests need one), or InvalidCxxCompiler where its candidates ($CXX, read when the config
    was imported, else g++) do not run. (Patched with the config's own `patch`, undone on exit: a monkeypatch of
    config.cpp left inductor without the setting for every later compile in the process.)"""
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    assert get_cpp_compiler()
    with config.patch({"cpp.cxx": (None, str(tmp_path / "no-such-c++"))}), pytest.raises(InvalidCxxCompiler):
        get_cpp_compiler()
    assert get_cpp_compiler()


def test_summary_writer_file_writer_takes_a_described_summary(tmp_path: Path) -> None:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path)) as writer:
        file_writer = writer._get_file_writer()
        assert callable(file_writer.add_summary)
        file_writer.add_summary(Summary(value=[Summary.Value(tag="t", simple_value=1.0)]), 1)


# -- lm-eval ----------------------------------------------------------------------------------------------------------

def test_lm_eval_draws_its_bars_with_the_module_names_sparknet_routes() -> None:
    """sparknet.harness makes lm-eval's bars SparkNet's (whole lines in a log file) by replacing the `tqdm`
    each of these modules imported; a module that draws its bars otherwise would put carriage returns in logs."""
    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.models.huggingface
    from tqdm import tqdm

    from sparknet.common.progress import Progress

    for module in (lm_eval.api.task, lm_eval.api.model, lm_eval.models.huggingface):
        assert module.tqdm in (tqdm, Progress), module.__name__
        assert "tqdm(" in _source(module), module.__name__


# -- the standard library ----------------------------------------------------------------------------------------------

def test_process_pool_starts_every_worker_first_when_told_it_cannot_spawn_later() -> None:
    """sparknet.data.encoding.encoder_pool sets the executor's fork flag so that all workers start before its manager
    thread (a later start races that thread's reading of its process table)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    executor = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))
    assert executor._safe_to_dynamically_spawn_children is True  # the default for spawn: one per submit
    executor._safe_to_dynamically_spawn_children = False
    try:
        assert executor.submit(abs, -3).result(timeout=60) == 3
        assert len(executor._processes) == 2  # both started with the first task
        # EncoderPool.terminate closes this process's end of the results pipe (tests/test_encoder_pool.py)
        from multiprocessing.connection import Connection

        assert isinstance(executor._result_queue._writer, Connection)
    finally:
        executor.shutdown()
