"""The NanoChat block's defining options, each pinned twice on the tiny preset the package builds: in the built
model's config and in what the model computes, against an independent torch computation. ReLU² in the MLP, logits
soft-capped at 15, QK-norm, an output layer untied from the embedding, and the RMSNorm right after the embedding:
changing any of them (in sparknet/model/architectures.py, or in the class it names) fails a test here. Milliseconds
each."""

from __future__ import annotations

import pytest
import torch

from sparknet.model.presets import build_model, get_preset

VOCAB, EOS = 97, 3
PRESET = "sparknet-nanochat-tiny"


@pytest.fixture
def model() -> torch.nn.Module:
    """A freshly built tiny NanoChat model (seeded), for one test to read and change."""
    torch.manual_seed(0)
    return build_model(get_preset(PRESET), vocab_size=VOCAB, eos_token_id=EOS).eval()


def _ids(length: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    return model(_ids()).logits


def _rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight, by hand."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_the_preset_builds_the_nanochat_class() -> None:
    preset = get_preset(PRESET)
    assert preset.arch == "nanochat"
    model = build_model(preset, vocab_size=VOCAB, eos_token_id=EOS)
    assert type(model).__name__ == "NanoChatForCausalLM" and model.config.model_type == "nanochat"


@torch.no_grad()
def test_the_mlp_is_relu_squared(model: torch.nn.Module) -> None:
    assert model.config.hidden_act == "relu2"
    x = 10.0 * torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    for layer in model.model.layers:
        mlp = layer.mlp
        up = x @ mlp.fc1.weight.T
        expected = torch.relu(up).square() @ mlp.fc2.weight.T
        assert (up < 0).any() and (up > 1).any()  # GELU differs below 0, ReLU above
        torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_logits_are_soft_capped_at_15(model: torch.nn.Module) -> None:
    assert model.config.final_logit_softcapping == 15.0
    model.lm_head.weight.mul_(1000.0)  # raw logits in the hundreds
    out = model(_ids())
    raw = model.model(_ids()).last_hidden_state @ model.lm_head.weight.T
    assert raw.abs().max() > 100
    torch.testing.assert_close(out.logits, 15.0 * torch.tanh(raw / 15.0), rtol=1e-5, atol=1e-4)
    assert out.logits.abs().max() <= 15.0 and out.logits.abs().max() > 14.9  # the cap is 15, not more, not less


@torch.no_grad()
def test_queries_and_keys_are_normalised(model: torch.nn.Module) -> None:
    """Scaling the query and key projections leaves every attention's output as it was: only their direction
    counts (without QK-norm the scores would grow 40-fold and the attention sharpen). Scaling the values, as a
    control, does change it."""
    outputs: list[torch.Tensor] = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(lambda module, args, out: outputs.append(out[0].clone()))
    model(_ids())
    before, outputs[:] = list(outputs), []
    for layer in model.model.layers:
        layer.self_attn.q_proj.weight.mul_(20.0)
        layer.self_attn.k_proj.weight.mul_(2.0)
    model(_ids())
    for got, expected in zip(outputs, before, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    outputs[:] = []
    model.model.layers[0].self_attn.v_proj.weight.mul_(10.0)
    model(_ids())
    assert not torch.allclose(outputs[0], before[0], rtol=1e-2, atol=1e-3)


def test_the_output_layer_is_not_the_embedding(model: torch.nn.Module) -> None:
    assert model.config.tie_word_embeddings is False
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert embedding.shape == head.shape == (VOCAB, model.config.hidden_size)
    assert head is not embedding and head.data_ptr() != embedding.data_ptr()
    assert not torch.equal(head, embedding)  # initialised apart
    kept = head.detach().clone()
    with torch.no_grad():
        embedding.add_(1.0)
    assert torch.equal(head, kept)  # changing one leaves the other
    # two matrices among the parameters (a tied one is listed once)
    assert sum(p.shape == head.shape for p in model.parameters()) == 2


@torch.no_grad()
def test_the_embedding_is_normalised_before_the_first_block(model: torch.nn.Module) -> None:
    """The first block's input is the embedding through an RMSNorm without a weight (by hand), so scaling the
    embedding changes nothing downstream."""
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda module, args, kwargs: seen.append(args[0].clone()),
                                                    with_kwargs=True)
    ids = _ids()
    before = model(ids).logits
    expected = _rms_norm(model.model.embed_tokens.weight[ids], model.config.rms_norm_eps)
    torch.testing.assert_close(seen[0], expected, rtol=1e-5, atol=1e-5)
    # well above the norm's eps, so that scaling is exactly invisible to it
    model.model.embed_tokens.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    unscaled = model(ids).logits
    model.model.embed_tokens.weight.mul_(25.0)
    torch.testing.assert_close(model(ids).logits, unscaled, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen[-1], seen[-2], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unscaled, before, atol=1e-3)  # (the embedding did change)
