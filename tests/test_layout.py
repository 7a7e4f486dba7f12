"""The package's shape: no import circle between SparkNet's modules, nor between the folders and modules of any
folder (type-only imports and imports inside functions included); the top level in floors that import only
downward; no two names in a folder that a reader cannot tell apart; and every training setting declared once with
its doc, identity flag and rule."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

from sparknet.common.runtime import PROJECT_ROOT
from sparknet.config.checks import RULES
from sparknet.config.cli import describe_constants, is_path_constant
from sparknet.train.settings import TrainSettings

PACKAGE = PROJECT_ROOT / "sparknet"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("sparknet", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The SparkNet modules `path` imports anywhere in it (`from sparknet.x import y` counts sparknet.x.y when that
    is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sparknet"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name.startswith("sparknet")}
    return {name for name in out if name in modules}


def _alike(a: str, b: str) -> bool:
    """Names a reader cannot tell apart: one is the other plus a suffix (build/build_state, run/run_folder), or both
    are one stem with a short ending (packed/packing)."""
    stem = os.path.commonprefix([a, b])
    return stem in (a, b) or (len(stem) >= 4 and max(len(a), len(b)) - len(stem) <= 3)


def test_no_two_names_in_a_folder_differ_by_a_suffix() -> None:
    """A module or subpackage is cut by concept and named for it, so that a folder listing reads as what it holds
    (no size rule: a concept may be one longer module)."""
    folders = [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").is_file())]
    alike = []
    for folder in folders:
        names = sorted(p.stem for p in folder.iterdir()
                       if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file())
        alike += [f"{folder.relative_to(PACKAGE.parent)}: {a}, {b}" for i, a in enumerate(names)
                  for b in names[i + 1:] if _alike(a, b)]
    assert not alike, f"name these by what each holds: {alike}"


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import circle in `graph` (name -> the names it imports), from a name back to it; None when none."""
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> list[str] | None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return [*trail[trail.index(target):], target]
            if target not in state and (found := visit(target, [*trail, target])):
                return found
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name, [name])):
            return found
    return None


def _folder_graph(package: str) -> dict[str, set[str]]:
    """The imports between the children of `package` (its modules, and its folders each taken whole; "__init__"
    for the package's own file): child -> the children it imports from."""
    modules = _modules()

    def child(module: str) -> str | None:
        if module == package:
            return "__init__"
        return module[len(package) + 1:].split(".")[0] if module.startswith(package + ".") else None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if (source := child(name)) is not None:
            graph.setdefault(source, set()).update(
                target for imported in _imports(path, modules) if (target := child(imported)) not in (None, source))
    return graph


def test_no_import_circle() -> None:
    modules = _modules()
    circle = _circle({name: _imports(path, modules) - {name} for name, path in modules.items()})
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_no_import_circle_between_folders() -> None:
    """Modules may avoid a circle while their folders close one (train -> eval.metrics, eval.data ->
    train.folders): at every level, the folders and modules of a folder, each folder taken whole, import one way."""
    packages = ["sparknet", *(".".join(("sparknet", *p.relative_to(PACKAGE).parts)) for p in PACKAGE.rglob("*")
                              if p.is_dir() and (p / "__init__.py").is_file())]
    for package in packages:
        circle = _circle(_folder_graph(package))
        assert circle is None, f"import circle between the parts of {package}: " + " -> ".join(circle or [])


# The top level of sparknet/ in floors, lowest first: mostly folders, each a role (docs/code.md draws them). A module
# or folder imports only from its own floor or below (on one floor without a circle: the test above), so what sits on
# a floor never needs what reads it. A new module or folder at the top level takes its place here.
FLOORS: list[tuple[str, set[str]]] = [
    ("ground", {"__init__", "common"}),
    # what the rules, the trainer and evaluation share: plain tables and functions of a model, a loss, a run folder
    ("leaves", {"model", "run_files", "harness"}),
    ("settings", {"config"}),
    ("tokenizer loading", {"tokenizer"}),  # below data/: the build and the stream load the tokenizer
    ("data", {"data"}),
    ("readers of the data", {"bpe", "train"}),  # tokenizer training and the trainers read the mix
    ("evaluation", {"eval"}),  # reads what a run wrote (run_files), never the trainer
    ("the chain's ends", {"export", "demo"}),
]


def test_the_top_level_imports_only_downward() -> None:
    floor = {unit: number for number, (_name, units) in enumerate(FLOORS) for unit in units}
    graph = _folder_graph("sparknet")
    assert set(graph) == set(floor), f"give each a floor in FLOORS: {sorted(set(graph) ^ set(floor))}"
    upward = [f"{unit} ({FLOORS[floor[unit]][0]}) imports {target} ({FLOORS[floor[target]][0]})"
              for unit, targets in sorted(graph.items()) for target in sorted(targets) if floor[target] > floor[unit]]
    assert not upward, f"imports that run up a floor: {upward}; move or split what sits on the wrong floor"


