"""The studies: one measured lever each (``python -m benchmarks`` lists them)."""
