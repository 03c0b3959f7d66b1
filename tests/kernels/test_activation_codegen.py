"""kernels.gen_activations: the committed kernel module is what the generator writes, the
generator refuses pairs it cannot translate, float32 kernels are vectorised, and
NUMBA_DISABLE_JIT runs the same kernels as Python."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from probes import vector_register

from kernels import activations as A
from kernels import gen_activations as G
from kernels.jit import OPTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_committed_module_is_current():
    # Check that kernels/_activation_kernels.py is exactly what the generator writes from the
    # current pairs, fmath and generator (regenerate: python -m kernels.gen_activations).
    with open(G.PATH, encoding="utf-8") as f:
        committed = f.read()
    assert committed == G.generate(), "stale: run python -m kernels.gen_activations"


def test_every_entry_has_generated_kernels_of_both_dtypes():
    # Check that the generated table has each registry entry's kernels, one per name in
    # KERNEL_NAMES, for float32 and float64 (and nothing the registry lacks).
    from kernels import _activation_kernels as K
    assert set(K.KERNELS) == {(n, np.dtype(t)) for n in A.ACTIVATIONS
                              for t in (np.float32, np.float64)}
    for kern in K.KERNELS.values():
        assert kern._fields == G.KERNEL_NAMES


def _pair_source(body):
    return textwrap.dedent(body)


@pytest.mark.parametrize("body, words", [
    ("def bad(z, slope):\n    return z ** 2\n", r"\*\*"),
    ("def bad(z, slope):\n    return math.exp(z)\n", "call"),
    ("def bad(z, slope):\n    return max(z, 0.0)\n", "max"),
    ("def bad(z, slope):\n    return z * unknown_name\n", "unknown_name"),
    ("def bad(z, slope):\n    return 'a'\n", "constant"),
    ("def bad(z):\n    return z\n", "z, slope"),
])
def test_untranslatable_pair_is_an_error(tmp_path, monkeypatch, body, words):
    # Check that a pair using something the float32 translation cannot keep (pow, libm,
    # min/max, an unknown global, a non-numeric constant, a wrong signature) is refused by
    # name instead of generating a kernel that silently computes in float64 or calls libm.
    import inspect
    namespace = {}
    exec(compile(body, "<pair>", "exec"), namespace)
    fn = namespace["bad"]
    monkeypatch.setattr(inspect, "getsource", lambda f: body)
    with pytest.raises(ValueError, match=words):
        G._scalar(fn, "_f_bad_f32", 0)


def test_float32_constants_stay_float32():
    # Check that the float32 translation turns every constant into a float32 module constant
    # (a Python float would promote the whole expression to float64), maps the primitives to
    # their float32 versions, and that the generated module defines those constants.
    import re as _re
    from kernels import _activation_kernels as K
    src = G._scalar(A.REGISTRY["gelu"].derivative, "_d_probe_f32", 0)
    assert "fm.ndtr_f32" in src and "fm.exp_f32" in src
    assert not _re.search(r"(?<![\w.])\d", src.replace("_d_probe_f32", "")), src  # no literal
    for name in _re.findall(r"_C\d+", src):
        assert type(getattr(K, name)) is np.float32
    src64 = G._scalar(A.REGISTRY["gelu"].derivative, "_d_probe_f64", 1)
    assert "_C" not in src64 and "0.5" in src64 and "fm.ndtr_f64" in src64


def _fresh(kernel):
    """The kernel compiled anew without the disk cache (numba does not disassemble cached
    code)."""
    opts = {k: v for k, v in OPTIONS.items() if k != "cache"}
    return numba.jit(**opts)(kernel.py_func)


@pytest.mark.parametrize("act, kind", [("gelu", "fwd_gz"), ("silu", "bwd_ip"),
                                       ("relu", "fwd_ip"), ("gelu_tanh", "bwd_ip_db"),
                                       ("mish", "glu"), ("tanh", "fwd_ip")])
def test_float32_kernels_are_vectorised(act, kind):
    # Check that the float32 loops run on vector registers: zmm where the CPU has AVX-512,
    # else ymm with AVX2 (a libm call or a float64 promotion in the loop would make them
    # scalar, or halve their width).
    reg = vector_register()
    f32 = np.float32
    z = np.ones((4, 40), f32)
    args = {"fwd_ip": (z, np.zeros(40, f32), 0, 4, 0.01),
            "fwd_gz": (np.empty_like(z), z, np.zeros(40, f32), 0, 4, 0.01),
            "bwd_ip": (np.empty_like(z), z, 0, 4, 0.01),
            "bwd_ip_db": (np.ones_like(z), z, np.zeros(40, f32), np.zeros(40), np.zeros(40, f32),
                          0, 40, 0.01),
            "glu": (np.empty_like(z), np.ones_like(z), np.ones_like(z), 0, 160, 0.01)}[kind]
    k = _fresh(getattr(A.kernels_for(act, np.dtype(f32)), kind))
    k(*args)
    asm = k.inspect_asm(k.signatures[0])
    assert reg in asm, f"{act}.{kind}: no {reg} registers"
    # every transcendental inlined into the loop: no call of libm or of kernels.fmath
    calls = [line for line in asm.splitlines() if "call" in line]
    assert not [c for c in calls if re.search(r"tanh|exp|erf|ndtr", c)], calls


def test_disable_jit_runs_the_kernels_as_python(tmp_path):
    # Check that with NUMBA_DISABLE_JIT=1 the same kernels run as plain Python functions and
    # give the reference's results (forward with grad and bias, backward with db, GLU).
    code = textwrap.dedent("""
        import numpy as np
        from kernels import activations as A, glu, reference as R
        rng = np.random.default_rng(0)
        ok = []
        for dt in (np.float32, np.float64):
            tol = 2e-5 if dt == np.float32 else 1e-12
            z = rng.standard_normal((3, 5)).astype(dt)
            b = rng.standard_normal(5).astype(dt)
            h, g = np.empty_like(z), z.copy()
            A.bias_act_forward(h, g, b, "gelu", grad=g)
            zb = (z + b).astype(np.float64)
            ok.append(np.allclose(h, R.gelu(zb), rtol=tol, atol=tol))
            ok.append(np.allclose(g, R.gelu_grad(zb), rtol=tol, atol=tol))
            db = np.zeros(5, dt)
            dz = A.act_backward(np.empty_like(z), z, z, "silu", db=db)
            ok.append(np.allclose(dz, z * R.silu_grad(z.astype(np.float64)), rtol=tol, atol=tol))
            ok.append(np.allclose(db, dz.astype(np.float64).sum(0), rtol=tol, atol=tol))
            gg, uu, hh = z.copy(), z[::-1].copy(), np.empty_like(z)
            glu.glu_forward(hh, gg, uu, "silu")
            ok.append(np.allclose(hh, R.silu(z.astype(np.float64)) * z[::-1], rtol=tol, atol=tol))
        print(type(A.kernels_for("gelu", np.dtype(np.float32)).fwd_ip).__name__, all(ok))
        """)
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["function", "True"]
