"""The step's speed changes compute what the plain step computes: the padded head's logits, loss and gradients
equal the unpadded model's and its export is byte-identical; the training forwards build no KV cache while the
export keeps caching on; dropping accelerate's fp32 output copy under bf16 leaves every weight bit for bit; the
garbage collector runs on a schedule; the FLOP count is the Trainer's."""

from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

from sparknet.model.presets import build_model, get_preset
from sparknet.train import step_speed
from sparknet.train.hf_trainer import SparkTrainer
from sparknet.train.step_speed import PaddedHead, collector_paused, pad_head
from tests.helpers import assert_saves_alike


def _model(preset: str = "sparknet-tiny", vocab: int = 1000) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(get_preset(preset), vocab, eos_token_id=0)


@pytest.mark.parametrize("preset", ["sparknet-tiny", "sparknet-llama-tiny"])
def test_the_padded_head_gives_the_unpadded_logits_loss_and_gradients(preset: str) -> None:
    plain = _model(preset)
    padded = copy.deepcopy(plain)
    assert pad_head(padded) == 1024 and type(padded.get_output_embeddings()) is PaddedHead
    assert padded.get_output_embeddings().weight is padded.get_input_embeddings().weight  # still tied
    ids = torch.randint(0, 1000, (3, 64), generator=torch.Generator().manual_seed(1))
    plain.train()
    padded.train()
    out_plain, out_padded = plain(input_ids=ids, labels=ids), padded(input_ids=ids, labels=ids)
    assert out_padded.logits.shape[-1] == 1024
    assert torch.isneginf(out_padded.logits[..., 1000:]).all()
    torch.testing.assert_close(out_padded.logits[..., :1000], out_plain.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_padded.loss, out_plain.loss, rtol=1e-6, atol=1e-7)
    out_plain.loss.backward()
    out_padded.loss.backward()
    grads = dict(padded.named_parameters())
    for name, param in plain.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, rtol=1e-5, atol=1e-7, msg=name)
    # evaluation and generation see the plain layer
    plain.eval()
    padded.eval()
    with torch.no_grad():
        assert padded(input_ids=ids).logits.shape[-1] == 1000
        torch.testing.assert_close(padded(input_ids=ids, labels=ids).loss, plain(input_ids=ids, labels=ids).loss)


def test_a_model_that_soft_caps_its_logits_is_not_padded() -> None:
    model = _model("sparknet-nanochat-tiny")  # tanh(-inf / cap) x cap = -cap: the padding would take probability
    ids = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    assert pad_head(model) == 1000 and type(model.get_output_embeddings()) is torch.nn.Linear
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, loss)


def test_the_padded_models_export_is_byte_identical(tmp_path: Path) -> None:
    plain = _model()
    padded = copy.deepcopy(plain)
    pad_head(padded)
    assert_saves_alike(plain, padded, tmp_path)


def test_the_benchmarks_switch_leaves_out_the_changes_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKNET_STEP_OFF", "padded_head, gc")
    model = _model()
    assert pad_head(model) == model.config.vocab_size and type(model.get_output_embeddings()) is torch.nn.Linear
    with collector_paused():
        assert gc.isenabled()
    monkeypatch.setenv("SPARKNET_STEP_OFF", "padded_head,cache")
    with pytest.raises(ValueError, match="cache: expected some of padded_head, fp32_outputs, gc"):
        step_speed.change_on("gc")


def test_a_vocabulary_already_a_multiple_is_left_alone() -> None:
    model = _model(vocab=1024)
    assert pad_head(model) == 1024 and type(model.get_output_embeddings()) is torch.nn.Linear


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, n: int, vocab: int = 1000, length: int = 32) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(2))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(tmp_path: Path, model: torch.nn.Module, steps: int = 6, bf16: bool = False,
             callbacks: list | None = None) -> SparkTrainer:
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4,
                             learning_rate=1e-3, use_cpu=True, bf16=bf16, report_to="none", save_strategy="no",
                             logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    return SparkTrainer(model=model, args=args, train_dataset=_Blocks(64), eval_dataset=_Blocks(8),
                        data_collator=default_data_collator, callbacks=callbacks)


