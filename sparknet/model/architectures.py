"""ARCHITECTURES: the model classes a preset may name, each a stock transformers class, so that every export loads
with `AutoModelForCausalLM` and no custom code.

The one place that knows an architecture: how a preset's shape becomes the class's config, how a config (an
INIT_FROM base's) becomes a shape again and which of its config keys are dropouts.
Everything else reads the built model (sparknet.model.presets counts parameters and FLOPs from it; Muon finds its
matrices from its module types), so adding an architecture is one entry here and the presets that name it. Keyed by the
config's `model_type`. Nothing here imports transformers at module level: the checks read the names first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# a sparknet.model.presets.Preset: sparknet.model.presets imports this module, so this one does not import it back,
# not even for types (that would close an import circle)
AnyPreset = Any


@dataclass(frozen=True)
class Architecture:
    """One architecture: `config(preset, vocab_size, bos, eos, dropout)` is the class's config for that shape;
    `shape(config)` the preset fields a config of this type has (the inverse, for a base model); `dropouts` the
    config keys INIT_FROM sets to the run's DROPOUT."""

    doc: str
    config: Callable[[AnyPreset, int, int, int, float], Any]
    shape: Callable[[Any], dict[str, int]]
    dropouts: tuple[str, ...]


def _gpt2(preset: AnyPreset, vocab_size: int, bos: int, eos: int, dropout: float) -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab_size, n_positions=preset.n_positions, n_embd=preset.n_embd,
                      n_layer=preset.n_layer, n_head=preset.n_head, resid_pdrop=dropout, embd_pdrop=dropout,
                      attn_pdrop=dropout, bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=True)


def _gpt2_shape(config: Any) -> dict[str, int]:
    return {"n_layer": config.n_layer, "n_embd": config.n_embd, "n_head": config.n_head,
            "n_positions": config.n_positions}


def _llama(preset: AnyPreset, vocab_size: int, bos: int, eos: int, dropout: float) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=preset.n_embd, intermediate_size=preset.intermediate,
                       num_hidden_layers=preset.n_layer, num_attention_heads=preset.n_head,
                       num_key_value_heads=preset.n_head, max_position_embeddings=preset.n_positions,
                       attention_dropout=dropout, attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
                       bos_token_id=bos, eos_token_id=eos)


def _decoder_shape(config: Any) -> dict[str, int]:
    """The shape of a Llama-family config (hidden_size, num_hidden_layers, ...)."""
    return {"n_layer": config.num_hidden_layers, "n_embd": config.hidden_size, "n_head": config.num_attention_heads,
            "n_positions": config.max_position_embeddings, "intermediate": config.intermediate_size}


def _nanochat(preset: AnyPreset, vocab_size: int, bos: int, eos: int, dropout: float) -> Any:
    from transformers import NanoChatConfig

    # pad_token_id None: the embedding's padding row would otherwise get no gradient, and that row is EOS's (the
    # export sets the pad id for generation); training never pads
    return NanoChatConfig(vocab_size=vocab_size, hidden_size=preset.n_embd, intermediate_size=preset.intermediate,
                          num_hidden_layers=preset.n_layer, num_attention_heads=preset.n_head,
                          num_key_value_heads=preset.n_head, max_position_embeddings=preset.n_positions,
                          attention_dropout=dropout, hidden_act="relu2", final_logit_softcapping=15.0,
                          tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eos, pad_token_id=None)


ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture("GPT-2: learned positions, LayerNorm, GELU MLP (4 x width), tied embeddings",
                         _gpt2, _gpt2_shape, ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
    "llama": Architecture("Llama: RoPE, RMSNorm, SwiGLU MLP, no biases, tied embeddings",
                          _llama, _decoder_shape, ("attention_dropout",)),
    "nanochat": Architecture("the speedrun block (NanoChat): RoPE, QK-norm, ReLU² MLP, RMSNorm without weights "
                             "(after the embedding too), untied output layer, logits soft-capped at 15",
                             _nanochat, _decoder_shape, ("attention_dropout",)),
}
