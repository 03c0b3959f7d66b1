"""blasnet benchmarks (pytest-benchmark): block steps against their GEMM floor and the naive
reference, kernels against their references. ``make bench`` runs ``bench/run.py``."""
