"""kvikpy's benchmarks (see docs/benchmarks.md)."""