def test_no_function_takes_more_than_ten_parameters() -> None:
    """Settings travel as one frozen description passed whole (MetricsSpec, DataSpec, TrainSettings), not as
    a long list of keywords (self and cls not counted; *args and **kwargs count one each)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        owners = {child: node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  for child in node.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                named = [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")]
                if len(named) + bool(args.vararg) + bool(args.kwarg) > 10:
                    owner = f"{owners[node]}." if node in owners else ""
                    found.add(f"{path.relative_to(PROJECT_ROOT)}: {owner}{node.name}")
    assert not found, f"more than 10 parameters (pass a description whole): {sorted(found)}"


def test_every_training_setting_is_declared_once_with_doc_identity_and_rule() -> None:
    """Its doc is its comment in the trainer scripts, one text in both (what --help and docs/constants.md show)."""
    docs = [describe_constants((PROJECT_ROOT / "scripts" / script).read_text())
            for script in ("train_sparknet_v5.py", "train_sparknet.py")]
    for field in dataclasses.fields(TrainSettings):
        name = field.name.upper()
        assert docs[0].get(name) and docs[0][name] == docs[1].get(name), f"{name}: {[d.get(name) for d in docs]}"
        free = field.type == "bool" or is_path_constant(field.name.upper()) or field.name == "sample_prompts"
        assert free or field.name.upper() in RULES, f"{field.name}: no rule in sparknet.config.checks.RULES"
    # what may change between attempts of one run: logging, saving, sampling, paths (pinned: a change here changes
    # which runs resume)
    assert {f.name for f in dataclasses.fields(TrainSettings) if not f.metadata["identity"]} == {
        "run_name", "eval_steps", "save_steps", "save_total_limit", "sample_steps", "sample_prompts",
        "sample_max_new_tokens", "sample_temperature", "sample_top_k", "sample_seed", "logging_steps", "compile",
        "benchmark_every", "benchmark_tasks", "benchmark_limit",  # measured beside the run: the weights are the same
        "allow_config_change", "record_batches", "peak_tflops", "nonfinite", "checkpoints_dir", "logs_dir",
        "batch_size",  # the micro-batch: the global batch is the recipe (tests/test_device_count.py)
        "fused_cross_entropy",  # the same loss and gradients either way (tests/test_fused_loss.py)
        "max_steps"}  # in the identity as the budget in tokens it gives (run_identity's target_tokens)


def test_what_the_data_package_hands_on_resolves() -> None:
    import sparknet.data
    from sparknet.data.holdout import hold_out
    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.data.spec import DataSpec, Part
    from sparknet.data.stream.token_stream import TokenStream

    assert sparknet.data.__all__ == ["DataSpec", "PackedDataset", "Part", "TokenStream", "hold_out"]
    assert (sparknet.data.DataSpec, sparknet.data.PackedDataset, sparknet.data.Part, sparknet.data.TokenStream,
            sparknet.data.hold_out) == (DataSpec, PackedDataset, Part, TokenStream, hold_out)


def test_what_the_scripts_write_at_the_top_is_ignored_by_git() -> None:
    """Outputs under the names the docs use (any tokenizer-NAME/, the datasets, runs, exports), the folders being
    written or replaced, and a killed job's lock files are never offered to `git add`."""
    import subprocess

    written = ["tokenizer-mine/tokenizer.json", "tokenizer-anything/vocab.json", "datasets/mine/train.bin",
               "checkpoints/run/model.safetensors", "exports/run/README.md", ".tokenizer-mine.building/x",
               ".exports.replaced/x", ".tokenizer-mine.lock", ".tokenizer-mine.lock.json"]
    for path in written:
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=PROJECT_ROOT)
        assert proc.returncode == 0, f"{path} is not ignored by .gitignore"
    kept = subprocess.run(["git", "check-ignore", "-q", "--no-index", "sparknet/tokenizer.py"], cwd=PROJECT_ROOT)
    assert kept.returncode == 1  # the code itself is not


def test_the_top_level_holds_folders_and_few_modules() -> None:
    """Roles live in folders a newcomer can read (common/, model/, config/, data/, train/, eval/, demo/): at most
    12 modules at the top of sparknet/ (`__init__.py` counted)."""
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= 12, f"{len(modules)} modules at the top of sparknet/: {modules}; give the new one its folder"


def test_docs_code_names_every_module_in_its_folder() -> None:
    """docs/code.md draws the package module by module: a module moved, added or renamed is drawn there too."""
    drawn = (PROJECT_ROOT / "docs" / "code.md").read_text()
    tree = drawn[drawn.index("```\nsparknet") + 4:]
    folders: list[str] = []
    found = set()
    for line in tree[:tree.index("```")].split("\n")[1:-1]:  # under the root, `sparknet`
        name = line.split("#")[0].replace("│", " ").replace("├──", "   ").replace("└──", "   ").rstrip()
        depth = (len(name) - len(name.lstrip())) // 4 - 1
        folders[depth:] = [name.strip()]
        found.add("/".join(folders))
    wanted = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    wanted |= {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*") if (path / "__init__.py").is_file()}
    assert wanted == found, f"not in docs/code.md: {sorted(wanted - found)}; not in sparknet/: {sorted(found - wanted)}"
