"""Model presets, parameter counts and training FLOPs per token; the context a model takes.

`sparknet-70m` is the public reference (GPT-2): 12 layers, width 512, 8 heads, context 1024, tied embeddings:
64,085,504 parameters at GPT-2's vocabulary of 50257. The `sparknet-llama-*` presets are the Llama architecture
(RoPE, SwiGLU, RMSNorm, no biases; `LlamaForCausalLM`, so `AutoModelForCausalLM` loads them) at about the same size:
the SwiGLU width 1408 (a multiple of 64 near 8/3 x 512) gives 64,279,552 parameters at vocab 50257 (+0.3%).
What each architecture is lives in sparknet.model.architectures; the counts here are read from the model itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sparknet.common.errors import UserError
from sparknet.model.architectures import ARCHITECTURES


@dataclass(frozen=True)
class Preset:
    """The shape of a model; the vocabulary comes from the tokenizer."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int
    arch: str = "gpt2"  # a key of sparknet.model.architectures.ARCHITECTURES
    intermediate: int = 0  # the MLP's width where the architecture takes one (gpt2's MLP is 4 x n_embd)


PRESETS: dict[str, Preset] = {
    "sparknet-70m": Preset(n_layer=12, n_embd=512, n_head=8, n_positions=1024),
    # Small enough to learn visibly in two minutes on two CPU cores.
    "sparknet-demo": Preset(n_layer=4, n_embd=256, n_head=4, n_positions=256),
    # The demo at width 384 (head width 64, as the demo's): the width measurement of bench/recipe.py (issue 51)
    "sparknet-width384": Preset(n_layer=4, n_embd=384, n_head=6, n_positions=256),
    # For tests: a training step in milliseconds.
    "sparknet-tiny": Preset(n_layer=2, n_embd=64, n_head=2, n_positions=128),
    "sparknet-llama-70m": Preset(n_layer=12, n_embd=512, n_head=8, n_positions=1024, arch="llama", intermediate=1408),
    "sparknet-llama-demo": Preset(n_layer=4, n_embd=256, n_head=4, n_positions=256, arch="llama", intermediate=704),
    "sparknet-llama-tiny": Preset(n_layer=2, n_embd=64, n_head=2, n_positions=128, arch="llama", intermediate=176),
    "sparknet-nanochat-70m": Preset(n_layer=12, n_embd=512, n_head=8, n_positions=1024, arch="nanochat",
                                    intermediate=2048),
    "sparknet-nanochat-demo": Preset(n_layer=4, n_embd=256, n_head=4, n_positions=256, arch="nanochat",
                                     intermediate=1024),
    "sparknet-nanochat-width384": Preset(n_layer=4, n_embd=384, n_head=6, n_positions=256, arch="nanochat",
                                         intermediate=1536),
    "sparknet-nanochat-tiny": Preset(n_layer=2, n_embd=64, n_head=2, n_positions=128, arch="nanochat",
                                     intermediate=256),
}
# MODEL_PRESET when the trainers' constant is not set and no INIT_FROM base gives the shape
DEFAULT_PRESET = "sparknet-70m"


def get_preset(name: str) -> Preset:
    """The preset called `name`; UserError listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}") from None


def parameter_count(preset: Preset, vocab_size: int) -> int:
    """Parameters of the model (a weight shared by the input and output layers counted once)."""
    return _counts(preset, vocab_size)[0]


def flops_per_token(preset: Preset, vocab_size: int, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward): 6N + 12·layers·width·seq_len.

    N counts every parameter that takes part in a matmul-like product: all of them except the lookup tables (the
    position embeddings; the input embedding when the output layer has its own weights); a tied token embedding is
    counted once, as the output layer (its input lookup is free). Element-wise work (activations, norms' scaling,
    soft-capping) is left out. The second term is attention's score and value products (2·2·seq·width per layer
    forward, ×3 with backward), as in the PaLM paper's MFU accounting.
    """
    seq = preset.n_positions if seq_len is None else seq_len
    parameters, lookups = _counts(preset, vocab_size)
    return 6.0 * (parameters - lookups) + 12.0 * preset.n_layer * preset.n_embd * seq


