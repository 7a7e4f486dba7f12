"""Mix phases (config "phases"): the schema and its one-line errors; the packed build writing the phases in order,
each carrying its own mix in every prefix; the packed sampler drawing each phase's steps from its blocks only; the
stream switching its mixer at the boundary; wsd decaying over exactly the last phase; and runs stopped before a
boundary and resumed after it (1 and 2 processes) training the same blocks with the same LR as uninterrupted ones.

Every document starts with its source's tag ("a00012 ", "b00345 "): blocks split at eos say, independently of
SparkNet's own counts, which source each token came from (as tests/test_document_edges.py does)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from sparknet.common.errors import UserError
from sparknet.config.mix import ConfigError, load_config, parse_config, phase_ends
from sparknet.train.phases import check_every_phase_trains
from tests.helpers import (
    assert_every_prefix_mixed,
    build_position,
    checkpoint_step,
    finish_ok,
    held_out_rests,
    read_events,
    run_script,
    start_script,
    step_blocks,
    stop_build_after_saves,
    stopped_checkpoint,
    stream_args,
    stream_of,
    tagged_owners,
    train_args,
    train_packed,
    train_settings,
    wait_for,
    weights_apart,
    write_jsonl,
)

BLOCK = 64
# a phase's whole share of source a within 3 points of the asked one (about one document per source of
# look-ahead, as the single mix): tests/helpers.py `assert_every_prefix_mixed`
WHOLE_WITHIN = 0.03
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green".split()
MAIN = {"a": 0.5, "b": 0.5}  # the first phase's mix
ANNEAL = {"a": 0.25, "b": 0.75}  # the last phase's
SHARES = (0.75, 0.25)


def _texts(tag: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{tag}{i:05d} " + " ".join(rng.choices(WORDS, k=rng.randint(20, 120))) for i in range(n)]


def _phases_config(path: Path, data: Path, **top: object) -> Path:
    def mix(probs: dict[str, float]) -> list[dict]:
        return [{"name": "json", "prob": p, "data_files": str(data / f"{label}.jsonl")} for label, p in probs.items()]

    path.write_text(json.dumps({"seed": 1, "context_length": BLOCK, "target_tokens": 20_000, "phases": [
        {"name": "main", "share": SHARES[0], "mix": mix(MAIN)},
        {"name": "anneal", "share": SHARES[1], "mix": mix(ANNEAL)}], **top}))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tagged sources, a small byte-level BPE saved as a tokenizer folder, and a config in two phases."""
    from transformers import PreTrainedTokenizerFast

    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tmp = tmp_path_factory.mktemp("phases")
    write_jsonl(tmp / "a.jsonl", _texts("a", 3000, 1))
    write_jsonl(tmp / "b.jsonl", _texts("b", 3000, 2))
    tok = train_bpe(_texts("a", 200, 1) + _texts("b", 200, 2), vocab_size=400)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(tmp / "tok")
    return {"dir": tmp, "tokenizer": tmp / "tok", "config": _phases_config(tmp / "phases.json", tmp)}


def _owner(tokens: np.ndarray, tokenizer: Path, dataset: Path | None = None) -> np.ndarray:
    """Per token of `tokens` (flat, blocks of BLOCK), 1 when it belongs to a document of source a, 0 for b (from the
    decoded text; a packed `dataset`'s training split starts with the rests of the documents its hold-out cut);
    -1 for the tail of a document begun before (no tag: its owner unknown)."""
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    rests = None
    if dataset is not None:
        rows = json.loads((dataset / "position.json").read_text())["held_out"]["rows"]
        rests = held_out_rests(rows, {"a": _texts("a", 3000, 1), "b": _texts("b", 3000, 2)},
                               lambda text: tok.encode(text, add_special_tokens=False).ids, tok.decode)
    return tagged_owners(tokens, tok.token_to_id("<|endoftext|>"), tok.decode, {"a": 1, "b": 0},
                         block_size=BLOCK, rests=rests)


# -- the schema ---------------------------------------------------------------------------------------------------

def test_a_config_in_phases_loads_as_the_union_of_its_sources_with_run_wide_probs(setup: dict[str, Path]) -> None:
    config = load_config(setup["config"])
    assert [s.label for s in config.mix] == ["a", "b"]  # one source each, whatever the phases
    # run-wide: 0.75 x 0.5 + 0.25 x 0.25 for a
    assert [round(s.prob, 12) for s in config.mix] == [0.4375, 0.5625]
    assert [(p.name, p.share, p.prob_of()) for p in config.phases] == [("main", 0.75, MAIN), ("anneal", 0.25, ANNEAL)]
    assert config.phased and config.to_dict()["phases"][1] == {"name": "anneal", "share": 0.25, "probs": ANNEAL}
    assert config.phase_ends(100) == [75, 100] and phase_ends([0.5, 0.25, 0.25], 10) == [5, 8, 10]
    # a one-mix config is one phase, and its data (manifests, identities) is what it always was
    single = parse_config({"seed": 1, "context_length": BLOCK, "target_tokens": 10, "mix": [
        {"name": "json", "prob": 1, "data_files": str(setup["dir"] / "a.jsonl")}]})
    assert not single.phased and single.phases[0].prob_of() == {"a": 1.0} and "phases" not in single.to_dict()
    # tokens instead of shares: the last phase may leave them out and take the rest; the default names
    data = json.loads(setup["config"].read_text())
    for phase in data["phases"]:
        del phase["share"], phase["name"]
    data["phases"][0]["tokens"] = 15_000
    # (a file typed another way in another phase is the same source)
    data["phases"][1]["mix"][0]["data_files"] = str(setup["dir"]) + "//a.jsonl"
    tokens = parse_config(data)
    assert [(p.name, p.share) for p in tokens.phases] == [("phase1", 0.75), ("phase2", 0.25)]
    assert [s.label for s in tokens.mix] == ["a", "b"] and tokens.phases[1].prob_of() == ANNEAL


