"""FSDP (configs/accelerate_fsdp.yaml): what a machine without GPUs can check. A launch that cannot run as asked is
refused in one line before anything is written; the config names no process count and no block class, so
accelerate wraps each preset's own block. The sharded save, resume and full-weights export run on a GPU in
bench/gpu_check.sh (FSDP=1, one process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparknet.common.runtime import PROJECT_ROOT
from tests.helpers import OFFLINE_ENV, train_args

CONFIG = PROJECT_ROOT / "configs" / "accelerate_fsdp.yaml"


@pytest.mark.slow
def test_an_fsdp_launch_without_gpus_is_refused_in_one_line(tiny_dataset: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG), "--num_processes",
               "2", "scripts/train_sparknet_v5.py", *map(str, train_args(tmp_path, tiny_dataset))]
    proc = subprocess.run(command, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "error: an FSDP launch (accelerate config distributed_type: FSDP) on a machine without CUDA GPUs" in out
    # each worker's one line comes first; the launcher then reports the failed workers its own way (ChildFailedError)
    assert "torchrun --nproc_per_node N" in out, out[-3000:]
    assert out.find("Traceback") in (-1, out.find("Traceback", out.rindex("error: an FSDP launch"))), out[-3000:]
    assert not (tmp_path / "ckpt" / "run").exists()  # refused before the run folder is made


def test_muon_under_fsdp_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparknet.common.errors import UserError
    from sparknet.config.cli import script_constants
    from sparknet.train.hf_trainer import check_launch
    from sparknet.train.settings import TrainSettings

    settings = TrainSettings.from_constants(script_constants("train_sparknet_v5.py"), optimizer="muon")
    gpu = {"kind": "cuda", "name": "NVIDIA H200"}
    check_launch(settings, gpu)  # not an FSDP launch: nothing to refuse
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UserError, match="OPTIMIZER=muon under FSDP"):
        check_launch(settings, gpu)
    check_launch(TrainSettings.from_constants(script_constants("train_sparknet_v5.py")), gpu)  # adamw runs


def test_the_config_wraps_each_presets_block_and_leaves_the_count_to_the_command() -> None:
    from sparknet.model.presets import PRESETS, build_model, get_preset

    config = yaml.safe_load(CONFIG.read_text())
    assert config["distributed_type"] == "FSDP" and "num_processes" not in config
    # no class named: accelerate wraps the model's _no_split_modules, which must name a module of every preset
    assert "fsdp_transformer_layer_cls_to_wrap" not in config["fsdp_config"]
    for name in (p for p in PRESETS if p.endswith("-tiny")):
        model = build_model(get_preset(name), 512, 0, 0, 0.0)
        classes = {type(m).__name__ for m in model.modules()}
        assert model._no_split_modules and set(model._no_split_modules) <= classes, name
