"""DOCUMENT_MASKING: attention kept inside each document of a packed block.

A packed block joins documents, each ending with EOS. transformers makes the causal mask block-diagonal by itself
when a batch carries `position_ids` that restart at each document and no `attention_mask` (`masking_utils`'
packed-sequence detection, which SDPA and eager attention use, on CPU too); an all-ones attention mask would turn
that detection off, so none is passed. The collator below adds those positions to the stacked blocks: 0 at each
EOS, the token the next document is predicted from (as scripts/eval_perplexity.py scores each document after an
EOS prefix), counting up to the next. The first piece of a block, a document cut by the block boundary, starts at 0
as every block does without the mask. Applied where the Trainer batches (training and its evaluations alike), so
the data files and the stream stay as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import default_data_collator


def document_positions(input_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Each token's position in its document: 0 at an EOS and at the block's start, then 1, 2, ... up to the next
    EOS (the same shape as `input_ids`)."""
    index = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
    starts = torch.where(input_ids == eos_id, index, torch.zeros_like(index))
    return index - torch.cummax(starts, dim=-1).values


class DocumentCollator:
    """The Trainer's `default_data_collator` (the blocks stacked, nothing padded) plus each token's `position_ids`
    in its document (`document_positions`), and no attention mask."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = default_data_collator(features)
        batch.pop("attention_mask", None)  # an all-ones mask turns the detection of documents off
        batch["position_ids"] = document_positions(batch["input_ids"], self.eos_id)
        return batch
