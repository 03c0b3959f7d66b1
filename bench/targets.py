"""`make bench`'s targets: the limit of each ratio (step / GEMM floor, forward+backward / floor,
AdamW against its chain and the memory bandwidth, thread scaling, memory) and the check of
the rows bench/analysis.py makes against them."""
from __future__ import annotations

from bench import bandwidth, cases
from bench.analysis import safe_div

# Targets (medians, float32, at the highest thread count run).
FWD_BWD_LARGE_LIMIT = {"FFN-relu": 1.08, "FFN-gelu": 1.12, "GMLP": 1.12,
                       "FFNSublayer-post-gelu": 1.12}
FWD_BWD_LARGE_LIMIT["GatedFFN-silu"] = FWD_BWD_LARGE_LIMIT["FFN-gelu"]
FWD_BWD_SMALL_LIMIT = 1.5
STEP_LARGE_LIMIT = 1.15
# The full step at the seed shapes, per block and shape.
STEP_SMALL_LIMIT = {b: {"seed001": 1.5, "seed000": 2.0}
                    for b in ("FFN-relu", "FFN-gelu", "GMLP", "FFNSublayer-post-gelu")}
STEP_SMALL_LIMIT["GatedFFN-silu"] = STEP_SMALL_LIMIT["FFN-gelu"]
# The full step of the other small cases: seed 004's MLP, and `make run`'s gMLP.
STEP_CASE_LIMIT = {("MLP", "batch64"): 1.5, ("GMLP", "run"): 1.15}
# Step time at one thread / at two: two threads must never be slower, at any case.
THREADS_RATIO_MIN = 1.0
ADAMW_SPEEDUP_MIN = 4.0
# AdamW.step at 321k parameters: speed-up per parameter over the NumPy chain it replaced
# (bench/baselines.py: measured once, the chain is gone).
ADAMW_CHAIN_SPEEDUP_MIN = 5.0
ADAMW_321K_ROW = "AdamW.step 321k (engine)"
# AdamW.step with its state coming from memory, GB/s as a fraction of the triad's.
ADAMW_BANDWIDTH_MIN = 0.8
SCALING_MIN = 1.7
MEMORY_RATIO_MAX = 1.25



def target_checks(rows, krows, scaling, memory, thread_ratios=()) -> list:
    """One dict per target that the data covers, at the highest thread count present:
    target (text), measured, op, limit, met, samples ("kept/total" undisturbed pairs, "" when
    not paired), noisy (too few undisturbed pairs: the median is over all), and what it is
    about (kind: fwd_bwd, step, adamw, adamw_bw, scaling, threads, memory; block; shape).
    ``thread_ratios``: thread_rows' 1 -> N thread ratios of every case."""
    if not rows and not krows:
        return []
    thr = max([r["threads"] for r in rows] + [r["threads"] for r in krows])
    by = {(r["block"], r["shape"]): r for r in rows if r["threads"] == thr}
    checks = []

    def add(what, value, limit, le=True, kind="", block="", shape="", pairs=None,
            noisy=False):
        if value is not None:
            checks.append(dict(target=what, measured=value, op="<=" if le else ">=",
                               limit=limit, met=value <= limit if le else value >= limit,
                               samples=f"{pairs[0]}/{pairs[1]}" if pairs else "",
                               noisy=bool(noisy), kind=kind, block=block, shape=shape,
                               threads=thr))

    def ratio(block, shape, kind, limit, label):
        r = by.get((block, shape))
        if r is not None:
            add(f"{label}/floor {block} {shape} ({thr} thr)", r[kind + "_ratio"], limit,
                kind=kind, block=block, shape=shape, pairs=r.get(kind + "_pairs"),
                noisy=r.get(kind + "_ratio_noisy"))

    for block, limit in FWD_BWD_LARGE_LIMIT.items():
        ratio(block, "large", "fwd_bwd", limit, "fwd+bwd")
    for shape in ("seed000", "seed001"):
        for block in cases.TRANSFORMER_BLOCKS:
            ratio(block, shape, "fwd_bwd", FWD_BWD_SMALL_LIMIT, "fwd+bwd")
    for block in cases.TRANSFORMER_BLOCKS:
        ratio(block, "large", "step", STEP_LARGE_LIMIT, "step")
    for shape in ("seed000", "seed001"):
        for block, limits in STEP_SMALL_LIMIT.items():
            ratio(block, shape, "step", limits[shape], "step")
    for (block, shape), limit in STEP_CASE_LIMIT.items():
        ratio(block, shape, "step", limit, "step")
    for k in krows:
        # The target is one AdamW update of all the FFN's parameters: the optimizer's step and
        # the kernel it runs (one region over all four). adamw_update, one call per parameter,
        # pays a parallel region per call (~0.15 ms each) and is shown in KERNELS only.
        if k["threads"] == thr and k["kernel"] in ("adamw_update_many", "AdamW.step (engine)"):
            add(f"{k['kernel']} 2.1M params, x naive ({thr} thr)", k["speedup"],
                ADAMW_SPEEDUP_MIN, le=False, kind="adamw", block=k["kernel"])
        if k["threads"] == thr and k["kernel"] == ADAMW_321K_ROW:
            from bench import baselines
            add(f"{k['kernel']} x NumPy chain per parameter ({thr} thr)",
                safe_div(baselines.ns_per_element("adamw", thr), k["ns_per_param"]),
                ADAMW_CHAIN_SPEEDUP_MIN, le=False, kind="adamw_chain", block=k["kernel"])
        if k["threads"] == thr and k["kernel"] == bandwidth.ADAMW_COLD_ROW:
            add(f"{k['kernel']} GB/s / triad GB/s ({thr} thr)", k["of_triad"],
                ADAMW_BANDWIDTH_MIN, le=False, kind="adamw_bw", block=k["kernel"])
    for sc in scaling:
        add(f"step scaling {sc['lo']}->{sc['hi']} thr {sc['block']} {sc['shape']}",
            sc["step_scaling"], SCALING_MIN, le=False, kind="scaling", block=sc["block"],
            shape=sc["shape"], pairs=sc.get("pairs"), noisy=sc.get("noisy"))
    for t in thread_ratios:
        add(f"step {t['lo']}->{t['hi']} thr, time @{t['lo']} / @{t['hi']} {t['block']} "
            f"{t['shape']}", t["ratio"], THREADS_RATIO_MIN, le=False, kind="threads",
            block=t["block"], shape=t["shape"], pairs=t.get("pairs"), noisy=t.get("noisy"))
    for m in memory:
        add(f"peak/sum memory {m['block']} {m['shape']}", safe_div(m["peak"], m["sum"]),
            MEMORY_RATIO_MAX, kind="memory", block=m["block"], shape=m["shape"])
    return checks
