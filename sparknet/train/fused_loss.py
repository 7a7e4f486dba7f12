"""FUSED_CROSS_ENTROPY: the training loss computed from the last hidden states and the output weights by
cut-cross-entropy's `linear_cross_entropy`, which never holds the whole logits tensor (its GPU kernel computes them
in tiles); on the 70M model at 64 x 1024 that tensor is 6.6 GB in bf16, and the head and loss take a third of the
step. `filter_eps=None` keeps its gradients exact (its default skips small softmax entries). On CPU the package's
Triton kernel cannot run; its `torch_compile` implementation (the plain matmul and cross-entropy, compiled) stands
in, which is what the CPU tests compare against the unfused model.

How it plugs in, as the padded head does (sparknet.train.step_speed): the output layer's class is swapped for one
whose training forward hands its input on, and the model's loss function computes the fused loss from it and the
layer's weight. In eval mode the layer is the plain Linear, so evaluation, sampling and the export see real logits;
parameter names, the tie to the input embedding and the saved weights are unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from sparknet.common.errors import UserError

PACKAGE = "cut-cross-entropy==25.1.1"


class FusedHead(torch.nn.Linear):
    """The output layer: in training, the identity (the loss function reads the weight); in eval, the plain layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.training else super().forward(x)


def linear_cross_entropy() -> Callable[..., torch.Tensor]:
    """cut-cross-entropy's function, or the one line that says how to install it."""
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as exc:
        raise UserError(f"FUSED_CROSS_ENTROPY=True needs the cut-cross-entropy package, which did not import "
                        f"({type(exc).__name__}: {exc}): `pip install {PACKAGE}` (it brings triton on Linux), or set "
                        "FUSED_CROSS_ENTROPY=False") from None
    return linear_cross_entropy


def fuse_head(model: Any) -> None:
    """Swaps `model`'s output layer and loss for the fused ones (a UserError now if the package is missing)."""
    head = model.get_output_embeddings()
    if getattr(model.config, "final_logit_softcapping", None) is not None:
        # the model caps what the head returns, which in training is the hidden states here
        raise UserError("FUSED_CROSS_ENTROPY=True: the model soft-caps its logits, which the fused loss does not: "
                        "set FUSED_CROSS_ENTROPY=False")
    if type(head) is not torch.nn.Linear or head.bias is not None:
        raise UserError(f"FUSED_CROSS_ENTROPY=True: the model's output layer is a {type(head).__name__}"
                        f"{' with a bias' if type(head) is torch.nn.Linear else ''}, not a plain linear layer")
    linear_cross_entropy()
    # the package finds the labels to score with nonzero(), whose output's size depends on the data: torch.compile
    # (COMPILE, on by default on CUDA) broke the step's graph there into six unless told to capture such an op
    # (tests/test_compile.py)
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    head.__class__ = FusedHead
    model.loss_function = functools.partial(_fused_loss, head, model.loss_function)


def _fused_loss(head: FusedHead, unfused: Callable[..., torch.Tensor], logits: torch.Tensor, labels: torch.Tensor,
                vocab_size: int | None = None, num_items_in_batch: Any = None, ignore_index: int = -100,
                **kwargs: Any) -> torch.Tensor:
    """transformers' causal-LM loss (the next token of each position; summed over `num_items_in_batch` items when
    the Trainer counts them for gradient accumulation, else the mean), from the hidden states `logits` the fused
    head handed on."""
    if not head.training:
        return unfused(logits, labels, vocab_size=vocab_size, num_items_in_batch=num_items_in_batch,
                       ignore_index=ignore_index, **kwargs)
    hidden, weight = logits, head.weight
    device = hidden.device.type
    # the matmul in the dtype autocast would give the unfused head's (bf16 under bf16 training); the softmax in fp32
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    on_gpu = hidden.is_cuda
    options = {"impl": "cce", "filter_eps": None} if on_gpu else {"impl": "torch_compile"}
    loss = linear_cross_entropy()(hidden, weight, labels.to(hidden.device), ignore_index=ignore_index, shift=True,
                                   reduction="mean" if num_items_in_batch is None else "sum", **options)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss
