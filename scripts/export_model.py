"""Exports a run as a clean, Hub-ready model folder: model.safetensors, config.json, generation_config.json, the
tokenizer, and a README.md model card (architecture, tokenizer, training data and settings from
training_metadata.json, final metrics, eval/<RUN_NAME>/ results and loss curve when present, usage, limitations).
With --push_to_hub USER/REPO the folder is uploaded (token from HF_TOKEN or `hf auth login`).
"""

MODEL = "checkpoints/demo"  # run folder (checkpoints/RUN_NAME) or a checkpoint-N inside it
OUTPUT_DIR = ""  # where the folder goes ("": exports/<RUN_NAME>)
LICENSE = ""  # the card's license, a Hub licence id (apache-2.0, mit, gpl-3.0; checked): "" is `other`, with a warning
# the card's languages (ISO 639-1 codes, e.g. ["en"]; []: none stated: the run knows its sources, not their languages)
LANGUAGE: list[str] = []
EVAL_DIR = "eval"  # eval results and plots are read from EVAL_DIR/<RUN_NAME>/
OVERWRITE = False  # replace a non-empty OUTPUT_DIR
UNFINISHED = False  # export a run folder whose training did not finish (no training_metadata.json) as it is
PUSH_TO_HUB = ""  # Hub repository (user/name) to upload to ("": don't)
PRIVATE = False  # create the Hub repository as private


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import Output, check_outputs
    from sparknet.eval.models import resolve_model

    output = runtime.project_path(OUTPUT_DIR or f"exports/{resolve_model(MODEL).name.replace('/', '-')}")
    check_outputs(Output("OUTPUT_DIR", output, locked=True))
    runtime.setup(0)
    from sparknet.export import export_model, push_to_hub

    card = export_model(MODEL, output, license=LICENSE, language=LANGUAGE, eval_root=EVAL_DIR, overwrite=OVERWRITE,
                        repo_id=PUSH_TO_HUB, unfinished=UNFINISHED)
    print(f"exported: {output} (card: {card})")
    if PUSH_TO_HUB:
        print(f"pushed: {push_to_hub(output, PUSH_TO_HUB, PRIVATE)}")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
