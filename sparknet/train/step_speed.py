"""Work the training step does not need, taken out of it without changing what it computes:

- the output head's matmul padded to a multiple of 64 outputs in the training forward only (50257 -> 50304, as
  nanoGPT does, for the GPU's matmul tiles); the padded logits are -inf, so softmax, loss and gradients are the
  unpadded ones, and the weights and vocabulary saved are unchanged;
- no KV cache built while training: the Trainer sets `config.use_cache` from `TrainingArguments.use_cache` (off);
  the export turns it on again (sparknet.train.run.export);
- no fp32 copy of the outputs under bf16 autocast: accelerate wraps the forward in `convert_outputs_to_fp32`, an
  extra fp32 copy of the whole logits tensor per micro-batch (accelerate issue 3477), although the loss inside the
  forward already upcasts; autocast itself stays;
- Python's cyclic garbage collector paused while the steps run and run every `GC_EVERY_STEPS` steps instead
  (torchtitan does the same: a collection after compilation walks a large heap at unpredictable steps);
- the Trainer's FLOP count per micro-step from a parameter count taken once (its default walks every module at
  every micro-step).

For measuring each change against the others (bench/gpu_throughput.py's runs, one JSON line each), the environment
variable SPARKNET_STEP_OFF names changes to leave out, comma-separated: padded_head, fp32_outputs, gc. It is a
benchmark's switch, not a setting: what is computed is the same either way (tests/test_step_speed.py).
SPARKNET_SYNC_DEBUG=1 (another benchmark's switch) turns on torch's warning for every operation that makes the host
wait for the GPU, from step SYNC_DEBUG_FROM_STEP on (past torch.compile's warm-up): the warnings name the places.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F  # the usual name
from transformers import TrainerCallback

HEAD_MULTIPLE = 64
GC_EVERY_STEPS = 50  # torchtitan's default: a young-generation collection this often keeps the heap small
CHANGES = ("padded_head", "fp32_outputs", "gc")
SYNC_DEBUG_FROM_STEP = 3


def change_on(name: str) -> bool:
    """Whether the step change `name` (one of CHANGES) is in use: all are, unless SPARKNET_STEP_OFF names it."""
    off = {part.strip() for part in os.environ.get("SPARKNET_STEP_OFF", "").split(",") if part.strip()}
    unknown = off - set(CHANGES)
    if unknown:
        raise ValueError(f"SPARKNET_STEP_OFF names {', '.join(sorted(unknown))}: expected some of {', '.join(CHANGES)}")
    return name not in off


class PaddedHead(torch.nn.Linear):
    """The output layer, padded in the training forward to `padded_outputs` outputs (zero weight rows, -inf logits);
    in eval mode (evaluation, generation) the plain layer. Swapped in by class, so its parameters, their names and
    the tie to the input embedding are untouched."""

    padded_outputs: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vocab = self.weight.shape[0]
        if not self.training or self.padded_outputs <= vocab:
            return super().forward(x)
        extra = self.padded_outputs - vocab
        weight = F.pad(self.weight, (0, 0, 0, extra))
        bias = self.bias if self.bias is not None else torch.zeros(vocab, dtype=weight.dtype, device=weight.device)
        bias = torch.cat([bias, torch.full((extra,), float("-inf"), dtype=bias.dtype, device=bias.device)])
        return F.linear(x, weight, bias)


def _loss_over_logits_width(loss_function: Callable[..., Any], logits: torch.Tensor, labels: torch.Tensor,
                            vocab_size: int, **kwargs: Any) -> torch.Tensor:
    # the models pass config.vocab_size, which the loss uses to reshape the logits: padded logits are wider
    return loss_function(logits, labels, vocab_size=logits.shape[-1], **kwargs)


def pad_head(model: Any, multiple: int = HEAD_MULTIPLE) -> int:
    """Pads `model`'s output matmul to a multiple of `multiple` outputs in training; returns the padded width (the
    vocabulary itself when it is already a multiple, or when the model soft-caps its logits: the cap would turn
    the padding's -inf into -cap, which the softmax would count)."""
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0]
    padded = -(-vocab // multiple) * multiple
    capped = getattr(model.config, "final_logit_softcapping", None) is not None
    if padded == vocab or type(head) is not torch.nn.Linear or capped or not change_on("padded_head"):
        return vocab
    head.__class__ = PaddedHead
    head.padded_outputs = padded
    model.loss_function = functools.partial(_loss_over_logits_width, model.loss_function)
    return padded


def drop_fp32_outputs(model: Any) -> bool:
    """Removes accelerate's fp32 conversion of the outputs from a prepared model's forward, keeping its autocast;
    True when there was one. Each module of a wrapped model (DDP, FSDP, compiled) is looked at: accelerate patches
    the inner model before wrapping it."""
    from accelerate.utils.operations import ConvertOutputsToFp32

    for module in model.modules():
        forward = module.__dict__.get("forward")
        converter = getattr(getattr(forward, "__func__", None), "__wrapped__", None)
        if isinstance(converter, ConvertOutputsToFp32):
            module.forward = MethodType(converter.model_forward, module)
            return True
    return False


class StepSpeed(TrainerCallback):
    """At the start of training, drops the fp32 output copy (see `drop_fp32_outputs`); every GC_EVERY_STEPS steps,
    a collection of the young generations while the collector is paused (`collector_paused`)."""

    def __init__(self, every: int | None = None) -> None:
        self.every = every or GC_EVERY_STEPS
        self.dropped_fp32_outputs = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None and change_on("fp32_outputs"):
            self.dropped_fp32_outputs = drop_fp32_outputs(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not gc.isenabled() and state.global_step % self.every == 0:
            gc.collect(1)
        if (state.global_step == SYNC_DEBUG_FROM_STEP and os.environ.get("SPARKNET_SYNC_DEBUG") == "1"
                and torch.cuda.is_available()):
            torch.cuda.set_sync_debug_mode("warn")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's automatic garbage collection off for the block (after one full collection), on again after it
    whatever happens; StepSpeed collects on a schedule meanwhile."""
    was_enabled = gc.isenabled()
    if not change_on("gc"):
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CountedParameters:
    """The Trainer's `floating_point_ops` (6 x tokens x non-embedding parameters, its total_flos) with the
    parameter count taken once: the default walks every module at every micro-step."""

    def __init__(self) -> None:
        self._count: int | None = None

    def flos(self, model: Any, inputs: dict[str, Any]) -> int:
        name = getattr(model, "main_input_name", "input_ids")
        if name not in inputs or not hasattr(model, "num_parameters"):
            return 0
        if self._count is None:
            self._count = model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[name].numel() * self._count
