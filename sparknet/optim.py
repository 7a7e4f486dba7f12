"""Optimizers the Trainer does not offer by name: Muon for the hidden weight matrices with AdamW for the rest.

`torch.optim.Muon` orthogonalises the update of 2-D weights only; embeddings, the (tied) output layer, norms and
biases stay with AdamW, as in the speedrun recipes. The two live in one `torch.optim.Optimizer` whose param_groups
are the two inner optimizers' own group dicts, so the Trainer's LR scheduler, gradient clipping, accelerate's
wrapper and checkpointing (state_dict) see one optimizer. Written by hand because torch has no combined optimizer
and the Trainer takes a single one.
"""

from __future__ import annotations

from typing import Any

import torch

# Names of parameters that are tables or the output layer, not hidden matrices (GPT-2 and Llama spellings).
_NOT_HIDDEN = ("wte", "wpe", "embed_tokens", "lm_head")


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Whether Muon takes this parameter: a 2-D weight inside the transformer blocks."""
    return param.ndim == 2 and not any(part in name.split(".") for part in _NOT_HIDDEN)


class MuonAdamW(torch.optim.Optimizer):
    """Muon (lr `muon_lr`, no weight decay) for hidden matrices; AdamW (lr `lr`, `weight_decay` except on norms and
    biases) for everything else. Muon's step is scaled to match AdamW's update size ("match_rms_adamw"), so
    `muon_lr` is on AdamW's scale."""

    def __init__(self, named_parameters: list[tuple[str, torch.nn.Parameter]], *, lr: float, muon_lr: float,
                 betas: tuple[float, float], weight_decay: float, momentum: float = 0.95, fused: bool = False) -> None:
        muon = [p for n, p in named_parameters if p.requires_grad and is_hidden_matrix(n, p)]
        decay = [p for n, p in named_parameters if p.requires_grad and not is_hidden_matrix(n, p) and p.ndim >= 2]
        no_decay = [p for n, p in named_parameters if p.requires_grad and not is_hidden_matrix(n, p) and p.ndim < 2]
        if not muon:
            raise ValueError("no hidden weight matrices for Muon")
        self.muon = torch.optim.Muon(muon, lr=muon_lr, weight_decay=0.0, momentum=momentum,
                                     adjust_lr_fn="match_rms_adamw")
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, fused=fused or None)
        super().__init__([p for _, p in named_parameters if p.requires_grad], {})
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
