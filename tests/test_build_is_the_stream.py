"""The packed build is the stream at one process written to disk (issue 40): with the same config, tokenizer,
VAL_TOKENS, SHUFFLE_BUFFER and seed, a streamed run on one process evaluates on exactly the blocks of val.bin and
trains on the blocks of train.bin, each once (in windows shuffled), with and without phases, with a long document in
the mix; and a complete dataset built again with a larger TARGET_TOKENS grows into the bytes of a fresh build of
that size. The scripts run as users run them; the blocks are compared by the digests the trainer records
(RECORD_BATCHES) against digests computed here from the token files, and by tools/same_blocks.py, the check
docs/data.md gives users."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparknet.common.errors import UserError
from sparknet.common.runtime import PROJECT_ROOT
from sparknet.config.mix import load_config
from sparknet.data.packed.build import BuildSpec, build_dataset
from sparknet.data.packed.dataset import PackedDataset
from tests.helpers import run_script, step_blocks, stream_args, write_config, write_jsonl

BLOCK = 64
GLOBAL_BATCH = 4
STEPS = 40
VAL_TOKENS = 1_500
SHUFFLE_BUFFER = 30
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green quick".split()


def _texts(tag: str, n: int, seed: int, words: tuple[int, int] = (10, 80)) -> list[str]:
    rng = random.Random(seed)
    return [f"{tag}{i:05d} " + " ".join(rng.choices(WORDS, k=rng.randint(*words))) for i in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Source a (its 4th document long: ~25 blocks, in pieces), source b, a tokenizer folder, and two configs of
    them: one mix, and two phases (0.75 / 0.25 of the run, the second on b alone)."""
    from transformers import PreTrainedTokenizerFast

    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tmp = tmp_path_factory.mktemp("build-stream")
    a = _texts("a", 400, 1)
    a[3] = "a-long " + " ".join(random.Random(5).choices(WORDS, k=3000))
    write_jsonl(tmp / "a.jsonl", a)
    write_jsonl(tmp / "b.jsonl", _texts("b", 600, 2))
    tok = train_bpe(_texts("a", 100, 3) + _texts("b", 100, 4), vocab_size=300)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(tmp / "tok")
    mix = [{"name": "json", "prob": 0.5, "data_files": str(tmp / "a.jsonl")},
           {"name": "json", "prob": 0.5, "data_files": str(tmp / "b.jsonl")}]
    tokens = STEPS * GLOBAL_BATCH * BLOCK
    one = write_config(tmp / "one.json", mix, context_length=BLOCK, target_tokens=tokens)
    phased = json.loads(one.read_text())
    phased["phases"] = [{"name": "main", "share": 0.75, "mix": mix},
                        {"name": "b only", "share": 0.25, "mix": [{**mix[1], "prob": 1.0}]}]
    del phased["mix"]
    (tmp / "phased.json").write_text(json.dumps(phased))
    # source c runs dry well before its half of the run: ON_EXHAUSTED decides, the same way in both scripts
    write_jsonl(tmp / "c.jsonl", _texts("c", 40, 6))
    dry = write_config(tmp / "dry.json", [mix[0], {**mix[1], "data_files": str(tmp / "c.jsonl")}],
                       context_length=BLOCK, target_tokens=tokens)
    return {"dir": tmp, "tokenizer": tmp / "tok", "one": one, "phased": tmp / "phased.json", "dry": dry}


def _digests(blocks: np.ndarray) -> list[str]:
    """The trainer's block digest (hf_trainer.SparkTrainer.training_step): blake2b of the int64 ids."""
    return [hashlib.blake2b(row.astype(np.int64).tobytes(), digest_size=8).hexdigest() for row in blocks]


