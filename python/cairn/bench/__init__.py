"""Benchmarks. Each compares Cairn with a baseline measured in the same run and prints the ratio;
results go to ``bench/results/<name>.json``. Run ``python -m cairn.bench NAME`` (``--help`` lists them).

These are measurements, not timed tests: nothing here asserts a speed.
"""
