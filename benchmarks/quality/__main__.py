"""``python -m benchmarks.quality``: the causal-LM quality race (``race.py``)."""

from benchmarks.quality.race import main

if __name__ == "__main__":
    main()