def _bad(setup: dict[str, Path]) -> list[tuple[str, object, str]]:
    good = json.loads(setup["config"].read_text())
    a_entry = good["phases"][0]["mix"][0]

    def changed(**phase_changes: object) -> dict:
        data = json.loads(json.dumps(good))
        for where, value in phase_changes.items():
            index, key = where.split("_", 1)
            if value is None:
                del data["phases"][int(index[1:])][key]
            else:
                data["phases"][int(index[1:])][key] = value
        return data

    return [
        ("both", {**good, "mix": [a_entry]}, 'phases: give "mix" (one mix for the whole run) or "phases", not both'),
        ("neither", {k: v for k, v in good.items() if k != "phases"}, 'mix: missing required key (or give "phases")'),
        ("empty", {**good, "phases": []}, 'phases: no phases: give at least one, or a top-level "mix"'),
        ("typo", changed(p1_shares=0.2), "phases[1].shares: unknown key; did you mean 'share'?"),
        ("prob", changed(p1_mix=[{**a_entry, "prob": 0}]),
         "phases[1].mix[0].prob: expected a finite number > 0, got 0"),
        ("sum", changed(p1_share=0.3),
         "phases: the phases' shares sum to 1.05, not 1: they divide the training tokens"),
        ("no-share", changed(p0_share=None), 'phases[0].share: missing: give "share"'),
        ("both-share-tokens", changed(p0_tokens=100), 'phases[0]: give "share" (a fraction of the training tokens) '
                                                      'or "tokens", not both'),
        ("tokens-sum", changed(p0_share=None, p0_tokens=100, p1_share=None, p1_tokens=100),
         "phases: the phases' tokens sum to 200, not target_tokens (20,000)"),
        ("mixed", changed(p0_share=None, p0_tokens=15_000), 'phases[1]: phases give "share" and "tokens" mixed'),
        ("name", changed(p1_name="main"), "phases[1].name: 'main' is also phases[0]'s name: give each phase its own"),
        ("twice", changed(p1_mix=[a_entry, a_entry]), "phases[1].mix[1]: the same source as phases[1].mix[0]"),
        ("other-tokenizer", changed(p1_mix=[{**a_entry, "tokenizer": "gpt2"}]),
         "phases[1].mix[0].tokenizer: the same source as phases[0].mix[0] with another tokenizer"),
        ("share-range", changed(p0_share=1.5), "phases[0].share: expected a fraction of the training tokens in (0, 1]"),
    ]


def test_a_bad_phase_is_one_line_naming_the_json_path(setup: dict[str, Path], tmp_path: Path) -> None:
    for case, data, message in _bad(setup):
        path = tmp_path / f"{case}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: {message}" or str(info.value).startswith(f"{path}: {message}"), \
            (case, str(info.value))
        assert "\n" not in str(info.value)
    # as a user meets it: one line from the script, no traceback, nothing built
    proc = run_script("build_dataset_v5.py", "--config", tmp_path / "both.json", "--tokenizer_dir", setup["tokenizer"],
                      "--output_dir", tmp_path / "ds")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "not both" in proc.stderr and not (tmp_path / "ds").exists()


