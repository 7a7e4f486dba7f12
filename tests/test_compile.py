"""The training step of each architecture compiles without a graph break (issue 52, §2).

torch.compile is on by default on CUDA (COMPILE=auto), where a graph break costs speed silently: the step runs, in
pieces. Nothing on a GPU checks it between GPU runs, so it is checked here, on the CPU, with the tiny presets: the
forward the Trainer compiles (the model with its labels and the step's count of predicted tokens, which computes
the loss) is traced by torch._dynamo.explain,
for each architecture, with the padded output layer the trainer gives a model and with the fused loss where a model
may take it (NanoChat's capped logits refuse it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparknet.model.presets import build_model, get_preset
from sparknet.train.step_speed import pad_head
from tests.helpers import run_script, train_args, train_packed, train_settings

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


def test_compile_on_a_cpu_without_a_cpp_compiler_is_one_line_before_any_work(tiny_dataset: Path,
                                                                             tmp_path: Path) -> None:
    """torch.compile builds its CPU kernels with a C++ compiler (inductor's search: $CXX, else g++). Where it finds
    none, COMPILE=on failed at the first step in a long traceback, after the run folder was made; now one line names
    the setting, what was tried and the fix, exit 1, before any work."""
    cxx = tmp_path / "no-such-c++"
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, compile="on"), env={"CXX": str(cxx)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: COMPILE=on on a CPU need a C++ compiler (torch.compile builds its CPU kernels with "
                      f"one), and none runs here (tried {cxx} from CXX): install one (e.g. `apt install g++`) or "
                      "point CXX at it, or set COMPILE=off"], proc.stderr[-3000:]
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow  # a compilation of the tiny model's training and eval steps, about 30 s on 2 cores
def test_a_compiled_run_on_a_cpu_trains_as_the_eager_one(finished: tuple, tiny_dataset: Path,
                                                         tmp_path: Path) -> None:
    """COMPILE=on on a CPU through the trainer (the run's evaluations, samples and checkpoints through the compiled
    model): the same losses as the eager run of the same seed, step by step, to float rounding (the change is
    speed only), and the run finishes as the eager one does."""
    from torch._dynamo.utils import counters

    eager, _ = finished
    graphs = counters["stats"]["unique_graphs"]
    compiled = train_packed(train_settings(tmp_path, peak_tflops=0.001, compile="on"), tiny_dataset)
    assert compiled.status == "finished" and counters["stats"]["unique_graphs"] > graphs  # it did compile

    def losses(result: object, key: str) -> dict[int, float]:
        return {entry["step"]: entry[key] for entry in result.trainer.state.log_history if key in entry}

    for key in ("loss", "eval_loss"):
        ours, theirs = losses(compiled, key), losses(eager, key)
        assert ours.keys() == theirs.keys() and len(ours) > 3, (key, ours, theirs)
        assert ours == pytest.approx(theirs, rel=2e-3), key
