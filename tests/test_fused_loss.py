"""FUSED_CROSS_ENTROPY (sparknet/train/fused_loss.py) against the unfused model, on CPU, where cut-cross-entropy's
torch.compile implementation runs: the same loss and gradients (plain and with the Trainer's item count for
gradient accumulation), the same logits in eval mode, the same saved files, the same training; and one line when
the package is missing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import TrainingArguments, default_data_collator

from sparknet.model.presets import build_model, get_preset
from sparknet.train.fused_loss import FusedHead, fuse_head
from sparknet.train.hf_trainer import SparkTrainer
from tests.helpers import assert_saves_alike, train_packed, train_settings


def _model(preset: str = "sparknet-tiny") -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(get_preset(preset), 1000, eos_token_id=0)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, 5:9] = -100  # ignored positions, as a collator's padding would be
    return ids, labels


# The exactness tests run cut-cross-entropy's torch.compile implementation, whose first compile (C++ kernels) costs
# about a minute of CPU on a fresh machine: the full tier (make test-all). The fast tier keeps the fused head's
# swap and save (below) and the missing package's one line.
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["sparknet-tiny", "sparknet-llama-tiny"])
@pytest.mark.parametrize("items", [None, 50])
def test_the_fused_loss_and_gradients_are_the_unfused_ones(preset: str, items: int | None) -> None:
    plain = _model(preset)
    fused = copy.deepcopy(plain)
    fuse_head(fused)
    assert type(fused.get_output_embeddings()) is FusedHead
    assert fused.get_output_embeddings().weight is fused.get_input_embeddings().weight  # still tied
    ids, labels = _batch()
    kwargs = {} if items is None else {"num_items_in_batch": torch.tensor(items)}
    losses = []
    for model in (plain, fused):
        model.train()
        loss = model(input_ids=ids, labels=labels, **kwargs).loss
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for (name, a), (_, b) in zip(plain.named_parameters(), fused.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
    plain.eval()
    fused.eval()
    with torch.no_grad():  # evaluation and sampling see the real logits and the unfused loss
        a, b = plain(input_ids=ids, labels=labels), fused(input_ids=ids, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)


def test_the_fused_models_save_is_byte_identical(tmp_path: Path) -> None:
    plain = _model()
    fused = copy.deepcopy(plain)
    fuse_head(fused)
    assert_saves_alike(plain, fused, tmp_path)


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 1000, (n, 32), generator=torch.Generator().manual_seed(2))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.slow  # torch.compile, as above
def test_training_with_the_fused_loss_gives_the_unfused_weights(tmp_path: Path) -> None:
    """Six optimizer steps of two accumulated micro-batches each (the Trainer's item count in play), by SGD, whose
    update is the gradient itself (Adam's division by the root of the second moment makes a last-bit difference
    in a near-zero gradient a visible one in the weight)."""
    results = []
    for fused in (False, True):
        model = _model()
        if fused:
            fuse_head(model)
        args = TrainingArguments(output_dir=str(tmp_path / str(fused)), max_steps=6, per_device_train_batch_size=2,
                                 gradient_accumulation_steps=2, optim="sgd", learning_rate=0.1, use_cpu=True,
                                 report_to="none",
                                 save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                                 dataloader_num_workers=0)
        trainer = SparkTrainer(model=model, args=args, train_dataset=_Blocks(48), data_collator=default_data_collator)
        trainer.train()
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        results.append((losses, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (plain_losses, plain_weights), (fused_losses, fused_weights) = results
    assert len(plain_losses) == 6
    assert fused_losses == pytest.approx(plain_losses, rel=1e-5)
    for name, tensor in plain_weights.items():
        torch.testing.assert_close(fused_weights[name], tensor, rtol=1e-5, atol=1e-7, msg=name)


def test_a_missing_package_is_one_line_before_the_run_folder(tiny_dataset: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer as the script runs it (its UserError is the script's one line), with an install whose import
    fails as without triton: refused before the run folder is made."""
    import sys

    from sparknet.common.errors import UserError

    shadow = tmp_path / "shadow" / "cut_cross_entropy"  # an install whose import fails, as without triton
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'triton'\")\n")
    for name in [name for name in sys.modules if name.split(".")[0] == "cut_cross_entropy"]:
        monkeypatch.delitem(sys.modules, name)  # imported by an earlier test: this one imports the shadow
    monkeypatch.syspath_prepend(str(shadow.parent))
    with pytest.raises(UserError) as caught:
        train_packed(train_settings(tmp_path, fused_cross_entropy=True), tiny_dataset)
    error = str(caught.value)
    assert error.startswith("FUSED_CROSS_ENTROPY=True needs the cut-cross-entropy package"), error
    assert "No module named 'triton'" in error and "pip install cut-cross-entropy==25.1.1" in error, error
    assert "\n" not in error and not (tmp_path / "ckpt" / "run").exists()



def test_a_model_that_soft_caps_its_logits_is_refused_in_one_line() -> None:
    from sparknet.common.errors import UserError

    with pytest.raises(UserError, match="soft-caps its logits, which the fused loss does not: set FUSED_CROSS"):
        fuse_head(_model("sparknet-nanochat-tiny"))  # it caps what the fused head hands on: the hidden states