@functools.lru_cache(maxsize=64)
def _counts(preset: Preset, vocab_size: int) -> tuple[int, int]:
    """(parameters, parameters of lookup tables) of the model, read from it built on the meta device (no memory,
    no initialisation): counted by the class itself, so a new architecture needs no formula here."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config(preset, vocab_size, 0, 0, 0.0))
    head = model.get_output_embeddings().weight
    lookups = sum(module.weight.numel() for module in model.modules()
                  if isinstance(module, torch.nn.Embedding) and module.weight is not head)
    return model.num_parameters(), lookups


def _config(preset: Preset, vocab_size: int, bos: int, eos: int, dropout: float) -> Any:
    return ARCHITECTURES[preset.arch].config(preset, vocab_size, bos, eos, dropout)


def build_model(
    preset: Preset,
    vocab_size: int,
    eos_token_id: int,
    bos_token_id: int | None = None,
    dropout: float = 0.0,
) -> Any:
    """A freshly initialised model of the preset's architecture (a stock transformers class) with the tokenizer's
    special ids and SDPA attention."""
    from transformers import AutoModelForCausalLM

    from sparknet.common.runtime import hide_library_progress_bars

    hide_library_progress_bars()  # the run saves and reloads it at every checkpoint
    if preset.n_embd % preset.n_head:
        raise UserError(f"width {preset.n_embd} is not divisible by {preset.n_head} heads")
    bos = eos_token_id if bos_token_id is None else bos_token_id
    config = _config(preset, vocab_size, bos, eos_token_id, dropout)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.loss_type = "ForCausalLM"  # transformers cannot infer it from every class name (GPT-2) and warns
    return with_special_ids(model, bos, eos_token_id)


def with_special_ids(model: Any, bos: int, eos: int) -> Any:
    """`model` with its generation config's bos, eos and pad ids set (a preset's, or a base model's under INIT_FROM)."""
    gen = model.generation_config
    # pad only for batched generation; training never pads (packed blocks), so eos is never masked as padding
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = bos, eos, eos
    return model


def set_for_use(model: Any, tokenizer: Any) -> None:
    """The config a model is exported with, by the trainer's final save and by scripts/export_model.py alike (so a
    checkpoint-N exports as the final model does): `<|endoftext|>` as the pad token, so that batched generation and
    evaluation with padding work (training never padded: blocks are packed), and the KV cache on. The Trainer turns
    the cache off for training (TrainingArguments.use_cache) and saves that into every checkpoint; users of an
    exported model expect the library's default, a forward that returns its cache."""
    tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.config.use_cache = True


def model_context(model: Any) -> int:
    """The longest input the model takes (its position table)."""
    config = model.config
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise UserError(f"cannot tell the context length of {type(model).__name__}: set CONTEXT")


# Dense peak TFLOP/s per GPU (no sparsity) for MFU, keyed by the exact name torch.cuda.get_device_name() reports
# without its "NVIDIA " / "Tesla " prefix. Exact names only: variants such as "H200 NVL", "H100 PCIe", "RTX 4090 D"
# or laptop parts have other peaks, and an unknown name gives no MFU (set PEAK_TFLOPS) rather than a wrong one.
# bf16 also stands for fp16; fp32 means TF32 matmuls where the GPU has them.
_H100_SXM = {"bf16": 989.5, "fp32": 494.7}
_A100 = {"bf16": 312.0, "fp32": 156.0}
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": _H100_SXM,
    "H200 NVL": {"bf16": 835.5, "fp32": 417.8},
    "H100 80GB HBM3": _H100_SXM,
    "H100 SXM5 80GB": _H100_SXM,
    "H100 NVL": {"bf16": 835.5, "fp32": 417.8},
    "H100 PCIe": {"bf16": 756.0, "fp32": 378.0},
    "GH200 480GB": _H100_SXM,
    "B200": {"bf16": 2250.0, "fp32": 1100.0},
    "A100-SXM4-80GB": _A100,
    "A100-SXM4-40GB": _A100,
    "A100-PCIE-40GB": _A100,
    "A100 80GB PCIe": _A100,
    "A10G": {"bf16": 70.0, "fp32": 35.0},
    "A10": {"bf16": 125.0, "fp32": 62.5},
    "L40S": {"bf16": 362.0, "fp32": 183.0},
    "L40": {"bf16": 181.0, "fp32": 90.5},
    "L4": {"bf16": 121.0, "fp32": 60.0},
    "GeForce RTX 4090": {"bf16": 165.2, "fp32": 82.6},
    "GeForce RTX 3090": {"bf16": 71.0, "fp32": 35.6},
    "V100-SXM2-16GB": {"bf16": 125.0, "fp32": 15.7},
    "V100-SXM2-32GB": {"bf16": 125.0, "fp32": 15.7},
    "T4": {"bf16": 65.0, "fp32": 8.1},
}


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Peak FLOP/s of one device for `dtype` ("bf16" or "fp32"), or None when the device is not in the table."""
    name = device_name.strip()
    for prefix in ("NVIDIA ", "Tesla "):
        name = name.removeprefix(prefix)
    peaks = PEAK_TFLOPS.get(name)
    if peaks is None:
        return None
    return peaks["bf16" if dtype in ("bf16", "fp16") else "fp32"] * 1e12
