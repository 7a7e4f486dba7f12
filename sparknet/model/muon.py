"""Optimizers the Trainer does not offer by name: Muon for the hidden weight matrices with AdamW for the rest.

`torch.optim.Muon` orthogonalises the update of 2-D weights only; embeddings, the (tied) output layer, norms and
biases stay with AdamW, as in the speedrun recipes. The two live in one `torch.optim.Optimizer` whose param_groups
are the two inner optimizers' own group dicts, so the Trainer's LR scheduler, gradient clipping, accelerate's
wrapper and checkpointing (state_dict) see one optimizer. Written by hand because torch has no combined optimizer
and the Trainer takes a single one.

`Muon` below is torch's with one change: its Newton–Schulz iteration runs in bf16 only on CUDA (elsewhere in fp32,
wide matrices through their Gram matrix, which needs fewer FLOPs for the same polynomial). torch runs it in
bf16 on every device, and on CPUs without native bf16 (AMD Zen 2/3, Intel before Sapphire Rapids: no AVX512-BF16
or AMX) a bf16 matmul is about 24x slower than fp32, which made the Muon demo 30x slower there. torch offers no
setting for it, so the step is written out here (momentum, Nesterov, the iteration, the LR adjustment, decoupled
weight decay: torch's `_single_tensor_muon`, line for line); the parameter groups and the state (its
`momentum_buffer`) are torch's own, so checkpoints stay torch's format. Tests pin the bf16 path to torch's result
bit for bit and the fp32 path to a float64 reference.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def hidden_matrices(model: torch.nn.Module) -> set[str]:
    """Names of the parameters Muon takes: the 2-D weights inside the transformer blocks, that is every 2-D
    parameter but the lookup tables (`nn.Embedding`: tokens, positions) and the output layer. Found by module type
    rather than by name, so every architecture's blocks are found as they are spelled."""
    head = model.get_output_embeddings()
    outside = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    if head is not None:
        outside.add(id(head.weight))
    return {name for name, param in model.named_parameters() if param.ndim == 2 and id(param) not in outside}


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (tensor cores, as torch does), fp32 on every other device (CPU bf16 may be emulated)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def orthogonalise(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """torch's quintic Newton–Schulz iteration (`_zeropower_via_newtonschulz`) in `dtype`: about U V^T of the
    update's SVD, with singular values pushed into roughly [0.5, 1.5]. In bf16 it is torch's loop exactly; in
    other dtypes a matrix much wider than tall takes the same polynomial through its Gram matrix (below)."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1 (not in place: `update` may be the momentum buffer)
    if dtype != torch.bfloat16 and x.size(1) > 1.5 * x.size(0):
        x = _through_gram(x, coefficients, steps)
    else:
        for _ in range(steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _through_gram(x: torch.Tensor, coefficients: tuple[float, float, float], steps: int) -> torch.Tensor:
    """The Newton–Schulz steps X <- P(A) X, P(A) = aI + bA + cA^2, A = X X^T, for a wide m x n matrix, done on
    m x m matrices: every P commutes with A, so A' = P A P and the result is (P_k ... P_0) X_0. That costs
    34m^3 + 4m^2n FLOPs against 10m^3 + 20m^2n, a third to a half less at the 3:1 and 4:1 shapes of attention and
    MLP weights, which matters where each FLOP is an fp32 CPU FLOP. The same polynomial, rounded differently
    (tested against float64)."""
    a, b, c = coefficients
    gram = x @ x.T
    product = None
    for step in range(steps):
        p = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        p.diagonal().add_(a)
        product = p if product is None else p @ product
        if step < steps - 1:
            gram = p @ gram @ p
    return x if product is None else product @ x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch's Muon LR adjustment: "original" sqrt(max(1, A/B)), "match_rms_adamw" 0.2 sqrt(max(A, B))."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class Muon(torch.optim.Muon):
    """`torch.optim.Muon` whose Newton–Schulz iteration runs in `newton_schulz_dtype(device)` (see the module
    docstring); `ns_dtype` forces one (tests)."""

    def __init__(self, params: Any, *, ns_dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(grad, 1 - group["momentum"])
                update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                dtype = self.ns_dtype or newton_schulz_dtype(param.device)
                update = orthogonalise(update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss


def parameter_groups(model: torch.nn.Module, *, lr: float, muon_lr: float, weight_decay: float,
                     embedding_lr: float | None = None) -> tuple[list, list]:
    """(Muon's groups, AdamW's groups) of `model`'s trainable parameters: the hidden matrices (`hidden_matrices`)
    at `muon_lr`; the input embedding at `embedding_lr` (`lr` when None) with `weight_decay`; an output layer of its
    own and other tables (positions) at `lr` with it, each role in its group (the layout checkpoints record); 1-D
    parameters (norms, biases) at `lr` without. A tied output layer is the input embedding's weight, in its group."""
    hidden = hidden_matrices(model)
    named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    roles: dict[str, list] = {"embedding": [], "head": [], "table": [], "scalar": []}
    for name, param in named:
        if name not in hidden:
            role = ("embedding" if param is embedding else "head" if param is head
                    else "table" if param.ndim >= 2 else "scalar")
            roles[role].append(param)
    muon = [{"params": [param for name, param in named if name in hidden], "lr": muon_lr}]
    adamw = [{"params": roles["embedding"], "lr": lr if embedding_lr is None else embedding_lr,
              "weight_decay": weight_decay},
             {"params": roles["head"], "lr": lr, "weight_decay": weight_decay},
             {"params": roles["table"], "lr": lr, "weight_decay": weight_decay},
             {"params": roles["scalar"], "lr": lr, "weight_decay": 0.0}]
    return muon, [group for group in adamw if group["params"]]


class MuonAdamW(torch.optim.Optimizer):
    """Muon for `muon_groups` (no weight decay unless a group gives one); AdamW for `adamw_groups` (each with its
    lr and weight decay; `parameter_groups` makes both). Muon's step is scaled to match AdamW's update size
    ("match_rms_adamw"), so its LR is on AdamW's scale."""

    def __init__(self, muon_groups: list[dict[str, Any]], adamw_groups: list[dict[str, Any]], *,
                 betas: tuple[float, float], momentum: float = 0.95, fused: bool = False,
                 ns_dtype: torch.dtype | None = None) -> None:
        if not any(group["params"] for group in muon_groups):
            raise ValueError("no hidden weight matrices for Muon")
        self.muon = Muon(muon_groups, lr=muon_groups[0]["lr"], weight_decay=0.0, momentum=momentum,
                         adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
        self.adamw = torch.optim.AdamW(adamw_groups, betas=betas, fused=fused or None)
        super().__init__([p for group in muon_groups + adamw_groups for p in group["params"]], {})
        # the inner optimizers' own dicts: an LR scheduler or clipping that edits these edits theirs
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        self.muon.step()
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
