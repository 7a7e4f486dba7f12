"""DOCUMENT_MASKING: position ids restart at each EOS, and transformers then keeps attention inside each document."""

from __future__ import annotations

import pytest
import torch

from sparknet.model import build_model, get_preset
from sparknet.train.document_mask import DocumentCollator, document_positions

EOS = 0


def test_positions_restart_at_each_eos() -> None:
    ids = torch.tensor([[5, 6, EOS, 7, 8, 9, EOS, 4], [EOS, 3, 3, 3, EOS, EOS, 2, 2]])
    assert document_positions(ids, EOS).tolist() == [[0, 1, 0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 0, 1, 2]]


@pytest.mark.parametrize("preset", ["sparknet-tiny", "sparknet-nanochat-tiny"])
def test_a_document_in_a_packed_block_sees_only_itself(preset: str) -> None:
    torch.manual_seed(0)
    model = build_model(get_preset(preset), vocab_size=50, eos_token_id=EOS).eval()
    first, second = [11, 12, 13, 14, 15], [21, 22, 23, 24]
    block = [*first, EOS, *second, EOS, 31]
    batch = DocumentCollator(EOS)([{"input_ids": torch.tensor(block), "labels": torch.tensor(block)}])
    assert "attention_mask" not in batch
    with torch.no_grad():  # no KV cache, as in training (TrainingArguments.use_cache): a cache turns the mask off
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        alone = model(input_ids=torch.tensor([[EOS, *second]])).logits[0]  # the document after its EOS prefix
        unmasked = model(input_ids=batch["input_ids"]).logits[0]
    start = len(first)  # the EOS that ends the first document and precedes the second
    assert torch.allclose(packed[start:start + 1 + len(second)], alone, atol=1e-5)
    assert not torch.allclose(unmasked[start:start + 1 + len(second)], alone, atol=1e-3)  # without it: sees `first`
    # the first piece is unchanged: a causal mask already hides what follows it
    assert torch.allclose(packed[:start], unmasked[:start], atol=1e-5)
