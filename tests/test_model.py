"""Model presets: the reference parameter count, FLOPs per token against a hand count, special ids."""

from __future__ import annotations

import pytest

from sparknet.common.errors import UserError
from sparknet.model.presets import PRESETS, build_model, flops_per_token, get_preset, parameter_count


def test_reference_preset_has_64_085_504_parameters() -> None:
    preset = get_preset("sparknet-70m")
    assert parameter_count(preset, 50257) == 64_085_504
    model = build_model(preset, vocab_size=50257, eos_token_id=50256)
    assert model.num_parameters() == 64_085_504
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    assert model.config._attn_implementation == "sdpa"
    assert (model.config.n_layer, model.config.n_embd, model.config.n_head, model.config.n_positions) == (
        12,
        512,
        8,
        1024,
    )


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_counted_parameters_match_the_built_model(name: str) -> None:
    model = build_model(get_preset(name), vocab_size=1000, eos_token_id=3)
    assert model.num_parameters() == parameter_count(get_preset(name), 1000)


def test_flops_per_token_against_a_hand_count() -> None:
    L, d, V, T = 12, 512, 50257, 1024
    matmuls = L * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + d * V  # weights used in matmuls, lm_head once
    small = L * (3 * d + d + 4 * d + d + 4 * d) + 2 * d  # biases and LayerNorms: one multiply-add per parameter
    attention = L * (2 * T * d + 2 * T * d)  # QK^T and AV, forward FLOPs per token
    hand = 3 * (2 * (matmuls + small) + attention)  # backward is twice the forward
    assert flops_per_token(get_preset("sparknet-70m"), V, T) == hand
    assert flops_per_token(get_preset("sparknet-70m"), V) == hand  # seq_len defaults to the context
    assert round(hand / 1e6) == 457  # about 0.46 GFLOP per token


def test_special_ids_come_from_the_tokenizer() -> None:
    model = build_model(get_preset("sparknet-tiny"), vocab_size=500, eos_token_id=0, dropout=0.1)
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.vocab_size) == (0, 0, 500)
    gen = model.generation_config
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (0, 0, 0)
    assert model.config.resid_pdrop == model.config.attn_pdrop == model.config.embd_pdrop == 0.1


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(UserError, match="unknown model preset 'gpt-70m'; presets: sparknet-70m"):
        get_preset("gpt-70m")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", 989.5e12),
        ("NVIDIA H200 NVL", 835.5e12),
        ("NVIDIA H100 80GB HBM3", 989.5e12),
        ("NVIDIA H100 PCIe", 756.0e12),
        ("NVIDIA L40", 181.0e12),
        ("NVIDIA L4", 121.0e12),
        ("NVIDIA GeForce RTX 4090", 165.2e12),
        ("NVIDIA GeForce RTX 4090 D", None),  # a cut-down part: no guess
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA A100-SXM4-80GB", 312.0e12),
        ("Tesla T4", 65.0e12),
        ("cpu", None),
    ],
)
def test_peak_flops_match_device_names_exactly(name: str, expected: float | None) -> None:
    from sparknet.model.presets import peak_flops

    assert peak_flops(name, "bf16") == expected
