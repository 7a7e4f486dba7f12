"""Samples from one or several models on the same prompts, side by side in one markdown report.

Each sample has its own seed, derived from SEED, its prompt's place in the list and its number: the same models,
prompts and settings always give the same text, and no two samples share their random draws. Report:
eval/<RUN_NAME>/generation.md (several models: eval/<A>_vs_<B>/generation.md), also printed.
"""

MODELS = ["checkpoints/demo"]  # checkpoint folders (checkpoints/RUN_NAME, or a checkpoint-N inside) or Hub ids
PROMPTS = ["The history of", "In this paper we", "def fibonacci(n):"]  # prompts (unless PROMPTS_FILE)
PROMPTS_FILE = ""  # a text file, one prompt per line (\n inside a line stands for a newline)
TEMPERATURE = 0.8  # sampling temperature (0: greedy, one sample)
TOP_P = 0.95  # nucleus sampling: smallest set of tokens with this much probability
TOP_K = 50  # sample among the k most likely tokens (0: no limit)
REPETITION_PENALTY = 1.0  # >1 discourages repeating tokens
MAX_NEW_TOKENS = 64  # tokens generated per sample
NUM_SAMPLES = 2  # samples per prompt and model
SEED = 1234  # seed of the samples (each sample's own seed derives from it, its prompt's place and its number)
EVAL_DIR = "eval"  # the report goes to EVAL_DIR/<RUN_NAME>/generation.md


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import check_outputs
    from sparknet.eval.models import resolve_model
    from sparknet.eval.reports import comparison_name, eval_dir, eval_outputs

    if not MODELS:
        from sparknet.common.errors import UserError

        raise UserError("no models: set MODELS to a list of checkpoint folders or Hub ids")
    refs = [resolve_model(spec) for spec in MODELS]
    check_outputs(*eval_outputs([ref.name for ref in refs], EVAL_DIR))
    runtime.setup(SEED)
    from sparknet.eval.generation import SamplingSettings, generate_samples, generation_report, load_prompts
    from sparknet.eval.models import load_model
    prompts = load_prompts(PROMPTS, PROMPTS_FILE)
    settings = SamplingSettings(temperature=TEMPERATURE, top_p=TOP_P, top_k=TOP_K,
                                repetition_penalty=REPETITION_PENALTY, max_new_tokens=MAX_NEW_TOKENS,
                                num_samples=NUM_SAMPLES, seed=SEED)
    samples = []
    for ref in refs:
        model, tokenizer, _ = load_model(ref)
        samples.append(generate_samples(model, tokenizer, prompts, settings))
    report = generation_report([ref.spec for ref in refs], prompts, samples, settings)
    out = eval_dir(comparison_name([ref.name for ref in refs]) if len(refs) > 1 else refs[0].name, EVAL_DIR)
    print(report, flush=True)  # first: a write fault below loses none of it
    out.mkdir(parents=True, exist_ok=True)
    runtime.write_text_atomic(out / "generation.md", report)
    print(f"report: {out / 'generation.md'}")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
