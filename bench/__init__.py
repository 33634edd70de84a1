"""Parley's benchmark harness: `python -m bench.run` (make bench); see bench/README.md."""
