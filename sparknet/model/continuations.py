"""Text a causal LM writes after a prompt: the one place SparkNet generates text (the evaluation's samples and the
trainer's), below both."""

from __future__ import annotations

from typing import Any

from sparknet.common.errors import UserError


def continuations(model: Any, tokenizer: Any, prompt: str, *, skip_special_tokens: bool = True,
                  **options: Any) -> list[str]:
    """The continuations `model.generate(**options)` writes after `prompt` (the generated text only), the one place
    SparkNet generates text (the evaluation script and the trainer's samples). An empty prompt starts from
    <|endoftext|>. A prompt longer than the model's context leaves room for `max_new_tokens`: its end is kept, with
    a warning (a position table has no row past the context)."""
    import logging

    import torch

    from sparknet.model.presets import model_context

    device = next(model.parameters()).device
    # a literal "<|endoftext|>" in a prompt is text, as in training (sparknet.tokenizer's rule), whatever the tokenizer
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if ids.shape[1] == 0:
        ids = torch.tensor([[tokenizer.eos_token_id]])
    context, new = model_context(model), int(options.get("max_new_tokens", 0))
    if new >= context:
        raise UserError(f"MAX_NEW_TOKENS={new} leaves no room for a prompt in the model's context of {context} tokens")
    if ids.shape[1] + new > context:
        logging.getLogger("sparknet.eval").warning(
            "prompt %r is %d tokens: only its last %d are used (the model's context is %d, %d of them for new "
            "tokens)", prompt[:40] + ("..." if len(prompt) > 40 else ""), ids.shape[1], context - new, context, new)
        ids = ids[:, ids.shape[1] - (context - new):]
    ids = ids.to(device)
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
    return [tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=skip_special_tokens) for row in generated]
