"""`make bench`'s account of each missed target: where its time goes (the step profile's
parts against the GEMM floor, the thread ratios), as text under the report."""
from __future__ import annotations

import textwrap

from bench import bandwidth
from bench.analysis import fmt, fwd_bwd_labels, safe_div
from bench.targets import ADAMW_BANDWIDTH_MIN, ADAMW_CHAIN_SPEEDUP_MIN, ADAMW_SPEEDUP_MIN

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
            parts = fwd_bwd_labels([p])
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
                text += (f": step {fmt(t['step_lo'], '.3f')} ms at {t['lo']} thread, "
                         f"{fmt(t['step_hi'], '.3f')} ms at {t['hi']}")
            a = by_case.get((block, c["shape"], t["lo"] if t else 1))
            if a and p:
                labels = fwd_bwd_labels([a, p]) + list(prof.WHOLE)
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
                text += (f": {fmt(k['fast_ms'], '.2f')} ms vs {fmt(k['ref_ms'], '.2f')} ms "
                         f"naive; a {ADAMW_SPEEDUP_MIN:g}x speed-up needs <= "
                         f"{fmt(safe_div(k['ref_ms'], ADAMW_SPEEDUP_MIN), '.2f')} ms")
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
                text += (f": {fmt(k['ns_per_param'], '.3f')} ns per parameter vs the chain's "
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
                text += (f": {fmt(k['fast_ms'], '.2f')} ms = {fmt(k['gbs'], '.1f')} GB/s vs "
                         f"the triad's {fmt(t['gbs'], '.1f')} GB/s; "
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
