"""The SparkNet demo: the whole chain on CPU, offline, in a few minutes, on text every Python installation has.

Runs the real scripts one after another, printing each command so you can run them yourself: demo corpus ->
tokenizer -> packed dataset -> training of a small model -> final eval and a sample. Every output goes to
demo-only folders; your tokenizer-v5/, datasets/sparknet-v5-1b/ and other runs are never touched.

Ctrl-C saves (the trainer a checkpoint, the build its position); the same command then resumes the interrupted demo,
reusing the steps it finished. After a finished demo, the next one starts over. `make clean-demo` removes it all.
"""

CONFIG = "configs/demo.json"  # the demo's mix: stdlib docstrings (prose) and stdlib source (code)
CORPUS_DIR = "data/demo"  # demo corpus (JSONL), written by scripts/prepare_demo_corpus.py
TOKENIZER_DIR = "tokenizer-demo"  # the demo's tokenizer (never tokenizer-v5/)
VOCAB_SIZE = 8192  # a small vocabulary suits the ~10 MB demo corpus
TOKENIZER_BYTES = 4_000_000  # bytes of text sampled for the tokenizer (of the ~10 MB demo corpus)
DATASET_DIR = "datasets/demo"  # the demo's packed dataset (never datasets/sparknet-v5-1b/)
VAL_TOKENS = 25_000  # validation tokens held out from the demo mix
SHUFFLE_BUFFER = 10_000  # documents per source in the build's shuffle buffer: each demo source shuffled whole
RUN_NAME = "demo"  # checkpoints/demo and logs/demo (resumed after an interruption, else replaced)
# with the recipe below: 1.70 bits/byte on 500k tokens, where a tuned AdamW on GPT-2 gets 2.10 (bench/RESULTS.md)
MODEL_PRESET = "sparknet-nanochat-demo"  # NanoChat block (QK-norm, ReLU², untied head), 4 layers, width 256
TRAIN_TOKENS = 460_000  # training tokens (4-5 minutes on two cores)
BATCH_SIZE = 8  # blocks of 256 tokens per step
OPTIMIZER = "muon"  # Muon for the hidden matrices, AdamW for the rest
LEARNING_RATE = 2e-3  # AdamW's peak learning rate: the output layer, norms and biases
EMBEDDING_LEARNING_RATE = 8e-3  # the input embedding's: 4x, as it is updated only where its tokens occur
MUON_LEARNING_RATE = 4e-3  # Muon's peak learning rate (2e-3: 0.031 bits/byte worse over three seeds)
LR_SCHEDULE = "wsd"  # warmup, the peak held, then a linear decay (better than cosine here by 0.075 bits/byte)
DECAY_RATIO = 0.5  # the decay's share of the steps: a long cool-down
EVAL_STEPS = 50  # evaluate every this many steps
SAVE_STEPS = 100  # save a checkpoint every this many steps (Ctrl-C also saves one)
BENCHMARK_ITEMS = 100  # items of the offline benchmark suite scored
EXPORT_DIR = "exports/demo"  # the Hub-ready folder with the model card


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import Output, check_outputs
    from sparknet.demo.chain import Chain, demo_state, remove_previous_run, report

    path = runtime.project_path
    # every folder of the chain, before its first step: a bad one would otherwise stop it steps later
    check_outputs(Output("CORPUS_DIR", path(CORPUS_DIR)), Output("TOKENIZER_DIR", path(TOKENIZER_DIR), locked=True),
                  Output("DATASET_DIR", path(DATASET_DIR), locked=True),
                  Output("RUN_NAME", path("checkpoints") / RUN_NAME, locked=True),
                  Output("RUN_NAME", path("logs") / RUN_NAME), Output("RUN_NAME", path("eval") / RUN_NAME),
                  Output("EXPORT_DIR", path(EXPORT_DIR), locked=True))
    runtime.setup()
    state, line = demo_state(RUN_NAME, DATASET_DIR, EXPORT_DIR)
    print(line, flush=True)
    resume = state == "interrupted"
    chain = Chain()
    chain.step("demo corpus", "prepare_demo_corpus.py", "--output_dir", CORPUS_DIR)
    if resume and (runtime.project_path(TOKENIZER_DIR) / "tokenizer.json").is_file():
        chain.skip("tokenizer", f"{TOKENIZER_DIR} is there: reused")
    else:
        chain.step("tokenizer", "train_tokenizer_v5.py", "--config", CONFIG, "--vocab_size", VOCAB_SIZE,
                   "--max_bytes", TOKENIZER_BYTES, "--output_dir", TOKENIZER_DIR, "--overwrite", "true")
    # resuming, the build reuses the dataset or goes on from its saved position (same inputs)
    chain.step("packed dataset", "build_dataset_v5.py", "--config", CONFIG, "--tokenizer_dir", TOKENIZER_DIR,
               "--output_dir", DATASET_DIR, "--val_tokens", VAL_TOKENS, "--shuffle_buffer", SHUFFLE_BUFFER,
               "--overwrite", str(not resume).lower())
    if not resume:
        remove_previous_run(RUN_NAME)
    chain.step("training", "train_sparknet_v5.py", "--run_name", RUN_NAME, "--config", CONFIG,
               "--dataset_dir", DATASET_DIR, "--model_preset", MODEL_PRESET, "--target_tokens", TRAIN_TOKENS,
               "--global_batch_size", BATCH_SIZE, "--batch_size", BATCH_SIZE, "--learning_rate", LEARNING_RATE,
               "--optimizer", OPTIMIZER, "--muon_learning_rate", MUON_LEARNING_RATE,
               "--embedding_learning_rate", EMBEDDING_LEARNING_RATE, "--lr_schedule", LR_SCHEDULE,
               "--decay_ratio", DECAY_RATIO,
               "--warmup_ratio", 0.05, "--eval_steps", EVAL_STEPS, "--save_steps", SAVE_STEPS, "--sample_steps", 100,
               # prompts without a trailing space: a lone space is a token the model never sees before a word
               "--logging_steps", 10, "--sample_prompts", '["def", "The"]')
    model = f"checkpoints/{RUN_NAME}"
    chain.step("perplexity", "eval_perplexity.py", "--models", f'["{model}"]')
    chain.step("benchmarks (offline suite)", "eval_benchmarks.py", "--models", f'["{model}"]', "--limit",
               BENCHMARK_ITEMS, "--suite_data", f"{CORPUS_DIR}/prose.val.jsonl")
    chain.step("plots", "plot_runs.py", "--runs", f'["{RUN_NAME}"]')
    chain.step("export with model card", "export_model.py", "--model", model, "--output_dir", EXPORT_DIR,
               "--overwrite", "true")
    chain.summary({
        "demo corpus": CORPUS_DIR,
        "tokenizer": f"{TOKENIZER_DIR}  (report: {TOKENIZER_DIR}/training_report.json)",
        "packed dataset": f"{DATASET_DIR}  (manifest: {DATASET_DIR}/manifest.json)",
        "model": f"checkpoints/{RUN_NAME}  (AutoModelForCausalLM.from_pretrained loads it)",
        "tensorboard": f"tensorboard --logdir logs/{RUN_NAME}",
        "evaluation": f"eval/{RUN_NAME}  (perplexity, benchmarks, plots)",
        "export": f"{EXPORT_DIR}  (Hub-ready, model card in README.md)",
    })
    report(RUN_NAME, DATASET_DIR, EXPORT_DIR)


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
