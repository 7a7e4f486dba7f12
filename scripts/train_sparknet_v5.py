"""Trains a SparkNet model with the HF Trainer on a packed dataset (scripts/build_dataset_v5.py).

Warmup then cosine decay to MIN_LR_RATIO x LEARNING_RATE, AdamW, bf16 and TF32 where the GPU has them (fp32 on CPU),
periodic eval, the best checkpoint (on eval loss) exported at the end to checkpoints/RUN_NAME/. TensorBoard:
`tensorboard --logdir logs/RUN_NAME`. Run the same command again to resume an interrupted run; Ctrl-C saves a
checkpoint first. Multi-GPU: `torchrun --nproc_per_node N scripts/train_sparknet_v5.py` (or `accelerate launch`).
"""

RUN_NAME = "sparknet-70m-v5"  # run folder name under checkpoints/ and logs/
CONFIG: str | None = None  # mix config: the dataset's must be its mix (None: the one the dataset was built from)
DATASET_DIR = "datasets/sparknet-v5-1b"  # packed dataset from build_dataset_v5.py
TOKENIZER_DIR: str | None = None  # tokenizer folder or Hub id (None: the one the dataset was built with)
# sparknet-70m (GPT-2), sparknet-llama-70m; -demo and -tiny sizes of each (None: INIT_FROM's shape, else sparknet-70m)
MODEL_PRESET: str | None = None
# weights to start from (fresh optimizer, LR schedule, data): a run folder, its checkpoint-N or a Hub id (None: new)
INIT_FROM: str | None = None
TARGET_TOKENS: int | None = None  # training tokens (None: MAX_STEPS's, else the config's target_tokens)
MAX_STEPS = 0  # optimizer steps to train instead of TARGET_TOKENS; the LR schedule spans them (0: not set)
GLOBAL_BATCH_SIZE = 128  # blocks per optimizer step over all devices: the same steps on any number of GPUs
BATCH_SIZE = 32  # blocks per device per micro-step, at most: sizes memory (accumulation makes up the rest)
LEARNING_RATE = 1e-3  # peak learning rate (AdamW's; with OPTIMIZER=muon, that of embeddings, norms and biases)
OPTIMIZER = "adamw"  # adamw, or muon: Muon for the hidden weight matrices, AdamW for the rest
MUON_LEARNING_RATE = 1e-3  # Muon's peak learning rate (its update scaled to AdamW's size), when OPTIMIZER=muon
# the input embedding's peak learning rate, when OPTIMIZER=muon (None: LEARNING_RATE); NanoChat trains it faster
EMBEDDING_LEARNING_RATE: float | None = None
LR_SCHEDULE = "cosine"  # cosine, or wsd: warmup, stable peak, linear decay over the last DECAY_RATIO of steps
DECAY_RATIO = 0.2  # wsd: the fraction of the steps the LR decays over (in a config of phases: the last phase's)
MIN_LR_RATIO = 0.1  # the schedule decays to this fraction of the peak
WARMUP_RATIO = 0.02  # fraction of the steps spent warming up linearly
WEIGHT_DECAY = 0.1  # AdamW weight decay
ADAM_BETAS = (0.9, 0.95)  # AdamW betas
MAX_GRAD_NORM = 1.0  # clip the global grad norm to this (0: no clipping)
DROPOUT = 0.0  # dropout everywhere (the public reference run used 0.1; it costs ~40% of step time on CPU)
EVAL_STEPS = 250  # evaluate on the validation split every this many steps
SAVE_STEPS = 500  # save a checkpoint every this many steps (a multiple of EVAL_STEPS)
SAVE_TOTAL_LIMIT = 3  # checkpoints kept (the best one is always kept)
SAMPLE_STEPS = 500  # write a sample every this many steps (0: only at the end)
SAMPLE_PROMPTS = ["The history of", "In this paper we", "def fibonacci(n):"]  # prompts sampled from
SAMPLE_MAX_NEW_TOKENS = 64  # tokens generated per prompt
SAMPLE_TEMPERATURE = 0.8  # sampling temperature
SAMPLE_TOP_K = 50  # sample among the k most likely tokens
SAMPLE_SEED = 1234  # seed of the sampling (the same prompts give the same text at the same weights)
BENCHMARK_EVERY = 0  # run BENCHMARK_TASKS every this many evaluations, into TensorBoard (0: never; costs eval time)
BENCHMARK_TASKS = ["sparknet_continuation"]  # lm-eval tasks (sparknet_continuation: made from the validation text)
BENCHMARK_LIMIT = 100  # items scored per task at each benchmark (0: all)
LOGGING_STEPS = 10  # console line and TensorBoard scalars every this many steps
COMPILE = "auto"  # torch.compile: auto (on for CUDA), on (a CPU too: docs/training.md), off
FUSED_CROSS_ENTROPY = False  # the loss without the whole logits tensor (pip install cut-cross-entropy)
SEED = 42  # seed of initialisation, data order and dropout
PEAK_TFLOPS = 0.0  # the device's peak for MFU (0: from the table of common GPUs)
NONFINITE = "stop"  # on a non-finite loss or grad norm: stop, or skip the update (costs a sync per step)
ALLOW_CONFIG_CHANGE = False  # continue an existing RUN_NAME even though settings changed
RECORD_BATCHES = False  # write each step's LR and blocks to checkpoints/RUN_NAME/batches.jsonl
CHECKPOINTS_DIR = "checkpoints"  # runs are saved in CHECKPOINTS_DIR/RUN_NAME
LOGS_DIR = "logs"  # TensorBoard logs go to LOGS_DIR/RUN_NAME


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import check_outputs
    from sparknet.config.cli import constant_names
    from sparknet.config.mix import load_config
    from sparknet.train.folders import run_outputs

    check_outputs(*run_outputs(RUN_NAME, CHECKPOINTS_DIR, LOGS_DIR))
    config = load_config(CONFIG) if CONFIG is not None else None
    runtime.setup(SEED)
    from sparknet.train.data_plan import packed_plan
    from sparknet.train.run import report_outcome, train
    from sparknet.train.settings import TrainSettings

    settings = TrainSettings.from_constants({name: globals()[name] for name in constant_names(globals())})
    plan = packed_plan(DATASET_DIR, TOKENIZER_DIR, config)
    if settings.target_tokens is None and not settings.max_steps:
        settings.target_tokens = plan.target_tokens  # the config's target_tokens, as the dataset records it
    report_outcome(train(settings, plan), LOGS_DIR)


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
