"""The training step of each architecture compiles without a graph break (issue 52, §2).

torch.compile is on by default on CUDA (COMPILE=auto), where a graph break costs speed silently: the step runs, in
pieces. Nothing on a GPU checks it between GPU runs, so it is checked here, on the CPU, with the tiny presets: the
forward the Trainer compiles (the model with its labels and the step's count of predicted tokens, which computes
the loss) is traced by torch._dynamo.explain,
for each architecture, with the padded output layer the trainer gives a model and with the fused loss where a model
may take it (NanoChat's capped logits refuse it)."""

from __future__ import annotations

import pytest
import torch

from sparknet.model.presets import build_model, get_preset
from sparknet.train.step_speed import pad_head

VOCAB = 250  # not a multiple of the padded head's 64: the padding is in the traced graph
BLOCK = 32


def _model(preset: str, fused: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(get_preset(preset), VOCAB, eos_token_id=0)
    if fused:
        pytest.importorskip("cut_cross_entropy")
        from sparknet.train.fused_loss import fuse_head

        fuse_head(model)
    else:
        pad_head(model)
    return model.train()


@pytest.mark.parametrize(("preset", "fused"), [
    ("sparknet-tiny", False), ("sparknet-llama-tiny", False), ("sparknet-nanochat-tiny", False),
    ("sparknet-tiny", True), ("sparknet-llama-tiny", True)])
def test_the_training_step_compiles_without_a_graph_break(preset: str, fused: bool) -> None:
    torch._dynamo.reset()
    model = _model(preset, fused)
    ids = torch.randint(0, VOCAB, (2, BLOCK))

    items = ids.numel() - ids.shape[0]  # the Trainer passes the step's count of predicted tokens, a host int

    def step(input_ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, labels=input_ids, num_items_in_batch=items).loss

    explained = torch._dynamo.explain(step)(ids)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, "\n".join(
        f"{reason.reason} at {reason.user_stack[-1] if reason.user_stack else '?'}"
        for reason in explained.break_reasons)
    # and the compiled step computes the eager loss
    eager = step(ids)
    compiled = torch.compile(step, backend="eager", fullgraph=True)(ids)
    torch.testing.assert_close(compiled, eager)
