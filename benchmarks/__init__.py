"""Side-by-side benchmarks (run them with ``python -m benchmarks.run --quick|--full``)."""
