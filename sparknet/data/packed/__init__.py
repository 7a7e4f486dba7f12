"""The packed dataset: its build (build), an interrupted build's saved position (resume), what its manifest says
(manifest), and the split files with their memmap reader (dataset)."""
