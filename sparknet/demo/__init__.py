"""The demo: its chain of scripts and its corpus."""
