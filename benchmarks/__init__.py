"""The benchmark scripts; each runs from the repository root as ``python -m benchmarks.<name>``.

What they share is in :mod:`benchmarks.common`. Nothing is imported here: a script that must
set up its environment before numpy loads (``shape_prior``) runs this first.
"""
