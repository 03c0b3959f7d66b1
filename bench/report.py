"""`make bench`'s report: the tables of blocks, kernels, thread ratios, memory and step
profiles, the targets met and missed, and where the time of each missed target goes."""
from __future__ import annotations

import statistics

from bench import cases
from bench.analysis import fmt, fwd_bwd_labels, safe_div
from bench.misses import format_misses
from bench.targets import THREADS_RATIO_MIN
from kernels import blas_kernel


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


def format_report(data: dict) -> str:
    """The report's text from ``data`` (bench/run.py's ``report``: blocks, kernels, scaling,
    thread_ratios, memory, profile, profile_small, noise, targets): one section per part
    present, then the note on starred (noisy) figures."""
    out, starred = [], False
    for section in (_blocks_section, _noise_section, _scaling_section, _thread_section,
                    _kernel_section, _memory_section, _profile_section, _targets_section):
        lines, noisy = section(data)
        out += lines
        starred |= noisy
    if starred:
        out += ["", NOISY_NOTE]
    return "\n".join(out)


def _blocks_section(data) -> tuple:
    rows = data.get("blocks") or []
    if not rows:
        return [], False
    out = [
        "BLOCKS (float32, medians). f+b = forward + backward; step = forward, loss, backward,\n"
        "AdamW step with the gradients zeroed in its pass (as engine.fit). floor = the\n"
        "same GEMMs alone (forward 1x, backward 2x), same shapes, same run.\n"
        "ratio = time / floor, median over alternating pairs of calls.\n"
        "x naive = time of the naive whole-array step / time. GF/s = GEMM FLOPs / time.\n"
        "Times and ratios: medians over the samples no other process disturbed.",
        "Shapes: " + _shape_legend().replace("; ", ";\n        ") + "."]
    hdr = ["block", "shape", "thr", "floor ms",
           "ms", "ratio", "x naive", "GF/s", "ms", "ratio", "x naive", "GF/s"]
    starred = any(r[k] for r in rows for k in ("floor_noisy", "fwd_bwd_noisy", "step_noisy",
                                                "fwd_bwd_ratio_noisy", "step_ratio_noisy"))
    body = [[r["block"], r["shape"], r["threads"],
             _star(fmt(r["floor_ms"], ".3f"), r["floor_noisy"]),
             _star(fmt(r["fwd_bwd_ms"], ".3f"), r["fwd_bwd_noisy"]),
             _star(fmt(r["fwd_bwd_ratio"], ".2f"), r["fwd_bwd_ratio_noisy"]),
             fmt(r["fwd_bwd_x_naive"], ".1f"), fmt(r["fwd_bwd_gfs"], ".1f"),
             _star(fmt(r["step_ms"], ".3f"), r["step_noisy"]),
             _star(fmt(r["step_ratio"], ".2f"), r["step_ratio_noisy"]),
             fmt(r["step_x_naive"], ".1f"), fmt(r["step_gfs"], ".1f")] for r in rows]
    out.append(table(hdr, body, left=2,
                     groups=[("forward + backward", 4, 7), ("full training step", 8, 11)]))
    bad = sorted({(r["block"], r["shape"], r["gemm_check"]) for r in rows
                  if r["gemm_check"] not in ("", "ok")})
    out += [f"note: {block} {shape}: GEMMs {msg}" for block, shape, msg in bad]
    return out, starred


def _noise_section(data) -> tuple:
    noise = data.get("noise")
    if not noise or not (noise["rounds"][1] or noise["pairs"][1]):
        return [], False
    dropped = ", ".join(f"{n} {why}" for why, n in sorted(noise["dropped"].items()))
    out = [f"Undisturbed samples kept: rounds {noise['rounds'][0]}/{noise['rounds'][1]}"
           f", pairs {noise['pairs'][0]}/{noise['pairs'][1]}"
           + (f" (dropped by signal: {dropped})" if dropped else "") + "."]
    if noise["fallbacks"]:
        out.append("Too few undisturbed samples (median over all): "
                   + "; ".join(noise["fallbacks"]) + ".")
    return out, False


def _scaling_section(data) -> tuple:
    scaling = data.get("scaling") or []
    if not scaling:
        return [], False
    lo, hi = scaling[0]["lo"], scaling[0]["hi"]
    out = ["", f"THREAD SCALING of the full step at the large shape, {lo} -> {hi} threads "
               f"(time at {lo} / time at {hi}).\npaired = alternating {lo}- and {hi}-thread "
               f"steps in the {hi}-thread run (the headline);\nmedians = ratio of the "
               f"step medians of the two runs; floor = the GEMMs alone, paired."]
    hdr = ["block", f"step ms @{lo}", f"step ms @{hi}", "scaling paired", "pairs kept",
           "scaling medians", "floor scaling"]
    body = []
    for sc in scaling:
        pairs = sc.get("pairs")
        body.append([sc["block"], fmt(sc["step_lo"], ".2f"), fmt(sc["step_hi"], ".2f"),
                     _star(fmt(sc["step_scaling_paired"], ".2f"), sc.get("noisy")),
                     f"{pairs[0]}/{pairs[1]}" if pairs else "-",
                     fmt(sc["step_scaling_medians"], ".2f"), fmt(sc["floor_scaling"], ".2f")])
    out.append(table(hdr, body, left=1))
    return out, any(bool(sc.get("noisy")) for sc in scaling)


def _thread_section(data) -> tuple:
    ratios = data.get("thread_ratios") or []
    if not ratios:
        return [], False
    return ["", format_thread_ratios(ratios)], any(t.get("noisy") for t in ratios)


