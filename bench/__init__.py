"""Reproducible shmpool benchmarks (``python -m bench.core`` is the headline one)."""