def test_training_and_eval_forwards_build_no_kv_cache(tmp_path: Path) -> None:
    model = _model()
    caches: list[object] = []
    model.register_forward_hook(lambda _m, _a, out: caches.append(out.past_key_values))
    trainer = _trainer(tmp_path, model)
    trainer.train()
    trainer.evaluate()
    assert len(caches) >= 7 and caches == [None] * len(caches)
    model.eval()
    model.config.use_cache = True  # what the export writes (tests/test_training.py checks the run's config.json)
    with torch.no_grad():
        assert model(input_ids=torch.tensor([[1, 2, 3]])).past_key_values is not None


def _bf16_run(tmp_path: Path, drop: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, set, list]:
    model = _model()
    dtypes: set[torch.dtype] = set()
    model.register_forward_hook(lambda _m, _a, out: dtypes.add(out.logits.dtype))
    if not drop:  # the benchmarks' switch (bench/gpu_throughput.py measures each change with it)
        monkeypatch.setenv("SPARKNET_STEP_OFF", "fp32_outputs")
    trainer = _trainer(tmp_path / str(drop), model, bf16=True)
    trainer.train()
    monkeypatch.undo()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, dtypes, losses


def test_without_the_fp32_output_copy_bf16_training_is_bit_for_bit_the_same(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with_copy, dtypes_with, losses_with = _bf16_run(tmp_path, False, monkeypatch)
    without, dtypes_without, losses_without = _bf16_run(tmp_path, True, monkeypatch)
    assert dtypes_with == {torch.float32}  # accelerate's wrapper copies the logits to fp32 ...
    assert dtypes_without == {torch.bfloat16}  # ... and now they stay as autocast made them
    assert losses_with == losses_without and len(losses_with) == 6
    for name, tensor in with_copy.items():
        assert torch.equal(tensor, without[name]), name


def test_the_item_count_on_the_host_trains_the_plain_trainers_weights(tmp_path: Path) -> None:
    """SparkTrainer counts the step's predicted tokens as a Python int on the host (no copy to the device per step):
    with accumulation 2 and some labels ignored, six steps give transformers' own Trainer's losses and weights, bit
    for bit."""
    class Masked(_Blocks):
        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            labels = self.ids[i].clone()
            labels[: i % 5] = -100  # a different count in each block
            return {"input_ids": self.ids[i], "labels": labels}

    counts: list = []

    class Counting(SparkTrainer):
        def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> object:
            counts.append(super()._get_num_items_in_batch(batch_samples, device))
            return counts[-1]

    results = []
    for cls in (Trainer, Counting):
        args = TrainingArguments(output_dir=str(tmp_path / cls.__name__), max_steps=6, per_device_train_batch_size=2,
                                 gradient_accumulation_steps=2, learning_rate=1e-3, use_cpu=True, report_to="none",
                                 save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                                 dataloader_num_workers=0)
        model = _model()
        trainer = cls(model=model, args=args, train_dataset=Masked(48), data_collator=default_data_collator)
        trainer.train()
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        results.append((losses, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    assert all(type(c) is int for c in counts) and len(counts) == 6 and len(set(counts)) > 1, counts
    (plain_losses, plain), (spark_losses, spark) = results
    assert spark_losses == plain_losses and len(plain_losses) == 6
    for name, tensor in plain.items():
        assert torch.equal(spark[name], tensor), name


def test_the_flop_count_is_the_trainers(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _model())
    batch = default_data_collator([trainer.train_dataset[i] for i in range(4)])
    assert trainer.floating_point_ops(batch) == Trainer.floating_point_ops(trainer, batch) > 0


def test_the_collector_is_paused_during_training_and_runs_on_schedule(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_speed, "GC_EVERY_STEPS", 4)
    collections: list[tuple[int, bool]] = []

    class Watch(TrainerCallback):
        step = 0

        def on_step_begin(self, args: object, state: object, control: object, **kw: object) -> None:
            Watch.step = state.global_step
            collections.append((-1, gc.isenabled()))

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 1:
            collections.append((Watch.step, gc.isenabled()))

    gc.callbacks.append(on_gc)
    try:
        trainer = _trainer(tmp_path, _model(), steps=12, callbacks=[Watch()])
        with collector_paused():
            trainer.train()
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(on_gc)
    assert all(not enabled for _, enabled in collections)
    assert [step for step, _ in collections if step >= 0] == [3, 7, 11]  # at the end of steps 4, 8 and 12
