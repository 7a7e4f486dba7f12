"""Training: settings, the data plan, the HF Trainer parts, the run story, the run folder, callbacks, safety and
optimizers."""