def _table_section(rows, legend: str, hdr: list, row) -> tuple:
    """A section of ``legend`` over a table with one ``row(r)`` per entry of ``rows``; nothing
    when there are none (a part the run did not measure)."""
    if not rows:
        return [], False
    return ["", legend, table(hdr, [row(r) for r in rows], left=2)], False


KERNEL_LEGEND = (
    "KERNELS (medians). baseline = np.matmul for gemm, kernels.reference otherwise;\n"
    "speed-up = baseline / fast; checked = kernels.gemm with its argument checks.\n"
    "GB/s = bytes moved / fast; of triad = GB/s / the triad's GB/s at that thread count.\n"
    "Bytes: triad a=b+s*c 4 arrays (b, c read; a write-allocated and written), update a+=s*c\n"
    "3 (no write-allocate: both at one GB/s confirms the triad's 4), AdamW 7 per parameter\n"
    "(p, g, m, v read; p, m, v written); cold cache = the last-level cache evicted before "
    "each call.\nns/param = fast / parameters (AdamW.step 321k; the NumPy chain it replaced: "
    "bench/baselines.py).")
KERNEL_HEADER = ["kernel", "size", "thr", "fast ms", "checked ms", "baseline ms", "speed-up",
                 "GB/s", "of triad", "ns/param"]


def _kernel_row(k) -> list:
    return [k["kernel"], k["size"], k["threads"], fmt(k["fast_ms"], ".3f"),
            fmt(k["checked_ms"], ".3f"), fmt(k["ref_ms"], ".3f"),
            "-" if k["speedup"] is None else fmt(k["speedup"], ".2f") + "x",
            fmt(k.get("gbs"), ".1f"), fmt(k.get("of_triad"), ".2f"),
            fmt(k.get("ns_per_param"), ".3f")]


def _kernel_section(data) -> tuple:
    return _table_section(data.get("kernels"), KERNEL_LEGEND, KERNEL_HEADER, _kernel_row)


MEMORY_LEGEND = (
    "MEMORY of a training step (tracemalloc, MiB). state = params + grads + AdamW moments;\n"
    "buffers = cached activations and work buffers kept after the step; sum = state + "
    "buffers;\npeak = highest traced memory from construction through four steps; step "
    "alloc = rise of a\nsteady step above its start (Python objects included).")
MEMORY_HEADER = ["block", "shape", "params", "state", "buffers", "sum", "peak", "peak/sum",
                 "step alloc KiB"]


def _memory_row(m) -> list:
    mib = 1 << 20
    return [m["block"], m["shape"], f"{m['params']:,}", f"{m['state'] / mib:.2f}",
            f"{m['buffers'] / mib:.2f}", f"{m['sum'] / mib:.2f}", f"{m['peak'] / mib:.2f}",
            fmt(safe_div(m["peak"], m["sum"]), ".3f"), f"{m['step_alloc'] / 1024:.1f}"]


def _memory_section(data) -> tuple:
    return _table_section(data.get("memory"), MEMORY_LEGEND, MEMORY_HEADER, _memory_row)


def _profile_section(data) -> tuple:
    profile, small = data.get("profile") or [], data.get("profile_small") or []
    out = []
    if profile:
        out += ["", format_profile(profile)]
    if small:
        out += ["", format_small_profiles(small)]
    costs = format_costs(list(profile) + list(small))
    if costs:
        out += ["", costs]
    return out, any(p.get("fallback") for p in small)


def _targets_section(data) -> tuple:
    checks = data.get("targets") or []
    if not checks:
        return [], False
    body = [[c["target"], _star(f"{c['measured']:.2f}", c["noisy"]),
             f"{c['op']} {c['limit']:g}", c["samples"] or "-", "met" if c["met"] else "MISSED"]
            for c in checks]
    out = ["", "TARGETS. pairs = undisturbed pairs kept / pairs run.",
           table(["target", "measured", "limit", "pairs", ""], body, left=1),
           f"{sum(c['met'] for c in checks)}/{len(checks)} targets met."]
    profiles = list(data.get("profile") or ()) + list(data.get("profile_small") or ())
    misses = format_misses(checks, data.get("blocks") or [], data.get("kernels") or [],
                           profiles, data.get("thread_ratios") or ())
    if misses:
        out += ["", misses]
    return out, any(c["noisy"] for c in checks)


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
    labels = fwd_bwd_labels(profile)
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
    body.append(["step / floor"] + [fmt(safe_div(p["step"], p["floor"]), ".3f")
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
            share = safe_div(t, p["step_instrumented"])
            return ["-" if n is None else str(n),
                    "-" if not n else _us(t / n), _us(t), fmt(share and 100 * share, ".0f")]

        for label in fwd_bwd_labels(ps) + list(prof.WHOLE):
            body.append([label] + [c for p in ps for c in cells(p, label)])

        def total(label, key, share=True):
            row = [label]
            for p in ps:
                t = p.get(key)
                row += ["", "", _us(t), fmt(share and safe_div(100 * t, p["step_instrumented"]),
                                             ".0f") if share and t is not None else ""]
            return row
        body.append(total("= step, instrumented", "step_instrumented"))
        body.append(total("step, not instrumented", "step", share=False))
        body.append(total("GEMM floor", "floor", share=False))
        body.append(["step / floor"] + [c for p in ps for c in
                                        ["", "", fmt(safe_div(p["step"], p["floor"]), ".2f"), ""]])
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
    body = [[t["block"], t["shape"], fmt(t["step_lo"], ".3f"), fmt(t["step_hi"], ".3f"),
             _star(fmt(t["ratio"], ".2f"), t.get("noisy")), t["source"],
             fmt(t.get("ratio_medians"), ".2f")] for t in ratios]
    lines.append(table(hdr, body, left=2))
    return "\n".join(lines)


def machine_line(m) -> str:
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

