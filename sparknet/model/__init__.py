"""The model and how it learns: the architectures a preset may name (stock transformers classes), the presets and
their counts, the optimizers (Muon among them), the metrics of a loss and the text a model writes. Training and
evaluation both read it; it reads only sparknet.common."""