def _same_blocks(*folders: Path) -> subprocess.CompletedProcess:
    """`python tools/same_blocks.py A B`, as docs/data.md gives it."""
    return subprocess.run([sys.executable, str(PROJECT_ROOT / "tools" / "same_blocks.py"), *map(str, folders)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["one", "phased", "defaults", "restart"])
def test_a_one_process_stream_holds_out_val_bin_and_trains_on_train_bin_each_block_once(
        config: str, setup: dict[str, Path], tmp_path: Path) -> None:
    """`defaults`: both scripts with VAL_TOKENS and SHUFFLE_BUFFER unset (the README's commands): one rule scales
    both the same way, so the same tokens need no flag. `restart`: a source runs dry and ON_EXHAUSTED=restart reads
    it again, in the build as in the stream."""
    cfg, tokenizer = setup[{"defaults": "one", "restart": "dry"}.get(config, config)], setup["tokenizer"]
    data = {} if config == "defaults" else {"val_tokens": VAL_TOKENS, "shuffle_buffer": SHUFFLE_BUFFER}
    if config == "restart":
        data["on_exhausted"] = "restart"
    flags = [str(a) for key, value in data.items() for a in (f"--{key}", value)]
    proc = run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer, "--output_dir",
                      tmp_path / "ds", *flags, "--num_workers", 0)
    assert proc.returncode == 0, proc.stderr
    args = stream_args(tmp_path, cfg, tokenizer, target_tokens=STEPS * GLOBAL_BATCH * BLOCK,
                       global_batch_size=GLOBAL_BATCH, batch_size=GLOBAL_BATCH, num_workers=0, record_batches=True,
                       eval_steps=STEPS, save_steps=STEPS, **data)
    for key in ("val_tokens", "shuffle_buffer") if config == "defaults" else ():  # the script's defaults
        at = args.index(f"--{key}")
        del args[at:at + 2]
    proc = run_script("train_sparknet.py", *args)
    assert proc.returncode == 0, proc.stderr
    if config == "defaults":
        inputs = json.loads((tmp_path / "ds" / "manifest.json").read_text())["inputs"]
        assert inputs["shuffle_buffer"] < 10_000 and inputs["val_tokens"] < 2_000_000  # scaled, not the caps
    train = np.asarray(PackedDataset(tmp_path / "ds", "train").tokens)
    assert len(train) == STEPS * GLOBAL_BATCH
    run = tmp_path / "ckpt" / "run"
    # the hold-out: val.bin's blocks, token for token
    assert np.array_equal(np.load(run / "val_blocks.npy"), np.asarray(PackedDataset(tmp_path / "ds", "val").tokens))
    steps = step_blocks(run)
    assert sorted(steps) == list(range(1, STEPS + 1))
    trained = [digest for step in sorted(steps) for digest in steps[step][0]]
    assert sorted(trained) == sorted(_digests(train))  # train.bin's blocks, each once
    assert trained != sorted(trained)  # (a guard: the comparison is of multisets)
    order = {digest: index for index, digest in enumerate(_digests(train))}
    assert [order[d] for d in trained] != list(range(len(train)))  # in another order: the windows shuffle
    # the same, by the check docs/data.md gives users: tools/same_blocks.py, the run against the dataset's train.bin
    same = _same_blocks(run, tmp_path / "ds")
    assert same.returncode == 0 and f"same blocks: {STEPS * GLOBAL_BATCH:,}," in same.stdout, same.stdout + same.stderr
    cut = tmp_path / "cut"  # and it sees a step missing: the run's log without its first step
    cut.mkdir()
    (cut / "batches.jsonl").write_text("".join((run / "batches.jsonl").read_text().splitlines(keepends=True)[1:]))
    other = _same_blocks(cut, tmp_path / "ds")
    assert other.returncode == 1 and f"{GLOBAL_BATCH} only in the second" in other.stdout, other.stdout + other.stderr
    if config == "phased":  # each step's blocks from its phase's range of train.bin
        manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
        (_, end), _ = (phase["blocks"] for phase in manifest["splits"]["train"]["phases"])
        for step, (digests, _) in steps.items():
            assert all((order[d] < end) == (step <= STEPS * 3 // 4) for d in digests), step


def test_a_dataset_grows_into_the_bytes_of_a_fresh_build_of_the_larger_size(setup: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    def spec(out: Path, tokens: int) -> BuildSpec:
        return BuildSpec(config=load_config(setup["one"]), tokenizer=str(setup["tokenizer"]), output_dir=out,
                         target_tokens=tokens, val_tokens=VAL_TOKENS, block_size=BLOCK, seed=1,
                         shuffle_buffer=SHUFFLE_BUFFER)

    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    small = build_dataset(spec(grown, 6_000 * 4))
    assert small["complete"] and (grown / "position.json").is_file()
    proc = run_script("build_dataset_v5.py", "--config", setup["one"], "--tokenizer_dir", setup["tokenizer"],
                      "--output_dir", grown, "--target_tokens", 12_000 * 4, "--val_tokens", VAL_TOKENS,
                      "--shuffle_buffer", SHUFFLE_BUFFER, "--seed", 1, "--num_workers", 0)
    assert proc.returncode == 0, proc.stderr
    assert "growing it to 48,000" in proc.stderr and "resuming the interrupted build" in proc.stderr
    # another input changed as well is other inputs, refused naming it (the defaults: tests/test_dataset_growth.py)
    other = run_script("build_dataset_v5.py", "--config", setup["one"], "--tokenizer_dir", setup["tokenizer"],
                       "--output_dir", grown, "--target_tokens", 24_000 * 4, "--val_tokens", VAL_TOKENS,
                       "--shuffle_buffer", SHUFFLE_BUFFER + 1, "--seed", 1, "--num_workers", 0)
    assert other.returncode == 1 and "other inputs" in other.stderr and "shuffle_buffer" in other.stderr, other.stderr
    expected = build_dataset(spec(fresh, 12_000 * 4))
    for name in ("train.bin", "val.bin", "val_sources.bin", "position.json"):
        assert (grown / name).read_bytes() == (fresh / name).read_bytes(), name
    manifest = json.loads((grown / "manifest.json").read_text())
    for m in (manifest, expected):
        m.pop("build_seconds")
        m.pop("manifest_sha256")  # the seal covers the build's time
    assert manifest == expected and manifest["splits"]["train"]["blocks"] == 2 * small["splits"]["train"]["blocks"]
    # the same command again: nothing to do; a smaller size is other inputs, refused as for any dataset
    assert build_dataset(spec(grown, 12_000 * 4)) == json.loads((grown / "manifest.json").read_text())
    with pytest.raises(UserError, match="other inputs .*target_tokens"):
        build_dataset(spec(grown, 6_000 * 4))


@pytest.mark.slow
def test_the_stream_trains_as_well_as_the_build_on_one_and_two_processes(corpus_config: Path, tokenizer_dir: Path,
                                                                         tmp_path: Path) -> None:
    """On a mix of long documents (stdlib modules, most of them longer than a piece) and short ones (docstrings),
    with the defaults (the stream's SHUFFLE_WINDOW and scaled SHUFFLE_BUFFER, the build's SHUFFLE_BUFFER), one
    VAL_TOKENS and the same
    model, tokens, batch and LR, the streamed run's final eval loss is within 8% of the packed run's, on one process
    and on two (torchrun, gloo); both evaluate on the same validation blocks (one hold-out rule). Before the stream
    handed out blocks in windows, it was 24% worse (6.59 against 5.30, issue 40)."""
    from tests.helpers import FAST, finish_ok, start_script, train_args

    steps, batch = 120, 16
    # the build's and the stream's default VAL_TOKENS differ (the stream's is scaled to its budget): one value for
    # both, so that both runs are scored on the same blocks
    val = 16_384
    budget = {**FAST, "target_tokens": steps * batch * 128, "global_batch_size": batch, "batch_size": batch,
              "eval_steps": steps, "save_steps": steps, "sample_steps": 0}
    proc = run_script("build_dataset_v5.py", "--config", corpus_config, "--tokenizer_dir", tokenizer_dir,
                      "--output_dir", tmp_path / "ds", "--target_tokens", steps * batch * 128, "--num_workers", 0,
                      "--val_tokens", val)
    assert proc.returncode == 0, proc.stderr
    losses = {}
    args = train_args(tmp_path / "packed", tmp_path / "ds", **budget)
    finish_ok(start_script("train_sparknet_v5.py", args))
    losses["packed"] = json.loads((tmp_path / "packed" / "ckpt" / "run" / "training_metadata.json").read_text())
    for processes in (1, 2):
        out = tmp_path / f"stream{processes}"
        args = [*stream_args(out, corpus_config, tokenizer_dir, **budget, num_workers=1, val_tokens=val)]
        at = args.index("--shuffle_buffer")  # the default, scaled to the sources
        del args[at:at + 2]
        finish_ok(start_script("train_sparknet.py", args, processes=processes))
        losses[processes] = json.loads((out / "ckpt" / "run" / "training_metadata.json").read_text())
    packed = losses["packed"]["metrics"]["eval_loss"]
    for processes in (1, 2):
        streamed = losses[processes]["metrics"]["eval_loss"]
        print(f"[stream against build] {processes} process(es): {streamed:.4f} against {packed:.4f}")
        # one seed: the difference between the two trainers' orders spans -0.37..+0.28 nats over seeds at this
        # scale (bench/RESULTS.md, issue 49), so the bound is 8%; issue 40's unshuffled stream (24% worse) fails it
        assert streamed <= 1.08 * packed, (processes, streamed, packed)
    assert losses[1]["metrics"]["eval_loss_start"] == pytest.approx(losses["packed"]["metrics"]["eval_loss_start"])


def test_on_exhausted_fail_stops_the_build_and_the_stream_in_one_line(setup: dict[str, Path], tmp_path: Path) -> None:
    """ON_EXHAUSTED=fail, one setting in both scripts: a source that runs dry before its share is an error, in one
    line naming it and where, exit 1; the build keeps no dataset at OUTPUT_DIR."""
    common = ["--val_tokens", VAL_TOKENS, "--shuffle_buffer", SHUFFLE_BUFFER, "--on_exhausted", "fail"]
    build = run_script("build_dataset_v5.py", "--config", setup["dry"], "--tokenizer_dir", setup["tokenizer"],
                       "--output_dir", tmp_path / "ds", "--num_workers", 0, *common)
    stream = run_script("train_sparknet.py", *stream_args(
        tmp_path, setup["dry"], setup["tokenizer"], target_tokens=STEPS * GLOBAL_BATCH * BLOCK,
        global_batch_size=GLOBAL_BATCH, batch_size=GLOBAL_BATCH, num_workers=0, eval_steps=2, save_steps=2,
        val_tokens=VAL_TOKENS, shuffle_buffer=SHUFFLE_BUFFER, shuffle_window=0, on_exhausted="fail"))
    for proc, where in ((build, "the build's train split"), (stream, "the training stream")):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [f"error: source 'c' ran dry before reaching its share, in {where} (ON_EXHAUSTED=fail): give "
                          "it more data or a lower prob, or set ON_EXHAUSTED to renormalise, stop or restart"], \
            proc.stderr[-3000:]
    assert not (tmp_path / "ds" / "manifest.json").exists()
    # (blocks made as trained: no window made ahead) the run's checkpoints stay, and the message's advice works: the
    # same run continues with ON_EXHAUSTED=renormalise
    assert list((tmp_path / "ckpt" / "run").glob("checkpoint-*")), proc.stderr[-3000:]
    again = run_script("train_sparknet.py", *stream_args(
        tmp_path, setup["dry"], setup["tokenizer"], target_tokens=STEPS * GLOBAL_BATCH * BLOCK,
        global_batch_size=GLOBAL_BATCH, batch_size=GLOBAL_BATCH, num_workers=0, eval_steps=2, save_steps=2,
        val_tokens=VAL_TOKENS, shuffle_buffer=SHUFFLE_BUFFER, shuffle_window=0, on_exhausted="renormalise"))
    assert again.returncode == 0 and "resuming from" in again.stderr.lower(), again.stderr[-3000:]
