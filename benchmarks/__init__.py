"""gwtf benchmark suite (`make bench`); writes benchmarks/RESULTS.md."""
