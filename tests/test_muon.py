"""SparkNet's Muon: torch's algorithm, with Newton–Schulz in fp32 off CUDA (bf16 is emulated, ~24x slower, on many
CPUs). Checked against torch's own Muon (the bf16 path, bit for bit) and a float64 NumPy reference (the CPU path)."""

from __future__ import annotations

import numpy as np
import torch

from sparknet.model.muon import Muon, MuonAdamW, newton_schulz_dtype

SHAPES = [(48, 16), (16, 40), (24, 24)]  # tall, wide (transposed inside the iteration) and square


def _params_and_grads(seed: int = 0) -> tuple[list[torch.nn.Parameter], list[list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
    grads = [[torch.randn(*s, generator=g) for s in SHAPES] for _ in range(3)]  # three steps
    return params, grads


def _run(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad.clone()
        optimizer.step()


def _numpy_muon(weights: list[np.ndarray], grads: list[list[np.ndarray]], *, lr: float, momentum: float,
                weight_decay: float, coefficients: tuple[float, float, float], steps: int,
                eps: float) -> list[np.ndarray]:
    """Muon in float64 from its definition (torch's docstring): Nesterov momentum, quintic Newton–Schulz on the
    wide orientation, decoupled weight decay, the update scaled by 0.2 sqrt(max(A, B)) (match_rms_adamw)."""
    a, b, c = coefficients
    weights = [w.astype(np.float64).copy() for w in weights]
    buffers = [np.zeros_like(w) for w in weights]
    for step_grads in grads:
        for i, grad in enumerate(step_grads):
            grad = grad.astype(np.float64)
            buffers[i] = momentum * buffers[i] + (1 - momentum) * grad
            x = (1 - momentum) * grad + momentum * buffers[i]
            tall = x.shape[0] > x.shape[1]
            x = x.T if tall else x
            x = x / max(np.linalg.norm(x), eps)
            for _ in range(steps):
                gram = x @ x.T
                x = a * x + (b * gram + c * gram @ gram) @ x
            x = x.T if tall else x
            weights[i] = weights[i] * (1 - lr * weight_decay) - lr * 0.2 * np.sqrt(max(x.shape)) * x
    return weights


def test_newton_schulz_runs_in_bf16_on_cuda_only() -> None:
    assert newton_schulz_dtype(torch.device("cuda")) == torch.bfloat16
    assert newton_schulz_dtype(torch.device("cpu")) == torch.float32
    assert newton_schulz_dtype(torch.device("mps")) == torch.float32


def test_the_bf16_path_is_torchs_muon_bit_for_bit() -> None:
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    ours, _ = _params_and_grads()
    theirs, grads = _params_and_grads()
    _run(Muon(ours, ns_dtype=torch.bfloat16, **settings), ours, grads)
    reference = torch.optim.Muon(theirs, **settings)  # Newton–Schulz in bf16 on every device
    _run(reference, theirs, grads)
    for mine, torch_s in zip(ours, theirs, strict=True):
        assert torch.equal(mine, torch_s)


def test_the_cpu_update_equals_a_float64_reference() -> None:
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
    params, grads = _params_and_grads(seed=1)
    start = [p.detach().numpy().copy() for p in params]
    optimizer = Muon(params, adjust_lr_fn="match_rms_adamw", **settings)  # the CPU default: fp32
    _run(optimizer, params, grads)
    group = optimizer.param_groups[0]
    expected = _numpy_muon(start, [[g.numpy() for g in step] for step in grads], **settings,
                           coefficients=group["ns_coefficients"], steps=group["ns_steps"], eps=group["eps"])
    bf16_params, _ = _params_and_grads(seed=1)
    _run(torch.optim.Muon(bf16_params, adjust_lr_fn="match_rms_adamw", **settings), bf16_params, grads)
    for got, want, before, bf16 in zip(params, expected, start, bf16_params, strict=True):
        moved = np.abs(want - before).max()
        error = np.abs(got.detach().numpy() - want).max()
        assert error < 1e-4 * moved, (error, moved)
        # torch's bf16 iteration is two orders of magnitude further from the exact result
        assert np.abs(bf16.detach().numpy() - want).max() > 30 * error


def test_muon_adamw_uses_the_fp32_iteration_on_cpu_and_keeps_torchs_state_format() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    named = [(f"h.{name}", p) for name, p in model.named_parameters()]
    optimizer = MuonAdamW([{"params": [p for _, p in named if p.ndim == 2], "lr": 1e-3}],
                          [{"params": [p for _, p in named if p.ndim < 2], "lr": 1e-3, "weight_decay": 0.0}],
                          betas=(0.9, 0.95))
    model(torch.randn(4, 16)).square().sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    assert optimizer.muon.ns_dtype is None and isinstance(optimizer.muon, torch.optim.Muon)
    assert {"momentum_buffer"} == set(state["muon"]["state"][0])  # torch's Muon state: checkpoints load in either
    fresh = torch.optim.Muon([p for _, p in named if p.ndim == 2], lr=1e-3)
    fresh.load_state_dict(state["muon"])
