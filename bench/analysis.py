"""`make bench`'s analysis: pytest-benchmark's JSON flattened into rows per block, kernel,
shape and thread count, each step beside its GEMM floor, naive reference and thread scaling
(bench/run.py runs the benchmarks; bench/targets.py holds the limits; bench/report.py prints)."""
from __future__ import annotations

import json
from pathlib import Path

from bench import bandwidth, cases, floors

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
                   floor_ms=to_ms(g.get("floor")))
        for kind in ("fwd_bwd", "step"):
            t, naive = g.get(kind), g.get("naive_" + kind)
            row[kind + "_ms"] = to_ms(t)
            # Headline: the median ratio over alternating pairs (same conditions for both);
            # the ratio of the two separate medians is kept alongside.
            row[kind + "_ratio_medians"] = safe_div(t, g.get("floor"))
            row[kind + "_ratio"] = g.get(kind + "_paired", row[kind + "_ratio_medians"])
            row[kind + "_pairs"] = g.get(kind + "_pairs")
            # noisy: too few undisturbed samples, the median is over all of them
            row[kind + "_ratio_noisy"] = g.get(kind + "_paired_noisy", False)
            row[kind + "_noisy"] = g.get(kind + "_noisy", False)
            row[kind + "_x_naive"] = safe_div(naive, t)
            row[kind + "_gfs"] = safe_div(g["flops"] / 1e9, t)
            row["naive_" + kind + "_ms"] = to_ms(naive)
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
        rows.append(dict(kernel=name, size=size, threads=thr, fast_ms=to_ms(g.get("fast")),
                         checked_ms=to_ms(g.get("checked")), ref_ms=to_ms(g.get("ref")),
                         speedup=safe_div(g.get("ref"), g.get("fast")), bytes=g.get("bytes"),
                         gbs=safe_div(g.get("bytes") and g["bytes"] / 1e9, g.get("fast")),
                         ns_per_param=safe_div(g.get("fast") and 1e9 * g["fast"], g.get("params"))))
    triad = {r["threads"]: r["gbs"] for r in rows if r["kernel"] == bandwidth.TRIAD_ROW}
    for r in rows:
        r["of_triad"] = safe_div(r["gbs"], triad.get(r["threads"]))
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
        medians = safe_div(a and a["step_ms"], b["step_ms"])
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
                                            safe_div(a and a["floor_ms"], b["floor_ms"]))))
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
        ratio = safe_div(a and a["step_ms"], b and b["step_ms"])
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


def to_ms(t):
    return None if t is None else 1e3 * t


def safe_div(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt(v, spec):
    if v is None:
        return "-"
    return format(v, spec)


def fwd_bwd_labels(profile) -> list:
    """The forward + backward parts of saved profiles: kernels (gemm first, then in
    kernels.ops order), then other."""
    from bench import step_profile as prof
    kernels_seen = [k for p in profile for k in p["parts"] if k in prof.ops.NAMES]
    return prof.order_parts(kernels_seen) + [prof.OTHER]
