"""Measurements of theory against engines on real models: benchmarks, analyses, reproductions."""
