"""Encoding: documents to tokens with the end-of-text token and cut into blocks (packer), on encoder processes
(encoder_pool), a bounded number of batches ahead of the mixer (read_ahead)."""
