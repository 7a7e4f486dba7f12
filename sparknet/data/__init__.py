"""The data pipeline: sources -> mixing -> packing -> the packed (static) dataset or the stream.

What the Trainer reads is handed on here; the modules themselves are imported lazily by their users, so importing
`sparknet.data` stays cheap.
"""
