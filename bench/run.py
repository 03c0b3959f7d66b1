"""`make bench`: run the benchmarks at 1 and 2 BLAS threads and print one table.

Each thread count runs pytest-benchmark over bench/ in a fresh process (BLASNET_NUM_THREADS is
read at import, so it is set in the child's environment), writing
bench/results/threads<N>.json; then one process profiles the full step of each transformer
block at the large shape and the highest thread count (bench/step_profile.py, profile.json),
one process per thread count profiles the small shapes (profile_small<N>.json), and one
measures memory with tracemalloc (bench/results/memory.json). The report puts every step next
to its GEMM floor, the naive reference, its 1- and 2-thread times and the targets, and says
where the time of each missed target goes. Times and ratios are medians over the samples no
other process disturbed (bench/timing.py). The kernel table includes the machine's memory
bandwidth (a triad, bench/bandwidth.py) and AdamW.step's effective bandwidth as a fraction of
it, measured in the same process. ``--report-only`` re-prints it from the saved JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the "bench" package importable
    sys.path.insert(0, str(ROOT))

from bench import bandwidth, cases, floors  # noqa: E402
from kernels import blas_kernel  # noqa: E402

RESULTS = ROOT / "bench" / "results"
_SUMMARY = re.compile(r"\d+ (passed|failed|error|skipped)")
BENCH_FILES = ("bench/test_bench_blocks.py", "bench/test_bench_kernels.py")

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


# ----------------------------------------------------------------------------- running
def run_pytest(threads: int, quick: bool, out_json: Path, select: str | None = None,
               files=BENCH_FILES, echo=print) -> int:
    """One pytest-benchmark process at ``threads`` threads; progress lines are echoed,
    pytest-benchmark's own long table is not (the JSON has it all)."""
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
           "--rootdir", str(ROOT), f"--benchmark-json={out_json}", "--benchmark-columns=median"]
    if select:
        cmd += ["-k", select]
    out_json.unlink(missing_ok=True)  # never report a previous run's numbers as this one's
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cases.child_env(threads, quick),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        s = line.strip()
        if s.endswith("%]") or _SUMMARY.search(s):  # progress dots and the final count
            echo(f"  [threads={threads}] {s}")
    rc = proc.wait()
    echo(f"  [threads={threads}] pytest exit {rc} after {time.perf_counter() - t0:.0f} s")
    if rc != 0:
        echo("".join(lines[-60:]))
    return rc


