"""OPTIMIZER: the names a run may choose, each with the builder of its optimizer (parameter groups included).

The one seam for an optimizer: adding one touches this registry and its test (tests/test_optim.py). The OPTIMIZER
rule (sparknet.config.checks), --help's list of choices, the FSDP launch check and SparkTrainer.create_optimizer all
read `OPTIMIZERS`. Nothing here imports torch at module level: the checks read the names before torch is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class OptimizerChoice:
    """One OPTIMIZER value: `build(trainer, model)` returns the optimizer for `model`'s parameters (the Trainer's
    arguments carry the LR, betas and weight decay, its `settings` the rest); `not_under_fsdp` says why it cannot
    step FSDP's shards of a parameter, when it cannot."""

    doc: str
    build: Callable[[Any, Any], torch.optim.Optimizer]
    not_under_fsdp: str | None = None
    # the settings it reads beyond those every optimizer does (LEARNING_RATE, WEIGHT_DECAY, ADAM_BETAS): what a
    # model card lists for a run that used it
    settings: tuple[str, ...] = ()


def _adamw(trainer: Any, model: Any) -> torch.optim.Optimizer:
    """The Trainer's own AdamW (TrainingArguments.optim: adamw_torch, fused on CUDA): weight decay on every
    parameter but biases and norms, as transformers groups them."""
    from transformers import Trainer

    return Trainer.create_optimizer(trainer, model)


def _muon(trainer: Any, model: Any) -> torch.optim.Optimizer:
    """Muon (MUON_LEARNING_RATE, no weight decay) for the hidden weight matrices, AdamW for the rest
    (sparknet.model.muon), the input embedding at EMBEDDING_LEARNING_RATE."""
    from sparknet.model.muon import MuonAdamW, parameter_groups

    args, settings = trainer.args, trainer.settings
    muon, adamw = parameter_groups(model, lr=args.learning_rate, muon_lr=settings.muon_learning_rate,
                                   weight_decay=args.weight_decay, embedding_lr=settings.embedding_learning_rate)
    return MuonAdamW(muon, adamw, betas=(args.adam_beta1, args.adam_beta2), fused=args.device.type == "cuda")


MUON_WHY_NOT_FSDP = "Muon orthogonalises each whole weight matrix, and FSDP gives each process a shard of it"
MUON_SETTINGS = ("muon_learning_rate", "embedding_learning_rate")


OPTIMIZERS: dict[str, OptimizerChoice] = {
    "adamw": OptimizerChoice("AdamW, no weight decay on biases and norms (fused on CUDA)", _adamw),
    "muon": OptimizerChoice("Muon for the hidden weight matrices, AdamW for the rest", _muon,
                            not_under_fsdp=MUON_WHY_NOT_FSDP, settings=MUON_SETTINGS),
}
