"""Benchmarks: one measurement per module, each timing the library's own step, loop and metrics."""
