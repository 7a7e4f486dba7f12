"""Trains a SparkNet model with the HF Trainer on the mix streamed live: no prebuilt dataset.

The mix's sources are read as streams, encoded on NUM_WORKERS processes, mixed by tokens (every stretch of the stream
carries the mix) and packed into blocks on the fly; nothing proportional to the data is held. Validation blocks are
held out from the start of the mix, never trained on, and kept in the run folder. Everything else is as in
train_sparknet_v5.py: TensorBoard (plus data/share/<source> and data/capacity_tokens_per_second), samples,
checkpoints with the stream's exact position (run the same command to resume; Ctrl-C saves first), the best model
exported.
Multi-GPU: `torchrun --nproc_per_node N scripts/train_sparknet.py` (each process streams its own documents).
"""

RUN_NAME = "sparknet-70m-stream"  # run folder name under checkpoints/ and logs/
CONFIG = "configs/datasets_v1.json"  # mix config: its sources are streamed
TOKENIZER_DIR = "tokenizer-v5"  # tokenizer folder or Hub id
BLOCK_SIZE: int | None = None  # tokens per training block (None: the config's context_length)
# validation tokens, whole blocks (None: 1 per 100 bytes of the sources, at most a tenth of the config's target_tokens
# and 2M: the build's rule, so that the build's and the stream's defaults hold out the same blocks)
VAL_TOKENS: int | None = None
# documents shuffled per source (0: each source's order; None: 1/20 of the smallest source's rows, at most 10,000:
# the build's rule)
SHUFFLE_BUFFER: int | None = None
# training blocks handed out in a shuffled order per window, so a step mixes documents (0: the stream's order)
SHUFFLE_WINDOW = 1024
ON_EXHAUSTED = "renormalise"  # a source runs dry: renormalise (the others fill in, a warning), stop, restart, or fail
NUM_WORKERS: int | None = None  # tokenizer processes per training process (None: the cores / processes on this node)
DATA_SEED: int | None = None  # seed of the per-source shuffle (None: the config's seed)
HUB_RETRY_MINUTES = 15.0  # a Hub source that fails (429, 5xx, a dropped connection) is retried this long
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
    config = load_config(CONFIG)
    runtime.setup(SEED)
    from sparknet.data.source.hub_retries import set_hub_retry_minutes

    set_hub_retry_minutes(HUB_RETRY_MINUTES)
    from sparknet.data.scaled_defaults import default_shuffle_buffer, default_val_tokens
    from sparknet.train.phases import check_every_phase_trains
    from sparknet.train.run import report_outcome, step_budget, train
    from sparknet.train.settings import TrainSettings
    from sparknet.train.stream_plan import StreamSpec, stream_plan

    settings = TrainSettings.from_constants({name: globals()[name] for name in constant_names(globals())})
    if settings.target_tokens is None and not settings.max_steps:
        settings.target_tokens = config.target_tokens
    block = BLOCK_SIZE or config.context_length
    if config.phased:  # a phase the budget gives no step: refused before the validation blocks are held out
        _, _, max_steps, per_step = step_budget(settings, block, config.target_tokens)
        check_every_phase_trains([(phase.name, phase.share) for phase in config.phases], max_steps, per_step)
    workers = max(1, runtime.available_cores() // runtime.local_world_size()) if NUM_WORKERS is None else NUM_WORKERS
    budget = settings.tokens_asked(block)
    spec = StreamSpec(config=config, tokenizer_dir=TOKENIZER_DIR, block_size=block,
                      val_tokens=default_val_tokens(config, budget) if VAL_TOKENS is None else
                      VAL_TOKENS,
                      seed=config.seed if DATA_SEED is None else DATA_SEED,
                      shuffle_buffer=default_shuffle_buffer(config) if SHUFFLE_BUFFER is None else SHUFFLE_BUFFER,
                      on_exhausted=ON_EXHAUSTED, num_workers=workers,
                      target_tokens=budget, window_blocks=SHUFFLE_WINDOW)
    run_dir = runtime.project_path(CHECKPOINTS_DIR) / RUN_NAME
    report_outcome(train(settings, stream_plan(spec, run_dir)), LOGS_DIR)


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
