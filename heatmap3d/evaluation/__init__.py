"""Evaluation: radial errors in world mm, per-landmark statistics and reports."""
