"""blasnet benchmarks (pytest-benchmark): block steps against their GEMM floor and the naive
reference, kernels against their references, and a profile of each block's step
(``bench/step_profile.py``). ``make bench`` runs ``bench/run.py``; ``bench/timing.py`` says how
samples are taken and which ones another process disturbed."""
