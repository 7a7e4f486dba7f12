"""The presets of every architecture and the Muon optimizer: sizes, which weights Muon takes, exact resume, plain
loading with AutoModelForCausalLM and pipeline()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparknet.model.architectures import ARCHITECTURES
from sparknet.model.muon import hidden_matrices
from sparknet.model.presets import PRESETS, build_model, flops_per_token, get_preset, parameter_count, set_for_use
from tests.helpers import kill_when, read_steps, run_script, start_script, train_args, train_packed, train_settings

# the smallest preset of each architecture
TINY = {arch: min((name for name, p in PRESETS.items() if p.arch == arch), key=lambda n: PRESETS[n].n_embd)
        for arch in ARCHITECTURES}


def test_llama_70m_matches_the_gpt2_reference_size_and_counts_its_flops() -> None:
    preset = get_preset("sparknet-llama-70m")
    model = build_model(preset, vocab_size=50257, eos_token_id=50256)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert model.num_parameters() == parameter_count(preset, 50257) == 64_279_552
    assert abs(model.num_parameters() / 64_085_504 - 1) < 0.005  # the GPT-2 reference's size, within 0.5%
    d, layers, vocab, context, width = 512, 12, 50257, 1024, 1408
    matmuls = layers * (4 * d * d + 3 * d * width) + d * vocab  # the output layer once; RoPE has no weights
    hand = 6 * (matmuls + layers * 2 * d + d) + 12 * layers * d * context
    assert flops_per_token(preset, vocab) == hand


def test_nanochat_70m_counts_its_flops_without_the_input_table() -> None:
    preset = get_preset("sparknet-nanochat-70m")
    d, layers, vocab, context = 512, 12, 50257, 1024
    blocks = layers * (4 * d * d + 2 * d * 4 * d)  # q, k, v, o; the ReLU² MLP's two (4 x width); norms have no weights
    assert parameter_count(preset, vocab) == blocks + 2 * vocab * d  # untied: the input table and the output layer
    # the input table is a lookup: only the output layer's matmul counts, as for the tied GPT-2
    assert flops_per_token(preset, vocab) == 6 * (blocks + d * vocab) + 12 * layers * d * context


@pytest.mark.parametrize("preset", sorted(TINY.values()))
def test_muon_takes_the_hidden_matrices_only(preset: str) -> None:
    model = build_model(get_preset(preset), vocab_size=300, eos_token_id=0)
    hidden = hidden_matrices(model)
    assert hidden and all(p.ndim == 2 for n, p in model.named_parameters() if n in hidden)
    rest = {n for n, _ in model.named_parameters()} - hidden
    assert all(".h." in n or ".layers." in n for n in hidden)  # inside the blocks
    assert any("wte" in n or "embed_tokens" in n for n in rest)  # embeddings stay with AdamW
    assert any("lm_head" in n for n in rest) or model.config.tie_word_embeddings  # so does the output layer
    # q, k, v, o, gate, up, down; q, k, v, o, fc1, fc2; or c_attn, c_proj, c_fc, c_proj
    per_layer = {"llama": 7, "nanochat": 6, "gpt2": 4}[get_preset(preset).arch]
    assert len(hidden) == per_layer * get_preset(preset).n_layer


@pytest.mark.parametrize("preset", sorted(TINY.values()))
def test_each_architecture_saves_and_loads_with_automodel_and_pipeline(preset: str, tokenizer_dir: Path,
                                                                       tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from sparknet.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tokenizer_dir))
    model = build_model(get_preset(preset), len(tokenizer), tokenizer.eos_token_id).eval()
    set_for_use(model, tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(loaded) is type(model) and loaded.num_parameters() == model.num_parameters()
    ids = AutoTokenizer.from_pretrained(str(tmp_path))("def main():", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-5)
    out = pipeline("text-generation", model=str(tmp_path))("def", max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"].startswith("def") and len(out[0]["generated_text"]) > len("def")


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(name for arch, name in TINY.items() if arch != "gpt2"))
def test_each_architecture_with_muon_resumes_exactly_and_exports(preset: str, tiny_dataset: Path,
                                                                 tmp_path: Path) -> None:
    """(GPT-2's resume: tests/test_training.py.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    recipe = dict(model_preset=preset, optimizer="muon", muon_learning_rate=3e-3,
                  target_tokens=60 * 4 * 128, eval_steps=10, save_steps=10, sample_steps=0, record_batches=True)
    reference = train_packed(train_settings(tmp_path / "a", **recipe), tiny_dataset)
    optimizer = reference.trainer.optimizer.optimizer  # accelerate's wrapper around ours
    assert type(optimizer).__name__ == "MuonAdamW" and optimizer.muon.state  # Muon did step
    args = train_args(tmp_path / "b", tiny_dataset, **recipe)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    kill_when(run_dir / "checkpoint-30" / ".complete", start_script("train_sparknet_v5.py", args))
    resumed = start_script("train_sparknet_v5.py", args)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming from" in out
    expected, got = read_steps(reference.run_dir / "batches.jsonl"), read_steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 61))
    for step in expected:
        assert (got[step]["lr"], got[step]["blocks"], got[step]["weights"]) == (
            expected[step]["lr"], expected[step]["blocks"], expected[step]["weights"]), step
    model = AutoModelForCausalLM.from_pretrained(str(run_dir)).eval()
    assert type(model) is type(reference.trainer.model)
    tok = AutoTokenizer.from_pretrained(str(run_dir))
    ids = tok("def main():\n    return", return_tensors="pt")["input_ids"]
    trained = AutoModelForCausalLM.from_pretrained(str(reference.run_dir)).eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, trained(ids).logits, atol=1e-5)
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4
    export = tmp_path / "export"
    proc = run_script("export_model.py", "--model", run_dir, "--output_dir", export, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = pipeline("text-generation", model=str(export))("def", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("def")