# -- the packed build and trainer ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(setup: dict[str, Path]) -> Path:
    """The config in phases built by the real script: 20,000 training tokens of 64-token blocks."""
    out = setup["dir"] / "ds"
    proc = run_script("build_dataset_v5.py", "--config", setup["config"], "--tokenizer_dir", setup["tokenizer"],
                      "--output_dir", out, "--target_tokens", 20_000, "--val_tokens", 2_000, "--block_size", BLOCK,
                      "--num_workers", 0, "--shuffle_buffer", 0, "--seed", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "phase main: blocks 0-233" in proc.stdout and "phase anneal: blocks 234-311" in proc.stdout, proc.stdout
    return out


def test_the_build_writes_the_phases_in_order_each_mixed_in_every_prefix(setup: dict[str, Path],
                                                                           dataset: Path) -> None:
    manifest = json.loads((dataset / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    blocks = 20_000 // BLOCK
    assert [(p["name"], p["blocks"]) for p in train["phases"]] == [("main", [0, 234]), ("anneal", [234, blocks])]
    assert manifest["complete"] and all(p["complete"] and not p["shares_missed"] for p in train["phases"])
    assert manifest["inputs"]["phases"] == load_config(setup["config"]).to_dict()["phases"]
    tokens = np.fromfile(dataset / "train.bin", dtype=manifest["dtype"]).astype(np.int64)
    owner = _owner(tokens, setup["tokenizer"], dataset)
    for phase, asked in zip(train["phases"], (MAIN, ANNEAL), strict=True):
        start, end = (b * BLOCK for b in phase["blocks"])
        # the manifest's counts are the decoded text's, token for token
        assert phase["sources"]["a"]["tokens"] == int((owner[start:end] == 1).sum())
        assert phase["sources"]["b"]["tokens"] == int((owner[start:end] == 0).sum())
        assert_every_prefix_mixed(owner[start:end], asked["a"], BLOCK, whole_within=WHOLE_WITHIN)
    # the validation split is mixed by the run-wide mix
    val = np.fromfile(dataset / "val.bin", dtype=manifest["dtype"]).astype(np.int64)
    assert abs((_owner(val, setup["tokenizer"]) == 1).mean() - 0.4375) < 0.06


def test_a_build_interrupted_before_and_after_the_boundary_writes_the_same_dataset(
        setup: dict[str, Path], dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C right after a saved position in the first phase, then in the second: the resumed build writes the
    uninterrupted one's bytes and manifest (the phase and each phase's counts are part of the position)."""
    import itertools
    import time
    import types

    from sparknet.data.packed import build as build_module
    from sparknet.data.packed.build import BuildSpec, build_dataset

    # a clock that ticks once per reading: the build saves its position every ten documents or so, however fast
    ticks = itertools.count()
    monkeypatch.setattr(build_module, "time", types.SimpleNamespace(time=time.time, monotonic=lambda: next(ticks)))
    stops = [lambda state: 100 < state["written"]["train"] < 234, lambda state: state["written"]["train"] > 260]
    stop_build_after_saves(monkeypatch, stops)
    out = tmp_path / "ds"
    spec = BuildSpec(config=load_config(setup["config"]), tokenizer=str(setup["tokenizer"]), output_dir=out,
                     target_tokens=20_000, val_tokens=2_000, block_size=BLOCK, seed=1, checkpoint_seconds=1e-6)
    for phase in (0, 1):
        with pytest.raises(KeyboardInterrupt):
            build_dataset(spec)
        assert build_position(tmp_path / ".ds.building")["position"].get("phase", 0) == phase
    manifest = build_dataset(spec)
    assert not stops
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (dataset / name).read_bytes(), name
    expected = json.loads((dataset / "manifest.json").read_text())
    assert manifest["splits"] == expected["splits"]


def test_the_sampler_draws_each_phase_from_its_blocks_passes_repeating_within_it() -> None:
    from sparknet.train.batch import GlobalBatchSampler

    # phase 0: 10 blocks for 3 steps of 4 (12: a second pass); phase 1: 20 blocks for 2 steps (8: a prefix)
    sampler = GlobalBatchSampler(30, 4, seed=3, phases=[(0, 10, 3), (10, 30, 2)])
    order = list(sampler)
    assert len(order) == len(sampler) == 20
    first, second = order[:12], order[12:]
    assert set(first) <= set(range(10)) and set(second) <= set(range(10, 30))
    assert len(set(first[:8])) == 8 and len(set(second)) == 8  # a pass: whole global batches of distinct blocks
    assert first[8:] != first[:4]  # the second pass is another permutation
    assert list(sampler) == order  # the same order every time: a resume replays it


def test_a_phase_smaller_than_one_global_batch_is_refused_before_the_run(dataset: Path, tmp_path: Path) -> None:

    # 312 training blocks in all, 78 in the anneal phase: a global batch of 96 fits the dataset, not the phase
    with pytest.raises(UserError, match=f"phase anneal of dataset {dataset} has 78 training blocks, fewer than one "
                                        "global batch \\(GLOBAL_BATCH_SIZE=96\\)"):
        train_packed(train_settings(tmp_path, global_batch_size=96, batch_size=8, target_tokens=4 * 96 * BLOCK),
                     dataset)
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_sparknet_v5.py", "train_sparknet.py"])
def test_a_phase_rounded_to_no_step_is_refused_in_one_line_before_any_work(script: str, setup: dict[str, Path],
                                                                          dataset: Path, tmp_path: Path) -> None:
    """Phases 0.75 / 0.25 over MAX_STEPS 2 with LR_SCHEDULE wsd: the anneal phase got "steps 3-2", no warning, and
    the LR stayed at its peak at every step (the decay over the last phase never ran). Both trainers refuse it in
    one line, naming the phase and the fewest steps that give every phase one (3: steps 1-2 and 3-3), before any
    work: no run folder, and the streaming trainer holds nothing out."""
    settings = dict(max_steps=2, lr_schedule="wsd", global_batch_size=4, batch_size=4)
    args = (train_args(tmp_path, dataset, **settings) if script == "train_sparknet_v5.py" else
            stream_args(tmp_path, setup["config"], setup["tokenizer"], **settings))
    target = args.index("--target_tokens")
    proc = run_script(script, *args[:target], *args[target + 2:])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: phase anneal gets none of the run's 2 optimizer steps (its share, 0.25 of them, rounds "
                      f"to none): train at least 3 steps (MAX_STEPS=3, or TARGET_TOKENS={3 * 4 * BLOCK:,} at "
                      f"{4 * BLOCK:,} tokens a step), or give the phase a larger share in the config"], proc.stderr
    assert "holding out" not in proc.stderr and not (tmp_path / "ckpt").exists()
    assert check_every_phase_trains([("main", 0.75), ("anneal", 0.25)], 3, 1) == [2, 3]
    assert check_every_phase_trains([("main", 0.95), ("anneal", 0.05)], 11, 1) == [10, 11]  # the shares
    with pytest.raises(UserError, match=r"its share, 0.05 of them, rounds to none\): train at least 11 steps"):
        check_every_phase_trains([("main", 0.95), ("anneal", 0.05)], 5, 1)


@pytest.fixture(scope="module")
def short_dataset(setup: dict[str, Path]) -> Path:
    """A build whose anneal phase (0.2 of the run, source c alone) runs dry: c's 21 documents give 15 of the 62
    blocks the phase asks. The build warns and marks the phase incomplete."""
    write_jsonl(setup["dir"] / "c.jsonl", _texts("c", 21, 3))
    mix = [{"name": "json", "prob": 0.5, "data_files": str(setup["dir"] / f"{label}.jsonl")} for label in "ab"]
    config = setup["dir"] / "short.json"
    config.write_text(json.dumps({"seed": 1, "context_length": BLOCK, "target_tokens": 20_000, "phases": [
        {"name": "main", "share": 0.8, "mix": mix},
        {"name": "anneal", "share": 0.2, "mix": [{"name": "json", "prob": 1.0,
                                                  "data_files": str(setup["dir"] / "c.jsonl")}]}]}))
    from sparknet.data.packed.build import BuildSpec, build_dataset

    out = setup["dir"] / "short"
    manifest = build_dataset(BuildSpec(config=load_config(config), tokenizer=str(setup["tokenizer"]), output_dir=out,
                                       target_tokens=20_000, val_tokens=2_000, block_size=BLOCK, seed=1))
    assert manifest["exhausted_sources"] == ["c"] and not manifest["complete"]
    phases = json.loads((out / "manifest.json").read_text())["splits"]["train"]["phases"]
    assert [(p["blocks"], p["complete"]) for p in phases] == [([0, 250], True), ([250, 265], False)]
    return out


def test_a_phase_its_build_left_short_gets_the_steps_its_blocks_are_of_the_split(
        short_dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The anneal's source ran dry at 15 of the 62 blocks its share asks. Planned by its share (0.2 of 50 steps), the
    run trained those 15 blocks 2.67 times each against the rest's 0.64 (157 times each was seen on a longer run),
    then it was refused unless ALLOW_SHORT_PHASES. Now each phase's steps follow the blocks the build wrote for it,
    as the stream gives them (it begins the next phase where one runs dry): both phases are trained about as often,
    with a warning naming the short phase; a complete build's phases keep their shares."""
    from sparknet.train.batch import plan_batch
    from sparknet.train.data_plan import packed_plan

    with caplog.at_level("WARNING"):
        plan = packed_plan(str(short_dataset), None, None)
    ends = plan.plan_phases(50, plan_batch(4, 4, 1))
    blocks = [end - start for _, start, end in plan.train.phases]
    assert blocks == [250, 15] and ends[-1] == 50
    passes = [(ends[k] - (ends[k - 1] if k else 0)) * 4 / blocks[k] for k in range(2)]
    assert abs(passes[0] - passes[1]) < 4 / 15, passes  # within one step of the anneal's
    assert [r.getMessage() for r in caplog.records if "is short" in r.getMessage()] == [
        f"phase anneal of dataset {short_dataset} is short: its build wrote 15 blocks for it (5.7% of the split, asked "
        "20.0%), missing its mix (b, c); each phase's steps follow the blocks it holds"]


@pytest.mark.slow
def test_a_packed_run_on_a_short_phase_trains_every_step_through_the_script(short_dataset: Path,
                                                                            tmp_path: Path) -> None:
    """Through the script, as a user runs it: exit 0, 50 steps, each phase's steps and passes in the log."""
    settings = dict(max_steps=50, global_batch_size=4, batch_size=4, eval_steps=50, save_steps=50, sample_steps=0,
                    sample_max_new_tokens=8)
    args = train_args(tmp_path, short_dataset, **settings)
    target = args.index("--target_tokens")
    proc = run_script("train_sparknet_v5.py", *args[:target], *args[target + 2:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "phase anneal of dataset" in proc.stderr and "each phase's steps follow the blocks it holds" in proc.stderr
    line = next(line for line in proc.stderr.splitlines() if "phases: main steps 1-" in line)
    passes = [float(p) for p in re.findall(r"\(([\d.]+) passes over its", line)]
    assert len(passes) == 2 and abs(passes[0] - passes[1]) < 0.3, line
    meta = json.loads((tmp_path / "ckpt" / "run" / "training_metadata.json").read_text())
    assert meta["steps"] == 50 and meta["phases"][-1]["steps"][1] == 50


@pytest.mark.slow
def test_a_streamed_run_whose_phase_runs_dry_trains_the_next_phase_and_a_last_one_ends_the_run_saying_so(
        setup: dict[str, Path], tmp_path: Path) -> None:
    """Source c, 30 rows, the hold-out taking the start of 20 (their rests are training's), is too small for a phase
    that mixes it alone. The stream's start-of-run estimate used to refuse such a run; the one rule now is the loop's:
    a first phase of c alone ends where c runs dry and the next phase trains to the end (all 40 steps, the short
    phase named once); a last phase of c alone ends the stream where c runs dry, and the run ends there saying at
    which step of how many (exit 0, the model and metadata of that step), as a run whose every source runs dry does."""
    data = tmp_path / "data"
    write_jsonl(data / "c.jsonl", _texts("c", 30, 3))
    ab = [{"name": "json", "prob": 0.5, "data_files": str(setup["dir"] / f"{label}.jsonl")} for label in "ab"]
    c = [{"name": "json", "prob": 1.0, "data_files": str(data / "c.jsonl")}]
    for order, mixes in (("first", (c, ab)), ("last", (ab, c))):
        config = tmp_path / f"{order}.json"
        config.write_text(json.dumps({"seed": 1, "context_length": BLOCK, "target_tokens": 20_000, "phases": [
            {"name": "main", "share": 0.8, "mix": mixes[0]}, {"name": "anneal", "share": 0.2, "mix": mixes[1]}]}))
        args = stream_args(tmp_path / order, config, setup["tokenizer"], max_steps=40, global_batch_size=4,
                           batch_size=4, eval_steps=40, save_steps=40, sample_max_new_tokens=8, shuffle_buffer=0)
        target = args.index("--target_tokens")
        proc = run_script("train_sparknet.py", *args[:target], *args[target + 2:])
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        meta = json.loads((tmp_path / order / "ckpt" / "run" / "training_metadata.json").read_text())
        if order == "first":
            assert proc.stderr.count("phase main is short: every source of it ran dry at block ") == 1, proc.stderr
            assert "phase anneal begins here and ends where planned" in proc.stderr
            assert meta["steps"] == 40 and "ended at step" not in proc.stderr
            assert meta["stream"]["training"]["end"] is None and meta["stream"]["training"]["exhausted"] == ["c"]
            # two processes (torchrun, gloo): each rank's part of c runs dry where it does, each switches there
            args = [a.replace(f"{tmp_path / order}/", f"{tmp_path / 'two'}/") for a in args]
            out = finish_ok(start_script("train_sparknet.py", [*args[:target], *args[target + 2:]], processes=2))
            assert "phase main is short" in out and "phase anneal begins here" in out and "ended at step" not in out
            meta = json.loads((tmp_path / "two" / "ckpt" / "run" / "training_metadata.json").read_text())
            assert meta["steps"] == 40 and meta["stream"]["training"]["exhausted"] == ["c"]
        else:
            steps = meta["steps"]
            assert 30 < steps < 40, steps
            assert f"the run ended at step {steps} of 40: its training data ran out" in proc.stderr, proc.stderr
            assert meta["stream"]["training"]["end"] == "every source ran dry"


def test_a_phase_whose_sources_run_dry_ends_there_and_the_next_begins_in_the_build_and_the_stream(
        setup: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Phase main mixes source c alone and c holds about a quarter of the phase's 234 blocks. The loop used to end
    there ("every source ran dry"): the build wrote no anneal and the stream ended the run. Now main ends where c runs
    dry and anneal begins in that block, ending where planned: the build writes all 312 blocks, its manifest gives
    each phase's range (main short, anneal longer, its mix in every prefix), the stream with the build's hold-out
    gives the build's blocks, and a stream stopped before and after the early switch resumes to the same blocks."""
    from sparknet.data.packed.build import BuildSpec, build_dataset
    from sparknet.data.spec import HeldOutRows

    write_jsonl(tmp_path / "c.jsonl", _texts("c", 90, 4))
    anneal = [{"name": "json", "prob": p, "data_files": str(setup["dir"] / f"{label}.jsonl")}
              for label, p in ANNEAL.items()]
    config = tmp_path / "dry.json"
    config.write_text(json.dumps({"seed": 1, "context_length": BLOCK, "target_tokens": 20_000, "phases": [
        {"name": "main", "share": 0.75, "mix": [{"name": "json", "prob": 1.0,
                                                 "data_files": str(tmp_path / "c.jsonl")}]},
        {"name": "anneal", "share": 0.25, "mix": anneal}]}))
    out = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        manifest = build_dataset(BuildSpec(config=load_config(config), tokenizer=str(setup["tokenizer"]),
                                           output_dir=out, target_tokens=20_000, val_tokens=1_000, block_size=BLOCK,
                                           seed=1))
    main, second = manifest["splits"]["train"]["phases"]
    switch = main["blocks"][1]
    assert 20 < switch < 100 and main["blocks"] == [0, switch] and second["blocks"] == [switch, 312], main
    assert not main["complete"] and second["complete"] and not manifest["complete"]
    assert manifest["splits"]["train"]["blocks"] == 312 and manifest["exhausted_sources"] == ["c"]
    warnings = [r.getMessage() for r in caplog.records if "is short" in r.getMessage()]
    assert warnings == [f"phase main is short: every source of it ran dry at block {switch} of the build's train "
                        "split, before its planned end at block 234; phase anneal begins here and ends where planned "
                        "(the train split's mix is in the dataset's manifest.json)"], warnings
    tokens = np.fromfile(out / "train.bin", dtype=manifest["dtype"]).astype(np.int64).reshape(-1, BLOCK)
    tok = Tokenizer.from_file(str(setup["tokenizer"] / "tokenizer.json"))
    position = json.loads((out / "position.json").read_text())["held_out"]
    # the rests of the documents the hold-out cut come first from each source (untagged: their starts are given)
    rests = held_out_rests(position["rows"], {"a": _texts("a", 3000, 1), "b": _texts("b", 3000, 2),
                                              "c": _texts("c", 90, 4)},
                           lambda text: tok.encode(text, add_special_tokens=False).ids, tok.decode)
    owner = tagged_owners(tokens, tok.token_to_id("<|endoftext|>"), tok.decode, {"a": 1, "b": 0, "c": 2},
                          rests=rests)[switch + 1:]
    assert ((owner == 0) | (owner == 1)).all()  # c's last document ends in the switch's block
    assert_every_prefix_mixed(owner.reshape(-1), ANNEAL["a"], BLOCK, whole_within=WHOLE_WITHIN)
    # ON_EXHAUSTED=stop: the build ends where c runs dry, no phase begins early
    stopped = build_dataset(BuildSpec(config=load_config(config), tokenizer=str(setup["tokenizer"]),
                                      output_dir=tmp_path / "stopped", target_tokens=20_000, val_tokens=1_000,
                                      block_size=BLOCK, seed=1, on_exhausted="stop"))
    assert [p["blocks"] for p in stopped["splits"]["train"]["phases"]] == [[0, switch], [switch, switch]]
    # the stream, after the build's hold-out: the build's blocks; stopped before and after the switch: the same

    def stream() -> object:
        made = stream_of(load_config(config), tok.to_str(), tok.token_to_id("<|endoftext|>"), block_size=BLOCK, seed=1,
                         held_out={label: HeldOutRows.from_dict(rows) for label, rows in position["rows"].items()},
                         exclude=position["hashes"])
        made.plan(phase_ends=[234, 312])
        return made

    whole = stream()
    blocks = np.stack([b["input_ids"].numpy() for _, b in zip(range(312), whole, strict=False)])
    whole.close()
    assert np.array_equal(blocks, tokens)
    for stop in (switch - 5, switch + 5):
        early = stream()
        first = [b["input_ids"].numpy() for _, b in zip(range(stop), early, strict=False)]
        state = json.loads(json.dumps(early.state_dict()))
        early.close()
        assert state.get("phase", 0) == (stop > switch)
        resumed = stream()
        resumed.load_state_dict(state)
        rest = [b["input_ids"].numpy() for _, b in zip(range(312 - stop), resumed, strict=False)]
        resumed.close()
        assert np.array_equal(np.stack(first + rest), tokens), stop


def _block_digests(dataset: Path) -> list[set[str]]:
    """Per phase, the digests RECORD_BATCHES gives its blocks (hf_trainer: blake2b of the int64 row)."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    tokens = np.fromfile(dataset / "train.bin", dtype=manifest["dtype"]).astype(np.int64).reshape(-1, BLOCK)
    return [{hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in tokens[slice(*p["blocks"])]}
            for p in manifest["splits"]["train"]["phases"]]


STEPS, GLOBAL = 48, 4  # phase main: steps 1-36, anneal: 37-48
RUN = dict(target_tokens=STEPS * GLOBAL * BLOCK, global_batch_size=GLOBAL, batch_size=2, eval_steps=4, save_steps=4,
           sample_steps=0, logging_steps=2, record_batches=True, lr_schedule="wsd", warmup_ratio=0.0)


def _stopped_before_the_boundary(script: str, args: list[str], run_dir: Path, processes: int) -> Path:
    """Starts the run, sends SIGINT once checkpoint-8 is complete; the checkpoint it saved, before step 36."""
    proc = start_script(script, args, processes=processes)
    wait_for(run_dir / "checkpoint-8" / ".complete", proc, timeout=300)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == (128 + signal.SIGINT if processes == 1 else 1), out[-3000:]
    saved = stopped_checkpoint(out, run_dir)
    assert 8 <= checkpoint_step(saved) < 36, saved
    return saved


def _eval_loss(tmp: Path) -> float:
    return json.loads((tmp / "ckpt" / "run" / "training_metadata.json").read_text())["metrics"]["eval_loss"]


def _assert_wsd_over_the_last_phase(steps: dict[int, tuple[list[str], float]]) -> None:
    """LR at the peak up to the last phase's first step, then lower at every step (the decay: its steps only)."""
    lrs = [steps[s][1] for s in range(1, STEPS + 1)]
    assert len(set(lrs[:37])) == 1, lrs
    assert all(later < earlier for earlier, later in zip(lrs[36:], lrs[37:], strict=False)), lrs


@pytest.mark.slow
def test_a_packed_run_in_phases_trains_each_phase_on_its_blocks_and_resumes_exactly_across_the_boundary(
        dataset: Path, tmp_path: Path) -> None:
    reference_args = train_args(tmp_path / "one", dataset, **RUN)
    finish_ok(start_script("train_sparknet_v5.py", reference_args))
    reference = step_blocks(tmp_path / "one" / "ckpt" / "run")
    assert sorted(reference) == list(range(1, STEPS + 1))
    main, anneal = _block_digests(dataset)
    for step, (blocks, _) in reference.items():
        assert set(blocks) <= (main if step <= 36 else anneal), step
    _assert_wsd_over_the_last_phase(reference)
    events = read_events(tmp_path / "one" / "logs" / "run")
    assert [value for step, value in events["data/phase"]] == [0.0 if step <= 36 else 1.0
                                                               for step, _ in events["data/phase"]]
    meta = json.loads((tmp_path / "one" / "ckpt" / "run" / "training_metadata.json").read_text())
    assert [(p["name"], p["steps"]) for p in meta["phases"]] == [("main", [1, 36]), ("anneal", [37, 48])]
    # stopped before the boundary on one process, resumed on two, and the other way: the same blocks and LR at every
    # step as the uninterrupted run
    for name, first, then in (("1to2", 1, 2), ("2to1", 2, 1)):
        args = train_args(tmp_path / name, dataset, **RUN)
        saved = _stopped_before_the_boundary("train_sparknet_v5.py", args, tmp_path / name / "ckpt" / "run", first)
        log = finish_ok(start_script("train_sparknet_v5.py", args, processes=then))
        assert f"resuming from {saved}" in log and "changed settings" not in log, log[-3000:]
        assert step_blocks(tmp_path / name / "ckpt" / "run") == reference, name
        # the same model: within the reductions' difference between process counts (tests/helpers.weights_apart)
        assert weights_apart(tmp_path / name / "ckpt" / "run", tmp_path / "one" / "ckpt" / "run") < 1e-2, name
        assert abs(_eval_loss(tmp_path / name) - _eval_loss(tmp_path / "one")) < 1e-3, name


# -- the stream ---------------------------------------------------------------------------------------------------

def _stream(setup: dict[str, Path], ends: list[int]):
    tok = Tokenizer.from_file(str(setup["tokenizer"] / "tokenizer.json"))
    stream = stream_of(load_config(setup["config"]), tok.to_str(), tok.token_to_id("<|endoftext|>"),
                       block_size=BLOCK, seed=1, shuffle_buffer=20)
    stream.plan(phase_ends=ends)
    return stream


def test_the_stream_switches_its_mix_at_the_boundary_and_resumes_exactly_across_it(setup: dict[str, Path]) -> None:
    ends = [150, 250]
    stream = _stream(setup, ends)
    blocks = [b["input_ids"].numpy() for _, b in zip(range(250), stream, strict=False)]
    owner = _owner(np.concatenate(blocks), setup["tokenizer"])
    assert_every_prefix_mixed(owner[:150 * BLOCK], MAIN["a"], BLOCK, whole_within=WHOLE_WITHIN)
    # the next phase's mix from its first block (the document crossing the boundary left out: its owner is known)
    assert_every_prefix_mixed(owner[151 * BLOCK:], ANNEAL["a"], BLOCK, whole_within=WHOLE_WITHIN)
    stats = stream.stats()
    assert stats["phase"] == 1 and abs(stats["phase_shares"]["a"] - ANNEAL["a"]) < 0.03
    # stopped before the boundary (and after it), resumed from its position on a fresh stream: the same blocks after
    for stop in (100, 200):
        early = _stream(setup, ends)
        first = [b["input_ids"].numpy() for _, b in zip(range(stop), early, strict=False)]
        state = json.loads(json.dumps(early.state_dict()))
        early.close()
        assert state["settings"]["phase_end_blocks"] == ends and state.get("phase", 0) == (stop > 150)
        resumed = _stream(setup, ends)
        resumed.load_state_dict(state)
        rest = [b["input_ids"].numpy() for _, b in zip(range(250 - stop), resumed, strict=False)]
        resumed.close()
        assert np.array_equal(np.stack(first + rest), np.stack(blocks)), stop
    # a position taken with other phase ends is refused
    other = _stream(setup, [100, 250])
    with pytest.raises(Exception, match="other data settings"):
        other.load_state_dict(state)
    for s in (stream, other):
        s.close()


@pytest.mark.slow
def test_a_streamed_run_in_phases_on_two_processes_resumes_exactly_across_the_boundary(
        setup: dict[str, Path], tmp_path: Path) -> None:
    """On two processes (torchrun): one process's stream across the boundary is the fast test above, and the
    streaming script on one process stops and resumes across a boundary in the test below."""
    processes = 2
    settings = {**RUN, "val_tokens": 1024, "shuffle_buffer": 20, "num_workers": 0}
    reference_args = stream_args(tmp_path / "ref", setup["config"], setup["tokenizer"], **settings)
    finish_ok(start_script("train_sparknet.py", reference_args, processes=processes))
    reference = step_blocks(tmp_path / "ref" / "ckpt" / "run")
    assert sorted(reference) == list(range(1, STEPS + 1))
    _assert_wsd_over_the_last_phase(reference)
    events = read_events(tmp_path / "ref" / "logs" / "run")
    assert {value for step, value in events["data/phase"] if step > 36} == {1.0}
    assert {value for step, value in events["data/phase"] if step <= 36} == {0.0}
    # the figure counts since the phase began: late in the last phase, its mix
    assert abs(events["data/share/a"][-1][1] - ANNEAL["a"]) < 0.1
    meta = json.loads((tmp_path / "ref" / "ckpt" / "run" / "training_metadata.json").read_text())
    assert [(p["name"], p["steps"]) for p in meta["phases"]] == [("main", [1, 36]), ("anneal", [37, 48])]
    args = stream_args(tmp_path / "stop", setup["config"], setup["tokenizer"], **settings)
    _stopped_before_the_boundary("train_sparknet.py", args, tmp_path / "stop" / "ckpt" / "run", processes)
    finish_ok(start_script("train_sparknet.py", args, processes=processes))
    assert step_blocks(tmp_path / "stop" / "ckpt" / "run") == reference


@pytest.mark.slow
def test_a_stopped_streamed_run_in_phases_continued_with_more_steps_is_refused_before_anything_is_written(
        setup: dict[str, Path], tmp_path: Path) -> None:
    """A streamed run in phases of 20 steps killed at step 8, continued with MAX_STEPS 40 and ALLOW_CONFIG_CHANGE: its
    phases' ends move with the budget and are part of the stream's position, so it is refused in one line naming
    the MAX_STEPS that continues it, before anything is written (it was found only on loading the position, after
    run_config.json took the new budget: the original command was then refused as changed settings). The original
    command still resumes (across the boundary, at step 15), and the same run with other phases is refused in one
    line, like any other change of the data."""
    settings = dict(global_batch_size=4, batch_size=4, eval_steps=4, save_steps=4, sample_steps=0, target_tokens="None")
    args = stream_args(tmp_path, setup["config"], setup["tokenizer"], **settings)
    run_dir = tmp_path / "ckpt" / "run"
    proc = start_script("train_sparknet.py", [*args, "--max_steps", 20])
    wait_for(run_dir / "checkpoint-8" / ".complete", proc)
    proc.kill()
    proc.communicate()
    before = {path: path.read_bytes() for path in sorted(tmp_path.rglob("*")) if path.is_file()}
    refused = run_script("train_sparknet.py", *args, "--max_steps", 40, "--allow_config_change", "true")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert refused.returncode == 1 and "Traceback" not in refused.stderr and len(errors) == 1, refused.stderr[-3000:]
    assert "is in phases" in errors[0] and "phase_end_blocks: [60, 80] -> [120, 160]" in errors[0], errors[0]
    assert "Continue it with MAX_STEPS=20" in errors[0] and "start a new RUN_NAME" in errors[0], errors[0]
    assert {path: path.read_bytes() for path in sorted(tmp_path.rglob("*")) if path.is_file()} == before
    data = json.loads(setup["config"].read_text())
    data["phases"][0]["share"], data["phases"][1]["share"] = 0.5, 0.5
    (tmp_path / "other.json").write_text(json.dumps(data))
    other = run_script("train_sparknet.py", *stream_args(tmp_path, tmp_path / "other.json", setup["tokenizer"],
                                                         **settings), "--max_steps", 20)
    assert other.returncode == 1 and "Traceback" not in other.stderr and "phases" in other.stderr, \
        other.stderr[-3000:]
    resumed = run_script("train_sparknet.py", *args, "--max_steps", 20)
    assert resumed.returncode == 0 and f"resuming from {run_dir / 'checkpoint-8'}" in resumed.stderr, \
        resumed.stderr[-3000:]