def run_profile(out_json: Path, threads: int, quick: bool, echo=print, options=(),
                label="profile") -> int:
    """The step profile (bench/step_profile.py) in its own process at ``threads`` threads;
    ``options``: its command-line options (default: the large shape)."""
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.step_profile", "--out", str(out_json), *options]
    proc = cases.run_child(cmd, threads, quick, f"{label}, threads={threads}", echo)
    if proc.returncode != 0:
        echo(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode


def run_memory(out_json: Path, which=None, echo=print) -> int:
    """The tracemalloc pass (bench/memory.py) in its own process."""
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.memory", "--out", str(out_json)]
    for block, shape in which or ():
        cmd += ["--case", f"{block}:{shape}"]
    proc = cases.run_child(cmd, 1, False, "memory", echo)
    if proc.returncode != 0:
        echo(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode


# ----------------------------------------------------------------------------- loading
def load_benchmarks(paths) -> list:
    """Flatten pytest-benchmark JSON files into dicts: extra_info + median/rounds (s).
    ``median`` is the median over the undisturbed rounds when the run recorded it
    (``median_clean``), pytest-benchmark's own median (kept as ``median_all``) otherwise."""
    out = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        with open(p) as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            row = dict(b.get("extra_info", {}))
            row["median_all"] = b["stats"]["median"]
            row["median"] = row.get("median_clean", b["stats"]["median"])
            row["rounds"] = b["stats"]["rounds"]
            out.append(row)
    return out


def noise_summary(benchmarks) -> dict:
    """Undisturbed samples kept over all benchmarks: rounds and pairs as [kept, total], the
    dropped ones by reason, and the measurements that fell back to all samples."""
    out = dict(rounds=[0, 0], pairs=[0, 0], dropped={}, fallbacks=[])
    for b in benchmarks:
        label = " ".join(str(b.get(k)) for k in ("block", "shape", "kind", "kernel", "impl")
                         if b.get(k) is not None) + f" ({b.get('threads')} thr)"
        for key, slot in (("median_clean", "rounds"), ("paired_ratio", "pairs"),
                          ("paired_scaling", "pairs")):
            kept = b.get(key + "_kept")
            if kept is None:
                continue
            out[slot][0] += kept[0]
            out[slot][1] += kept[1]
            for why, n in (b.get(key + "_dropped") or {}).items():
                out["dropped"][why] = out["dropped"].get(why, 0) + n
            if b.get(key + "_fallback"):
                out["fallbacks"].append(f"{label} {key}")
    return out


def block_rows(benchmarks) -> list:
    """One row per (block, shape, threads) with medians (ms), ratios and GF/s."""
    groups: dict = {}
    for b in benchmarks:
        if "block" not in b:
            continue
        key = (b["block"], b["shape"], b["threads"])
        g = groups.setdefault(key, {"flops": b["flops"]})
        g[b["kind"]] = b["median"]
        g[b["kind"] + "_noisy"] = bool(b.get("median_clean_fallback"))
        if "paired_ratio" in b:
            g[b["kind"] + "_paired"] = b["paired_ratio"]
            g[b["kind"] + "_pairs"] = b.get("paired_ratio_kept")
            g[b["kind"] + "_paired_noisy"] = bool(b.get("paired_ratio_fallback"))
        if "paired_scaling" in b:
            g[b["kind"] + "_scaling"] = b["paired_scaling"]
            g[b["kind"] + "_scaling_pairs"] = b.get("paired_scaling_kept")
            g[b["kind"] + "_scaling_noisy"] = bool(b.get("paired_scaling_fallback"))
        if "block_gemms" in b:
            g["block_gemms"], g["floor_gemms"] = b["block_gemms"], b["floor_gemms"]
    order = {c: i for i, c in enumerate(cases.CASES)}
    rows = []
    for (block, shape, thr), g in sorted(
            groups.items(), key=lambda kv: (order.get(kv[0][:2], 99), kv[0][2])):
        row = dict(block=block, shape=shape, threads=thr, flops=g["flops"],
                   floor_ms=_ms(g.get("floor")))
        for kind in ("fwd_bwd", "step"):
            t, naive = g.get(kind), g.get("naive_" + kind)
            row[kind + "_ms"] = _ms(t)
            # Headline: the median ratio over alternating pairs (same conditions for both);
            # the ratio of the two separate medians is kept alongside.
            row[kind + "_ratio_medians"] = _div(t, g.get("floor"))
            row[kind + "_ratio"] = g.get(kind + "_paired", row[kind + "_ratio_medians"])
            row[kind + "_pairs"] = g.get(kind + "_pairs")
            # noisy: too few undisturbed samples, the median is over all of them
            row[kind + "_ratio_noisy"] = g.get(kind + "_paired_noisy", False)
            row[kind + "_noisy"] = g.get(kind + "_noisy", False)
            row[kind + "_x_naive"] = _div(naive, t)
            row[kind + "_gfs"] = _div(g["flops"] / 1e9, t)
            row["naive_" + kind + "_ms"] = _ms(naive)
        row["floor_noisy"] = g.get("floor_noisy", False)
        row["step_scaling_paired"] = g.get("step_scaling")
        row["step_scaling_pairs"] = g.get("step_scaling_pairs")
        row["step_scaling_noisy"] = g.get("step_scaling_noisy", False)
        row["floor_scaling_paired"] = g.get("floor_scaling")
        row["gemm_check"] = _gemm_check(g)
        rows.append(row)
    return rows


def _gemm_check(g) -> str:
    """'ok' when the block made exactly the floor's GEMMs (as a multiset of M, N, K, an
    output transposed allowed); 'not seen' when its GEMMs bypass kernels.gemm."""
    if "block_gemms" not in g:
        return ""
    seen = [tuple(t) for t in g["block_gemms"]]
    want = [tuple(t) + (False, False, 0.0) for t in g["floor_gemms"]]
    if not seen:
        return "not seen"
    if floors.same_gemms(seen, want):
        return "ok"
    return f"differ: block {sorted(seen)} vs floor {sorted(t[:3] for t in want)}"


def kernel_rows(benchmarks) -> list:
    """One row per (kernel, size, threads): medians (ms) of the fast, checked and baseline
    implementations, the speed-up, and for rows that move a known number of bytes the GB/s
    and that as a fraction of the triad's GB/s at the same thread count (``of_triad``)."""
    groups: dict = {}
    for b in benchmarks:
        if "kernel" in b:
            g = groups.setdefault((b["kernel"], b["size"], b["threads"]), {})
            g[b["impl"]] = b["median"]
            if b.get("bytes") and b["impl"] == "fast":
                g["bytes"] = b["bytes"]
            if b.get("params") and b["impl"] == "fast":
                g["params"] = b["params"]
    rows = []
    for (name, size, thr), g in groups.items():
        rows.append(dict(kernel=name, size=size, threads=thr, fast_ms=_ms(g.get("fast")),
                         checked_ms=_ms(g.get("checked")), ref_ms=_ms(g.get("ref")),
                         speedup=_div(g.get("ref"), g.get("fast")), bytes=g.get("bytes"),
                         gbs=_div(g.get("bytes") and g["bytes"] / 1e9, g.get("fast")),
                         ns_per_param=_div(g.get("fast") and 1e9 * g["fast"], g.get("params"))))
    triad = {r["threads"]: r["gbs"] for r in rows if r["kernel"] == bandwidth.TRIAD_ROW}
    for r in rows:
        r["of_triad"] = _div(r["gbs"], triad.get(r["threads"]))
    rows.sort(key=lambda r: (r["threads"], 0))
    return rows


def scaling_rows(rows, shape="large") -> list:
    """Thread scaling of the full step (and of its floor) at ``shape``: time at one thread /
    time at the most threads. ``step_scaling`` is the in-process paired measurement when
    the run has it (steady on a busy machine), else the ratio of the two runs' medians."""
    by = {(r["block"], r["shape"], r["threads"]): r for r in rows}
    threads = sorted({r["threads"] for r in rows})
    if not threads or threads[-1] < 2:
        return []
    lo, hi = 1, threads[-1]
    out = []
    for block in cases.TRANSFORMER_BLOCKS:
        a, b = by.get((block, shape, lo)), by.get((block, shape, hi))
        if b is None:
            continue
        medians = _div(a and a["step_ms"], b["step_ms"])
        paired = b.get("step_scaling_paired")
        if medians is None and paired is None:
            continue
        out.append(dict(block=block, shape=shape, lo=lo, hi=hi,
                        step_lo=a and a["step_ms"], step_hi=b["step_ms"],
                        step_scaling_medians=medians, step_scaling_paired=paired,
                        pairs=b.get("step_scaling_pairs") if paired is not None else None,
                        noisy=bool(paired is not None and b.get("step_scaling_noisy")),
                        step_scaling=paired if paired is not None else medians,
                        floor_scaling=b.get("floor_scaling_paired",
                                            _div(a and a["floor_ms"], b["floor_ms"]))))
    return out


def thread_rows(rows) -> list:
    """Every case's step time at one thread / at the most threads (>= 1: the extra threads do
    not slow it down): the in-process paired measurement of the many-thread run where it has
    one (``source`` "paired"; steady when whole processes run slow), else the ratio of the
    two runs' medians ("medians")."""
    by = {(r["block"], r["shape"], r["threads"]): r for r in rows}
    threads = sorted({r["threads"] for r in rows})
    if not threads or threads[-1] < 2 or threads[0] != 1:
        return []
    lo, hi = 1, threads[-1]
    out = []
    for block, shape in cases.CASES:
        a, b = by.get((block, shape, lo)), by.get((block, shape, hi))
        paired = b and b.get("step_scaling_paired")
        ratio = _div(a and a["step_ms"], b and b["step_ms"])
        if paired is not None:
            out.append(dict(block=block, shape=shape, lo=lo, hi=hi,
                            step_lo=a and a["step_ms"], step_hi=b["step_ms"], ratio=paired,
                            source="paired", pairs=b.get("step_scaling_pairs"),
                            noisy=bool(b.get("step_scaling_noisy")), ratio_medians=ratio))
        elif ratio is not None:
            out.append(dict(block=block, shape=shape, lo=lo, hi=hi, step_lo=a["step_ms"],
                            step_hi=b["step_ms"], ratio=ratio, source="medians", pairs=None,
                            noisy=bool(a.get("step_noisy") or b.get("step_noisy")),
                            ratio_medians=ratio))
    return out


def _ms(t):
    return None if t is None else 1e3 * t


def _div(a, b):
    return None if a is None or b is None or b == 0 else a / b


# ----------------------------------------------------------------------------- targets
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
                _div(baselines.ns_per_element("adamw", thr), k["ns_per_param"]),
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
        add(f"peak/sum memory {m['block']} {m['shape']}", _div(m["peak"], m["sum"]),
            MEMORY_RATIO_MAX, kind="memory", block=m["block"], shape=m["shape"])
    return checks


# ----------------------------------------------------------------------------- formatting
def _fmt(v, spec):
    if v is None:
        return "-"
    return format(v, spec)


def table(headers, rows, left=1, groups=()) -> str:
    """Fixed-width table; the first ``left`` columns are left-aligned, the rest right.
    ``groups``: (label, first column, last column) spans drawn above the header."""
    cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    sep = "  ".join("-" * w for w in widths)
    out = []
    if groups:
        starts = [sum(widths[:i]) + 2 * i for i in range(len(widths))]
        top = ""
        for label, a, b in groups:
            span = starts[b] + widths[b] - starts[a]
            top = top.ljust(starts[a]) + f" {label} ".center(span, "-")
        out.append(top)
    return "\n".join(out + [line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _shape_legend() -> str:
    return "; ".join(f"{s.name} = {s.legend()}" for s in cases.SHAPES.values())


def _star(text, noisy):
    return text + "*" if noisy else text


NOISY_NOTE = ("* = fewer than 3 undisturbed samples: the median is over all of them, "
              "disturbed ones included.")


def format_report(rows, krows, scaling, memory, checks, profile=(), noise=None,
                  thread_ratios=(), small_profile=()) -> str:
    out = []
    starred = False
    if rows:
        out.append(
            "BLOCKS (float32, medians). f+b = forward + backward; step = forward, loss, backward,\n"
            "AdamW step with the gradients zeroed in its pass (as engine.train.fit). floor = the\n"
            "same GEMMs alone (forward 1x, backward 2x), same shapes, same run.\n"
            "ratio = time / floor, median over alternating pairs of calls.\n"
            "x naive = time of the naive whole-array step / time. GF/s = GEMM FLOPs / time.\n"
            "Times and ratios: medians over the samples no other process disturbed.")
        out.append("Shapes: " + _shape_legend().replace("; ", ";\n        ") + ".")
        hdr = ["block", "shape", "thr", "floor ms",
               "ms", "ratio", "x naive", "GF/s", "ms", "ratio", "x naive", "GF/s"]
        body = []
        for r in rows:
            starred |= any(r[k] for k in ("floor_noisy", "fwd_bwd_noisy", "step_noisy",
                                          "fwd_bwd_ratio_noisy", "step_ratio_noisy"))
            body.append([r["block"], r["shape"], r["threads"],
                         _star(_fmt(r["floor_ms"], ".3f"), r["floor_noisy"]),
                         _star(_fmt(r["fwd_bwd_ms"], ".3f"), r["fwd_bwd_noisy"]),
                         _star(_fmt(r["fwd_bwd_ratio"], ".2f"), r["fwd_bwd_ratio_noisy"]),
                         _fmt(r["fwd_bwd_x_naive"], ".1f"), _fmt(r["fwd_bwd_gfs"], ".1f"),
                         _star(_fmt(r["step_ms"], ".3f"), r["step_noisy"]),
                         _star(_fmt(r["step_ratio"], ".2f"), r["step_ratio_noisy"]),
                         _fmt(r["step_x_naive"], ".1f"), _fmt(r["step_gfs"], ".1f")])
        out.append(table(hdr, body, left=2,
                         groups=[("forward + backward", 4, 7), ("full training step", 8, 11)]))
        bad = sorted({(r["block"], r["shape"], r["gemm_check"]) for r in rows
                      if r["gemm_check"] not in ("", "ok")})
        for block, shape, msg in bad:
            out.append(f"note: {block} {shape}: GEMMs {msg}")
    if noise and (noise["rounds"][1] or noise["pairs"][1]):
        dropped = ", ".join(f"{n} {why}" for why, n in sorted(noise["dropped"].items()))
        out.append(f"Undisturbed samples kept: rounds {noise['rounds'][0]}/{noise['rounds'][1]}"
                   f", pairs {noise['pairs'][0]}/{noise['pairs'][1]}"
                   + (f" (dropped by signal: {dropped})" if dropped else "") + ".")
        if noise["fallbacks"]:
            out.append("Too few undisturbed samples (median over all): "
                       + "; ".join(noise["fallbacks"]) + ".")
    if scaling:
        out.append("")
        lo, hi = scaling[0]["lo"], scaling[0]["hi"]
        out.append(f"THREAD SCALING of the full step at the large shape, {lo} -> {hi} threads "
                   f"(time at {lo} / time at {hi}).\npaired = alternating {lo}- and {hi}-thread "
                   f"steps in the {hi}-thread run (the headline);\nmedians = ratio of the "
                   f"step medians of the two runs; floor = the GEMMs alone, paired.")
        hdr = ["block", f"step ms @{lo}", f"step ms @{hi}", "scaling paired", "pairs kept",
               "scaling medians", "floor scaling"]
        body = []
        for sc in scaling:
            starred |= bool(sc.get("noisy"))
            pairs = sc.get("pairs")
            body.append([sc["block"], _fmt(sc["step_lo"], ".2f"), _fmt(sc["step_hi"], ".2f"),
                         _star(_fmt(sc["step_scaling_paired"], ".2f"), sc.get("noisy")),
                         f"{pairs[0]}/{pairs[1]}" if pairs else "-",
                         _fmt(sc["step_scaling_medians"], ".2f"),
                         _fmt(sc["floor_scaling"], ".2f")])
        out.append(table(hdr, body, left=1))
    if thread_ratios:
        out.append("")
        out.append(format_thread_ratios(thread_ratios))
        starred |= any(t.get("noisy") for t in thread_ratios)
    if krows:
        out.append("")
        out.append(
            "KERNELS (medians). baseline = np.matmul for gemm, kernels.reference otherwise;\n"
            "speed-up = baseline / fast; checked = kernels.gemm with its argument checks.\n"
            "GB/s = bytes moved / fast; of triad = GB/s / the triad's GB/s at that thread "
            "count.\nBytes: triad a=b+s*c 4 arrays (b, c read; a write-allocated and written), "
            "update a+=s*c\n3 (no write-allocate: both at one GB/s confirms the triad's 4), "
            "AdamW 7 per parameter\n(p, g, m, v read; p, m, v written); cold cache = the last-"
            "level cache evicted before each call.\nns/param = fast / parameters (AdamW.step "
            "321k; the NumPy chain it replaced: bench/baselines.py).")
        hdr = ["kernel", "size", "thr", "fast ms", "checked ms", "baseline ms", "speed-up",
               "GB/s", "of triad", "ns/param"]
        body = [[k["kernel"], k["size"], k["threads"], _fmt(k["fast_ms"], ".3f"),
                 _fmt(k["checked_ms"], ".3f"), _fmt(k["ref_ms"], ".3f"),
                 "-" if k["speedup"] is None else _fmt(k["speedup"], ".2f") + "x",
                 _fmt(k.get("gbs"), ".1f"), _fmt(k.get("of_triad"), ".2f"),
                 _fmt(k.get("ns_per_param"), ".3f")] for k in krows]
        out.append(table(hdr, body, left=2))
    if memory:
        out.append("")
        out.append("MEMORY of a training step (tracemalloc, MiB). state = params + grads + "
                   "AdamW moments;\nbuffers = cached activations and work buffers kept after "
                   "the step; sum = state + buffers;\npeak = highest traced memory from "
                   "construction through four steps; step alloc = rise of a\nsteady step "
                   "above its start (Python objects included).")
        hdr = ["block", "shape", "params", "state", "buffers", "sum", "peak", "peak/sum",
               "step alloc KiB"]
        mib = 1 << 20
        body = [[m["block"], m["shape"], f"{m['params']:,}", f"{m['state'] / mib:.2f}",
                 f"{m['buffers'] / mib:.2f}", f"{m['sum'] / mib:.2f}", f"{m['peak'] / mib:.2f}",
                 _fmt(_div(m["peak"], m["sum"]), ".3f"), f"{m['step_alloc'] / 1024:.1f}"]
                for m in memory]
        out.append(table(hdr, body, left=2))
    if profile:
        out.append("")
        out.append(format_profile(profile))
    if small_profile:
        out.append("")
        out.append(format_small_profiles(small_profile))
        starred |= any(p.get("fallback") for p in small_profile)
    costs = format_costs(list(profile or ()) + list(small_profile or ()))
    if costs:
        out.append("")
        out.append(costs)
    if checks:
        out.append("")
        out.append("TARGETS. pairs = undisturbed pairs kept / pairs run.")
        body = []
        for c in checks:
            starred |= c["noisy"]
            body.append([c["target"], _star(f"{c['measured']:.2f}", c["noisy"]),
                         f"{c['op']} {c['limit']:g}", c["samples"] or "-",
                         "met" if c["met"] else "MISSED"])
        out.append(table(["target", "measured", "limit", "pairs", ""], body, left=1))
        n_ok = sum(c["met"] for c in checks)
        out.append(f"{n_ok}/{len(checks)} targets met.")
        misses = format_misses(checks, rows, krows, list(profile or ()) + list(small_profile or ()),
                               thread_ratios)
        if misses:
            out.append("")
            out.append(misses)
    if starred:
        out.append("")
        out.append(NOISY_NOTE)
    return "\n".join(out)


# ----------------------------------------------------------------------------- profile
def _prof_cell(seconds, floor):
    if seconds is None:
        return "-"
    return f"{1e3 * seconds:.2f} {100 * seconds / floor:5.1f}%"


def format_profile(profile) -> str:
    """The PROFILE table: one column per block, one row per part of the step."""
    from bench import step_profile as prof
    thr = profile[0]["threads"]
    shape = profile[0]["shape"]
    lines = [f"PROFILE of the full step at the {shape} shape, {thr} threads "
             f"(bench/step_profile.py): ms, and % of the GEMM floor.\nMedians over undisturbed "
             f"steps. One row per kernels.ops kernel that forward and backward call,\ntimed by "
             f"kernels.instrument.record (exclusive); other = the forward's and backward's own\n"
             f"Python and inline NumPy; the loss and optimizer rows are whole calls (the\n"
             f"optimizer zeroes the gradients in its pass, as fit). - = the block does not call "
             f"that kernel."]
    hdr = ["part"] + [p["block"] for p in profile]
    body = []
    labels = _fwd_bwd_labels(profile)
    for label in labels:
        name = label
        if label == prof.GEMM:
            calls = [p["calls"].get(label, 0) for p in profile]
            name = f"{label} (calls: {'/'.join(str(c) for c in calls)})"
        body.append([name] + [_prof_cell(p["parts"].get(label), p["floor"]) for p in profile])
    body.append(["= forward + backward"] + [_prof_cell(p["fwd_bwd"], p["floor"])
                                            for p in profile])
    for label in prof.WHOLE:
        body.append([label] + [_prof_cell(p["parts"].get(label), p["floor"]) for p in profile])
    body.append(["= step, instrumented"] + [_prof_cell(p["step_instrumented"], p["floor"])
                                            for p in profile])
    body.append(["step, not instrumented"] + [_prof_cell(p["step"], p["floor"])
                                              for p in profile])
    body.append(["GEMM floor"] + [_prof_cell(p["floor"], p["floor"]) for p in profile])
    body.append(["step / floor"] + [_fmt(_div(p["step"], p["floor"]), ".3f")
                                    for p in profile])
    body.append(["undisturbed steps kept"] + [_star(f"{p['kept'][0]}/{p['kept'][1]}",
                                                    p["fallback"]) for p in profile])
    lines.append(table(hdr, body, left=1))
    return "\n".join(lines)


def format_costs(profiles) -> str:
    """WHERE THE TIME GOES per element: each compiled elementwise kernel's ns per element in
    the profiled steps (its time over the step / the elements its calls process), the
    median and range over the profiled cases per thread count, beside what the NumPy chain
    it replaced cost (bench/baselines.py, measured once before the chains were deleted)."""
    from bench import baselines
    per: dict = {}
    for p in profiles:
        for op, ns in (p.get("ns_per_element") or {}).items():
            per.setdefault(op, {}).setdefault(p["threads"], []).append((ns, p))
    if not per:
        return ""
    threads = sorted({t for d in per.values() for t in d})
    lines = ["WHERE THE TIME GOES per element: each compiled kernel's ns per element in the "
             "profiled steps\n(time per call / elements it processes: parameters for adamw, "
             "the largest array otherwise),\nmedian [min-max] over the profiled cases, beside "
             "the NumPy chain it replaced (ns per element at\nits own size, measured once: "
             "bench/baselines.py and docs/performance.md, \"Compiled kernels\"; the\n"
             "activation kernels per activation, \"+db\" with the bias gradient, chains "
             "measured at 1 thread only).\n"
             "Small calls are bound by their fixed cost per call, not per element."]
    hdr = ["kernel"]
    for t in threads:
        hdr += [f"ns/el {t} thr", f"NumPy {t} thr"]
    hdr.append("elements/step")
    body = []
    from bench import step_profile as prof
    for op in prof.order_parts(per):
        row = [op]
        for t in threads:
            vals = sorted(v for v, _ in per[op].get(t, []))
            if vals:
                med = statistics.median(vals)
                row.append(f"{med:.3f} [{vals[0]:.3f}-{vals[-1]:.3f}]")
            else:
                row.append("-")
            base = baselines.ns_per_element(op, t)
            row.append("-" if base is None else f"{base:.3f}")
        sizes = sorted({p["elements"][op] for d in per[op].values() for _, p in d})
        row.append(f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}")
        body.append(row)
    lines.append(table(hdr, body, left=1))
    return "\n".join(lines)


def _fwd_bwd_labels(profile) -> list:
    """The forward + backward parts of saved profiles: kernels (gemm first, then in
    kernels.ops order), then other."""
    from bench import step_profile as prof
    kernels_seen = [k for p in profile for k in p["parts"] if k in prof.ops.NAMES]
    return prof.order_parts(kernels_seen) + [prof.OTHER]


def _us(seconds, spec=".1f"):
    return "-" if seconds is None else format(1e6 * seconds, spec)


def format_small_profiles(profiles) -> str:
    """One table per (shape, threads) of the small-shape profiles, one column group per
    block: each part's calls per step, µs per call, µs per step and share of the step."""
    from bench import step_profile as prof
    order = {s: i for i, s in enumerate(cases.SHAPES)}
    groups: dict = {}
    for p in profiles:
        groups.setdefault((p["shape"], p["threads"]), []).append(p)
    lines = ["PROFILE of the full step at the small shapes (bench/step_profile.py --small), per "
             "shape and thread count.\nPer block: calls = calls per step; µs/call; µs = µs per "
             "step; % = share of the instrumented step.\nMedians over undisturbed steps. Parts "
             "as in the PROFILE above: the kernels.ops kernels of forward and\nbackward "
             "(exclusive times), other = their own Python and inline NumPy (the recorder's cost "
             "per\ncall included: compare the two step rows), then the loss and the optimizer "
             "(gradients zeroed in\nits pass) as whole calls. kernels.ops calls = every "
             "recorded call of the step, loss and optimizer\nincluded. - = the block does not "
             "call that kernel."]
    for (shape, thr), ps in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99),
                                                                   kv[0][1])):
        legend = f" = {cases.SHAPES[shape].legend()}" if shape in cases.SHAPES else ""
        lines.append("")
        lines.append(f"{shape}{legend}; {thr} thread{'s' if thr != 1 else ''}:")
        hdr = ["part"]
        spans = []
        for i, p in enumerate(ps):
            spans.append((p["block"], 1 + 4 * i, 4 + 4 * i))
            hdr += ["calls", "µs/call", "µs", "%"]
        body = []

        def cells(p, label):
            t, n = p["parts"].get(label), p["calls"].get(label)
            if t is None:
                return ["-", "-", "-", "-"]
            share = _div(t, p["step_instrumented"])
            return ["-" if n is None else str(n),
                    "-" if not n else _us(t / n), _us(t), _fmt(share and 100 * share, ".0f")]

        for label in _fwd_bwd_labels(ps) + list(prof.WHOLE):
            body.append([label] + [c for p in ps for c in cells(p, label)])

        def total(label, key, share=True):
            row = [label]
            for p in ps:
                t = p.get(key)
                row += ["", "", _us(t), _fmt(share and _div(100 * t, p["step_instrumented"]),
                                             ".0f") if share and t is not None else ""]
            return row
        body.append(total("= step, instrumented", "step_instrumented"))
        body.append(total("step, not instrumented", "step", share=False))
        body.append(total("GEMM floor", "floor", share=False))
        body.append(["step / floor"] + [c for p in ps for c in
                                        ["", "", _fmt(_div(p["step"], p["floor"]), ".2f"), ""]])
        body.append(["kernels.ops calls per step"] + [
            c for p in ps for c in [str(p.get("ops_calls_total", "-")), "", "", ""]])
        body.append(["undisturbed steps kept"] + [
            c for p in ps for c in ["", "", _star(f"{p['kept'][0]}/{p['kept'][1]}",
                                                  p["fallback"]), ""]])
        lines.append(table(hdr, body, left=1, groups=spans))
    return "\n".join(lines)


def format_thread_ratios(ratios) -> str:
    """The 1 -> N threads table: every case's step time at one thread / at the most."""
    lo, hi = ratios[0]["lo"], ratios[0]["hi"]
    lines = [f"{lo} -> {hi} THREADS, every case: step time at {lo} thread / at {hi} (>= "
             f"{THREADS_RATIO_MIN:g}: {hi} threads are not slower).\npaired = the median over "
             f"alternating {lo}-thread / {hi}-thread steps in the {hi}-thread process (the\n"
             f"thread count switched between calls, untimed), which a whole process running "
             f"slow\ncancels; medians = the step medians of the two runs (beside it, or alone "
             f"where\nno pairs were timed)."]
    hdr = ["block", "shape", f"step ms @{lo}", f"step ms @{hi}", f"@{lo} / @{hi}", "from",
           "medians"]
    body = [[t["block"], t["shape"], _fmt(t["step_lo"], ".3f"), _fmt(t["step_hi"], ".3f"),
             _star(_fmt(t["ratio"], ".2f"), t.get("noisy")), t["source"],
             _fmt(t.get("ratio_medians"), ".2f")] for t in ratios]
    lines.append(table(hdr, body, left=2))
    return "\n".join(lines)


def _amount(seconds, floor) -> str:
    """A time in the unit that suits the case: ms at the large shape, µs below 10 ms floors."""
    if floor is not None and floor < 0.01:
        return f"{1e6 * seconds:.0f} µs"
    return f"{1e3 * seconds:.1f} ms"


def _bare(seconds, floor) -> str:
    if floor is not None and floor < 0.01:
        return f"{1e6 * seconds:.0f}"
    return f"{1e3 * seconds:.1f}"


def format_misses(checks, rows, krows, profile, thread_ratios=()) -> str:
    """For each missed target: by how much, and where the time goes (from the profile of
    the same block, shape and thread count)."""
    from bench import step_profile as prof
    by_case = {(p["block"], p["shape"], p["threads"]): p for p in profile or ()}
    large = [p for p in profile or () if p["shape"] == "large"]
    ratios = {(t["block"], t["shape"]): t for t in thread_ratios or ()}
    out = []
    for c in checks:
        if c["met"]:
            continue
        kind, block = c["kind"], c["block"]
        head = f"- {c['target']}: {c['measured']:.2f}, limit {c['op']} {c['limit']:g}"
        p = by_case.get((block, c["shape"], c["threads"]))
        if kind in ("fwd_bwd", "step") and p:
            floor = p["floor"]
            over = (c["measured"] - c["limit"]) * floor
            parts = _fwd_bwd_labels([p])
            if kind == "step":
                parts += list(prof.WHOLE)
            extra = [(label, p["parts"].get(label)) for label in parts if label != prof.GEMM]
            extra = sorted([e for e in extra if e[1]], key=lambda e: -e[1])
            gemm = p["parts"].get(prof.GEMM)
            total = p["fwd_bwd"] if kind == "fwd_bwd" else p["step_instrumented"]
            text = (f"{head}: over by {c['measured'] - c['limit']:.2f}x the floor = "
                    f"{_amount(over, floor)} (floor {_amount(floor, floor)} in the profile run, "
                    f"where the ratio is {total / floor:.2f}). Beyond the floor the profile "
                    f"shows {_amount(total - floor, floor)}, the largest parts in "
                    f"{'µs' if floor < 0.01 else 'ms'}: ")
            text += ", ".join(f"{label} {_bare(v, floor)}" for label, v in extra[:4])
            if gemm is not None:
                text += (f"; the block's GEMMs take {'+' if gemm >= floor else '-'}"
                         f"{_amount(abs(gemm - floor), floor)} vs the floor")
            out.append(text + ".")
        elif kind == "threads":
            t = ratios.get((block, c["shape"]))
            text = head
            if t:
                text += (f": step {_fmt(t['step_lo'], '.3f')} ms at {t['lo']} thread, "
                         f"{_fmt(t['step_hi'], '.3f')} ms at {t['hi']}")
            a = by_case.get((block, c["shape"], t["lo"] if t else 1))
            if a and p:
                labels = _fwd_bwd_labels([a, p]) + list(prof.WHOLE)
                diff = [(label, (p["parts"].get(label) or 0.0) - (a["parts"].get(label) or 0.0))
                        for label in labels]
                grew = sorted([d for d in diff if d[1] > 0], key=lambda d: -d[1])
                if grew:
                    text += (f"; the parts that take longer at {p['threads']} threads (PROFILE): "
                             + ", ".join(f"{label} +{_amount(v, a['floor'])}"
                                         for label, v in grew[:4]))
            out.append(text + ".")
        elif kind == "adamw":
            k = next((k for k in krows if k["kernel"] == block
                      and k["threads"] == c["threads"]), None)
            text = head
            if k:
                text += (f": {_fmt(k['fast_ms'], '.2f')} ms vs {_fmt(k['ref_ms'], '.2f')} ms "
                         f"naive; a {ADAMW_SPEEDUP_MIN:g}x speed-up needs <= "
                         f"{_fmt(_div(k['ref_ms'], ADAMW_SPEEDUP_MIN), '.2f')} ms")
            opt = [(q["block"], q["parts"].get(prof.OPTIMIZER)) for q in large]
            opt = [(b, v) for b, v in opt if v is not None]
            if opt:
                text += "; in the profiled steps the optimizer takes " + ", ".join(
                    f"{b} {1e3 * v:.1f} ms" for b, v in opt)
            out.append(text + ".")
        elif kind == "adamw_chain":
            from bench import baselines
            k = next((k for k in krows if k["kernel"] == block
                      and k["threads"] == c["threads"]), None)
            base = baselines.ns_per_element("adamw", c["threads"])
            text = head
            if k and base:
                text += (f": {_fmt(k['ns_per_param'], '.3f')} ns per parameter vs the chain's "
                         f"{base:.3f}; {ADAMW_CHAIN_SPEEDUP_MIN:g}x needs <= "
                         f"{base / ADAMW_CHAIN_SPEEDUP_MIN:.3f}")
            out.append(text + ".")
        elif kind == "adamw_bw":
            k = next((k for k in krows if k["kernel"] == block
                      and k["threads"] == c["threads"]), None)
            t = next((k for k in krows if k["kernel"] == bandwidth.TRIAD_ROW
                      and k["threads"] == c["threads"]), None)
            text = head
            if k and t and k.get("bytes") and t.get("gbs"):
                need = k["bytes"] / (ADAMW_BANDWIDTH_MIN * t["gbs"] * 1e9)
                text += (f": {_fmt(k['fast_ms'], '.2f')} ms = {_fmt(k['gbs'], '.1f')} GB/s vs "
                         f"the triad's {_fmt(t['gbs'], '.1f')} GB/s; "
                         f"{ADAMW_BANDWIDTH_MIN:g} of it needs <= {1e3 * need:.2f} ms")
            out.append(text + ".")
        elif kind == "scaling":
            r = next((r for r in rows if r["block"] == block and r["shape"] == c["shape"]
                      and r["threads"] == c["threads"]), None)
            text = head
            if r and r.get("floor_scaling_paired"):
                text += f"; the GEMM floor alone scales {r['floor_scaling_paired']:.2f}x"
            if p:
                rest = p["step_instrumented"] - (p["parts"].get(prof.GEMM) or 0.0)
                text += (f"; at {p['threads']} threads the non-GEMM parts take "
                         f"{1e3 * rest:.1f} ms of a {1e3 * p['step_instrumented']:.1f} ms "
                         f"step (PROFILE)")
            out.append(text + ".")
        else:
            out.append(head + ".")
    if not out:
        return ""
    wrapped = [textwrap.fill(t, 100, subsequent_indent="  ") for t in out]
    return "WHERE THE TIME GOES in each missed target:\n" + "\n".join(wrapped)


def _load(path: Path) -> list:
    return json.loads(path.read_text()) if path.exists() else []


def report(result_dir: Path, threads=(1, 2)) -> tuple:
    """Load what the runs wrote and return (text, data)."""
    bench = load_benchmarks([result_dir / f"threads{t}.json" for t in threads])
    rows, krows = block_rows(bench), kernel_rows(bench)
    scaling = scaling_rows(rows)
    ratios = thread_rows(rows)
    memory = _load(result_dir / "memory.json")
    profile = _load(result_dir / "profile.json")
    small = [p for t in threads for p in _load(result_dir / f"profile_small{t}.json")]
    checks = target_checks(rows, krows, scaling, memory, ratios)
    noise = noise_summary(bench)
    m_path = result_dir / "machine.json"
    machine = json.loads(m_path.read_text()) if m_path.exists() else None
    text = format_report(rows, krows, scaling, memory, checks, profile, noise, ratios, small)
    if machine:
        text = _machine_line(machine) + "\n\n" + text
    data = dict(machine=machine, blocks=rows, kernels=krows, scaling=scaling,
                thread_ratios=ratios, memory=memory, profile=profile, profile_small=small,
                noise=noise, targets=checks)
    return text, data


def _machine_line(m) -> str:
    """CPU count and the 1-minute load average around the runs: on a shared machine the
    load says how far to trust the times (the paired ratios suffer least). The loads after
    each run include the bench's own processes; the one before says who else was busy."""
    loads = m.get("load_1min") or []
    line = f"Machine: {m.get('cpus')} CPUs; 1-min load average"
    if loads:
        line += f" before the runs {loads[0]:.2f}"
    if len(loads) > 1:
        line += ", after each (the bench's own load included) " + ", ".join(
            f"{x:.2f}" for x in loads[1:])
    if loads and loads[0] > 0.5:
        line += ("\n(other processes were busy when the bench started: samples they disturbed "
                 "are dropped, see below)")
    if m.get("blas"):
        line += "\n" + "\n".join(blas_kernel.header_lines(m["blas"]))
    return line


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run blasnet's benchmarks and print the table.")
    ap.add_argument("--quick", action="store_true",
                    help="fewer rounds; the large shape only at more than one thread (its "
                         "scaling measured in-process) and without the naive reference")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (1,2)")
    ap.add_argument("-k", dest="select", default=None, help="pytest -k selection of benchmarks")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the step profiles, large and small shapes (also skipped "
                         "with -k)")
    ap.add_argument("--results", default=str(RESULTS), help="directory for the JSON files")
    ap.add_argument("--report-only", action="store_true",
                    help="do not run anything; print the report from the saved JSON")
    args = ap.parse_args(argv)
    threads = tuple(int(t) for t in args.threads.split(","))
    result_dir = Path(args.results)
    result_dir.mkdir(parents=True, exist_ok=True)
    rc = 0
    t0 = time.perf_counter()
    if not args.report_only:
        print(f"blasnet bench{' (quick)' if args.quick else ''}: threads {threads}, "
              f"results in {result_dir}", flush=True)
        # The kernel every child runs: they inherit this environment (a pin included).
        blas = blas_kernel.facts(measure=True)
        print("\n".join(blas_kernel.header_lines(blas)), flush=True)
        loads = [os.getloadavg()[0]]
        for t in threads:
            rc |= run_pytest(t, args.quick, result_dir / f"threads{t}.json", args.select)
            loads.append(os.getloadavg()[0])
        (result_dir / "machine.json").write_text(json.dumps(dict(
            cpus=os.cpu_count(), load_1min=loads, quick=args.quick, threads=threads,
            blas=blas)))
        prof = result_dir / "profile.json"
        small = [(t, result_dir / f"profile_small{t}.json") for t in threads]
        if args.no_profile or args.select:
            prof.unlink(missing_ok=True)
            for _, path in small:
                path.unlink(missing_ok=True)
        else:
            rc |= run_profile(prof, max(threads), args.quick)
            for t, path in small:  # one process per thread count, as the benchmarks
                rc |= run_profile(path, t, args.quick, options=["--small"],
                                  label="small-shape profile")
        mem = result_dir / "memory.json"
        if args.no_memory:
            if mem.exists():
                mem.unlink()
        else:
            rc |= run_memory(mem)
    text, data = report(result_dir, threads)
    (result_dir / "summary.json").write_text(json.dumps(data, indent=1))
    print()
    print(text)
    if not args.report_only:
        print(f"\nbench finished in {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
