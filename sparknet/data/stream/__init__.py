"""The stream: the pipeline packed into blocks on the fly for the Trainer (token_stream), the blocks one at a time with
their position (blocks), and the validation blocks held out from its start (holdout)."""
