"""The constants-on-top convention: overrides, types, help and errors, on the real scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparknet.common.errors import UsageError
from sparknet.config.cli import apply_overrides, describe_constants, parse_value
from tests.helpers import run_script

SCRIPT = '''"""A test script."""
LEARNING_RATE = 3e-4  # peak learning rate
BATCH_SIZE = 8  # sequences per device step
COMPILE = False  # torch.compile the model
RUN_NAME = "run"  # folder name under checkpoints/
ADAM_BETAS = (0.9, 0.95)  # AdamW betas
PROMPTS = ["Once"]  # sample prompts
# derived from the config when None
TARGET_TOKENS: int | None = None
PRESETS: list[str] | None = None  # a list of str, not a str
EXTRA = None  # untyped: parsed as JSON
'''


@pytest.fixture
def namespace(tmp_path: Path) -> dict:
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    ns: dict = {"__file__": str(path), "__doc__": "A test script."}
    exec(compile(SCRIPT, str(path), "exec"), ns)
    return ns


def test_overrides_parse_to_the_defaults_types(namespace: dict) -> None:
    values = apply_overrides(
        namespace,
        [
            "--learning_rate",
            "1e-3",
            "--batch-size=16",
            "--compile",
            "--run_name",
            "x1",
            "--adam_betas",
            "[0.8, 0.99]",
            "--prompts",
            '["a", "b"]',
            "--target_tokens",
            "1e9",
        ],
    )
    assert values["LEARNING_RATE"] == 1e-3 and isinstance(values["LEARNING_RATE"], float)
    assert namespace["BATCH_SIZE"] == 16 and namespace["COMPILE"] is True and namespace["RUN_NAME"] == "x1"
    assert namespace["ADAM_BETAS"] == (0.8, 0.99) and namespace["PROMPTS"] == ["a", "b"]
    assert namespace["TARGET_TOKENS"] == 1_000_000_000 and isinstance(namespace["TARGET_TOKENS"], int)


def test_annotated_none_defaults_parse_to_their_type(namespace: dict) -> None:
    with pytest.raises(UsageError, match="--target_tokens: expected an integer, got '100k'"):
        apply_overrides(namespace, ["--target_tokens", "100k"])
    apply_overrides(namespace, ["--target_tokens", "none", "--extra", '{"a": 1}', "--presets", '["x", "y"]'])
    assert namespace["TARGET_TOKENS"] is None and namespace["EXTRA"] == {"a": 1}
    assert namespace["PRESETS"] == ["x", "y"]


@pytest.mark.parametrize("raw,expected", [("true", True), ("0", False), ("FALSE", False), ("1", True)])
def test_bool_values(raw: str, expected: bool) -> None:
    assert parse_value("COMPILE", raw, False) is expected


def test_int_accepts_whole_scientific_and_underscores() -> None:
    assert parse_value("N", "1e9", 5) == 1_000_000_000
    assert parse_value("N", "2_000", 5) == 2000
    with pytest.raises(UsageError, match="--n: expected an integer, got '1.5'"):
        parse_value("N", "1.5", 5)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--lerning_rate", "1"], "unknown flag --lerning_rate; did you mean --learning_rate?"),
        (["--batch_size", "eight"], "--batch_size: expected an integer, got 'eight'"),
        (["--compile", "maybe"], "--compile: expected true/false"),
        (["--adam_betas", "[0.9]"], "--adam_betas: expected a JSON list of 2 values"),
        (["--learning_rate"], "--learning_rate: missing value"),
        (["positional"], "unexpected argument 'positional'"),
    ],
)
def test_errors_name_the_flag(namespace: dict, args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("?", r"\?").replace("[", r"\[")):
        apply_overrides(namespace, args)


def test_help_comes_from_trailing_and_preceding_comments() -> None:
    helps = describe_constants(SCRIPT)
    assert helps["LEARNING_RATE"] == "peak learning rate"
    assert helps["TARGET_TOKENS"] == "derived from the config when None"


def test_real_script_help_lists_every_constant_with_default() -> None:
    from sparknet.config.cli import script_constants

    proc = run_script("train_tokenizer_v5.py", "--help")
    assert proc.returncode == 0
    constants = script_constants("train_tokenizer_v5.py")
    assert len(constants) >= 9
    for name, value in constants.items():
        lines = [line for line in proc.stdout.splitlines() if line.strip().startswith(f"--{name.lower()} ")]
        default = "false" if value is False else "true" if value is True else repr(value)
        assert len(lines) == 1 and lines[0].endswith(f"(default: {default})") and len(lines[0].split()) > 3, name


def test_real_script_unknown_flag_exits_2_without_traceback() -> None:
    proc = run_script("train_tokenizer_v5.py", "--vocab-sise", "100")
    assert proc.returncode == 2
    assert "unknown flag --vocab_sise; did you mean --vocab_size?" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_real_script_bad_type_exits_2() -> None:
    proc = run_script("train_tokenizer_v5.py", "--max_bytes=lots")
    assert proc.returncode == 2 and "--max_bytes: expected an integer, got 'lots'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_script_runs_from_another_folder(tmp_path: Path) -> None:
    """Relative paths in constants resolve against the project root, whatever the working folder."""
    proc = run_script("prepare_demo_corpus.py", "--output_dir", tmp_path / "c", "--max_code_mb", "0.2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c" / "prose.train.jsonl").stat().st_size > 100_000


def test_paths_typed_on_the_command_line_are_relative_to_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparknet.config.cli import resolve_typed_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    ns = {"CONFIG": "configs/a.json", "OUTPUT_DIR": "out", "TOKENIZER_DIR": "tokenizer-v5", "RUN_NAME": "r",
          "MODELS": ["m"], "PROMPTS_FILE": ""}
    apply_overrides(ns, ["--config", "cfg.json", "--output_dir", "a//b/../ds", "--run_name", "x/y",
                         "--tokenizer_dir", "tok"])
    assert ns["CONFIG"] == str(tmp_path / "cfg.json") and ns["OUTPUT_DIR"] == str(tmp_path / "a" / "ds")
    assert ns["TOKENIZER_DIR"] == str(tmp_path / "tok") and ns["RUN_NAME"] == "x/y"  # not a path constant
    apply_overrides(ns, ["--tokenizer_dir", "gpt2", "--models", '["gpt2"]', "--prompts_file", ""])
    assert ns["TOKENIZER_DIR"] == "gpt2" and ns["MODELS"] == ["gpt2"] and ns["PROMPTS_FILE"] == ""  # Hub ids
    assert resolve_typed_path("DATASET_DIR", "/abs//x") == "/abs/x"
    # DATA: files, globs and comma lists in the current folder; a Hub dataset id kept as typed
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    assert resolve_typed_path("DATA", "a.jsonl,b.jsonl") == f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}"
    assert resolve_typed_path("DATA", "*.jsonl") == str(tmp_path / "*.jsonl")
    assert resolve_typed_path("DATA", "Salesforce/wikitext") == "Salesforce/wikitext"


def test_a_config_next_to_the_user_is_found_from_another_folder(tmp_path: Path) -> None:
    """`--config cfg.json` means ./cfg.json, as for every shell tool (it used to be looked for in the repository)."""
    (tmp_path / "cfg.json").write_text('{"seed": 1}')
    proc = run_script("build_dataset_v5.py", "--config", "cfg.json", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path / 'cfg.json'}: context_length: missing required key"), proc.stderr


def test_a_typed_path_inside_the_repository_equals_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the repository root `--dataset_dir datasets//x` is the default-style `datasets/x` (same run identity);
    from a subfolder `../datasets/x` is too."""
    from sparknet.common.runtime import PROJECT_ROOT
    from sparknet.config.cli import resolve_typed_path

    monkeypatch.chdir(PROJECT_ROOT)
    assert resolve_typed_path("DATASET_DIR", "datasets//x") == "datasets/x"
    monkeypatch.chdir(PROJECT_ROOT / "scripts")
    assert resolve_typed_path("DATASET_DIR", "../datasets/x") == "datasets/x"
    assert resolve_typed_path("CONFIG", "c.json") == "scripts/c.json"
