"""The causal-LM quality race (issue #27): ``python -m benchmarks.quality``; ``race.py`` says what it runs."""
