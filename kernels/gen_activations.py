"""Generates kernels/_activation_kernels.py: every fused activation kernel, for every entry of
kernels.activation_pairs.REGISTRY, in float32 and float64, from the entry's scalar pair.

Run ``python -m kernels.gen_activations`` after changing a pair, kernels.fmath or this file;
a test checks that the committed module is what this writes. Kernels are generated source,
not closures over a factory: numba keys its disk cache on a closure's captured function, so
a factory's kernels would compile again in every process; these load from the cache.

Each pair becomes two scalar functions by rewriting its syntax tree: float32's constants
become ``np.float32(...)`` (a Python float would turn the whole expression float64), module
constants are inlined by value, and ``exp``/``tanh``/``ndtr`` become the dtype's function of
kernels.fmath. The loop kernels call those scalar functions; LLVM inlines and vectorises
them. The module's header holds a digest of the three sources it is made from: numba's
cache checks only the kernel's own file, so a change in fmath reaches the kernels through a
regenerated (hence newer) module.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import os
import re
import sys
import textwrap

from . import activation_pairs as P
from . import fmath

__all__ = ["generate", "main", "PATH", "KERNEL_NAMES"]

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_activation_kernels.py")
DTYPES = (("f32", "np.float32"), ("f64", "np.float64"))

# Flat loops are sliced so their index starts at 0 and the column-sum loops use unsigned
# offsets: numba adds a negative-index fix-up to signed indices it cannot prove
# non-negative, and that stops the vectoriser.
# What each generated kernel computes, in the order of the Kernels tuple. ``v`` is the
# element, F and D the pair; rows [i0, i1) (flat: elements i0*d .. i1*d) or columns [j0, j1).
KERNEL_NAMES = ("fwd", "fwd_ip", "fwd_gz", "bwd", "bwd_ip", "bwd_db", "bwd_ip_db", "glu")

_TEMPLATE = '''
@jit
def fwd_{a}_{t}(h, z, i0, i1, slope):
    """h = act(z), rows [i0, i1)."""{cast}
    d = z.shape[1]
    hf, zf = h.reshape(-1)[i0 * d:i1 * d], z.reshape(-1)[i0 * d:i1 * d]
    for k in range(zf.size):
        v = zf[k]
        @F(v) -> a
        hf[k] = a


@jit
def fwd_ip_{a}_{t}(z, b, i0, i1, slope):
    """z = act(z + b), rows [i0, i1)."""{cast}
    d = z.shape[1]
    for i in range(i0, i1):
        zi = z[i]
        for j in range(d):
            v = zi[j] + b[j]
            @F(v) -> a
            zi[j] = a


@jit
def fwd_gz_{a}_{t}(h, z, b, i0, i1, slope):
    """h = act(z + b), z = act'(z + b), rows [i0, i1)."""{cast}
    d = z.shape[1]
    for i in range(i0, i1):
        hi, zi = h[i], z[i]
        for j in range(d):
            v = zi[j] + b[j]
            @F(v) -> a
            @D(v) -> g
            hi[j] = a
            zi[j] = g


@jit
def bwd_{a}_{t}(dz, dh, z, i0, i1, slope):
    """dz = dh act'(z), rows [i0, i1)."""{cast}
    d = z.shape[1]
    dzf, dhf = dz.reshape(-1)[i0 * d:i1 * d], dh.reshape(-1)[i0 * d:i1 * d]
    zf = z.reshape(-1)[i0 * d:i1 * d]
    for k in range(zf.size):
        v = zf[k]
        @D(v) -> g
        dzf[k] = dhf[k] * g


@jit
def bwd_ip_{a}_{t}(dh, z, i0, i1, slope):
    """dh *= act'(z), rows [i0, i1)."""{cast}
    d = z.shape[1]
    dhf, zf = dh.reshape(-1)[i0 * d:i1 * d], z.reshape(-1)[i0 * d:i1 * d]
    for k in range(zf.size):
        v = zf[k]
        @D(v) -> g
        dhf[k] = dhf[k] * g


@jit
def bwd_db_{a}_{t}(dz, dh, z, db, acc, part, j0, j1, slope):
    """dz = dh act'(z) and db += dz.sum(0) over columns [j0, j1): each column summed in blocks of
    ROWS rows in the dtype (part), the block sums in float64 (acc), all in row order."""{cast}
    n, d = z.shape
    m = j1 - j0
    dzf, dhf, zf = dz.reshape(-1), dh.reshape(-1), z.reshape(-1)
    accs, parts = acc[j0:j1], part[j0:j1]
    for j in range(m):
        accs[j] = 0.0
    for r0 in range(0, n, ROWS):
        for j in range(m):
            parts[j] = 0.0
        for i in range(r0, min(r0 + ROWS, n)):
            base = np.uint64(i * d + j0)
            for j in range(m):
                k = base + np.uint64(j)
                x = zf[k]
                @D(x) -> g
                v = dhf[k] * g
                dzf[k] = v
                parts[j] += v
        for j in range(m):
            accs[j] += parts[j]
    dbs = db[j0:j1]
    for j in range(m):
        dbs[j] += accs[j]


@jit
def bwd_ip_db_{a}_{t}(dh, z, db, acc, part, j0, j1, slope):
    """dh *= act'(z) and db += dh.sum(0) over columns [j0, j1): each column summed in blocks of
    ROWS rows in the dtype (part), the block sums in float64 (acc), all in row order."""{cast}
    n, d = z.shape
    m = j1 - j0
    dhf, zf = dh.reshape(-1), z.reshape(-1)
    accs, parts = acc[j0:j1], part[j0:j1]
    for j in range(m):
        accs[j] = 0.0
    for r0 in range(0, n, ROWS):
        for j in range(m):
            parts[j] = 0.0
        for i in range(r0, min(r0 + ROWS, n)):
            base = np.uint64(i * d + j0)
            for j in range(m):
                k = base + np.uint64(j)
                x = zf[k]
                @D(x) -> g
                v = dhf[k] * g
                dhf[k] = v
                parts[j] += v
        for j in range(m):
            accs[j] += parts[j]
    dbs = db[j0:j1]
    for j in range(m):
        dbs[j] += accs[j]


@jit
def glu_{a}_{t}(h, g, u, i0, i1, slope):
    """h = act(g) u, g = act'(g) u, u = act(g), flat elements [i0, i1)."""{cast}
    hf, gf, uf = h.reshape(-1)[i0:i1], g.reshape(-1)[i0:i1], u.reshape(-1)[i0:i1]
    for k in range(gf.size):
        v = gf[k]
        @F(v) -> a
        @D(v) -> g
        w = uf[k]
        hf[k] = a * w
        gf[k] = g * w
        uf[k] = a
'''

_HEADER = '''"""Generated by kernels/gen_activations.py from kernels/activation_pairs.py and kernels/fmath.py
(sources {digest}). Do not edit: change the pair and run ``python -m kernels.gen_activations``.

For each activation and dtype: the fused loops, with the scalar pair (f: act, d: act')
inlined as source (kernels.activations and kernels.glu run them on row slices).
"""
from collections import namedtuple
import math  # noqa: F401  (the float64 pairs may use it)

import numpy as np

from . import fmath as fm
from .jit import jit

Kernels = namedtuple("Kernels", {names!r})

# Rows per float32 block of the column sums: a float64 accumulator in the loop would halve
# its vector width; one per block of rows keeps the error at ~ROWS float32 roundings.
ROWS = 32
'''


def _digest() -> str:
    h = hashlib.sha256()
    for mod in (P, fmath, sys.modules[__name__]):
        with open(mod.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _constants(module) -> dict:
    return {k: float(v) for k, v in vars(module).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


_F32_CONSTANTS: dict = {}  # value -> name of its np.float32 module constant, in first-use order


def _f32_constant(v: float) -> str:
    name = _F32_CONSTANTS.get(v)
    if name is None:
        name = _F32_CONSTANTS[v] = f"_C{len(_F32_CONSTANTS)}"
    return name


class _Rewrite(ast.NodeTransformer):
    """A pair's function body for one dtype (see the module docstring)."""

    def __init__(self, where: str, dtype_index: int, consts: dict, args: set):
        self.where, self.i, self.consts, self.args = where, dtype_index, consts, args
        self.locals: set = set()

    def _number(self, v: float):
        if self.i == 0:  # a module constant: numba types a global at once, a call costs more
            return ast.Name(_f32_constant(float(v)), ast.Load())
        return ast.Constant(float(v))

    def visit_Constant(self, node):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"{self.where}: unsupported constant {node.value!r}")
        return self._number(node.value)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Store):
            self.locals.add(node.id)
            return node
        if node.id in self.args or node.id in self.locals:
            return node
        if node.id in self.consts:
            return self._number(self.consts[node.id])
        raise ValueError(f"{self.where}: {node.id!r} is not an argument, a local, a numeric "
                         f"module constant or a primitive ({', '.join(fmath.PRIMITIVES)})")

    def visit_BinOp(self, node):
        if isinstance(node.op, ast.Pow):
            raise ValueError(f"{self.where}: '**' is a libm pow call; multiply instead")
        return self.generic_visit(node)

    def visit_Call(self, node):
        fn = node.func
        if not isinstance(fn, ast.Name) or node.keywords:
            raise ValueError(f"{self.where}: only calls of abs and {tuple(fmath.PRIMITIVES)} "
                             f"with positional arguments are supported")
        node.args = [self.visit(a) for a in node.args]
        if fn.id == "abs":
            return node
        if fn.id not in fmath.PRIMITIVES:
            raise ValueError(f"{self.where}: call of {fn.id!r}: expected abs or one of "
                             f"{tuple(fmath.PRIMITIVES)}")
        node.func = ast.Attribute(ast.Name("fm", ast.Load()), fmath.PRIMITIVES[fn.id][self.i],
                                  ast.Load())
        return node


def _body(fn, dtype_index: int):
    """The pair ``fn`` translated for a dtype: (assignments, returned expression, locals)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    f = tree.body[0]
    if not isinstance(f, ast.FunctionDef) or [a.arg for a in f.args.args] != ["z", "slope"]:
        raise ValueError(f"{fn.__name__}: expected a function of (z, slope)")
    body = f.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    rw = _Rewrite(fn.__name__, dtype_index, _constants(P), {"z", "slope"})
    stmts = [rw.visit(stmt) for stmt in body]
    for st in stmts[:-1]:
        if not (isinstance(st, ast.Assign) and all(isinstance(t, ast.Name) for t in st.targets)):
            raise ValueError(f"{fn.__name__}: expected assignments to names, then one return")
    if not stmts or not isinstance(stmts[-1], ast.Return) or stmts[-1].value is None:
        raise ValueError(f"{fn.__name__}: expected assignments to names, then one return")
    if rw.locals & {"z", "slope"}:
        raise ValueError(f"{fn.__name__}: assigns to its argument")
    return stmts[:-1], stmts[-1].value, rw.locals


def _inline(fn, dtype_index: int, arg: str, out: str, prefix: str, indent: str) -> list:
    """Source lines computing ``out = fn(arg, slope)`` in place of a call: the pair's body with
    its locals prefixed. Inlined as source, the kernels cost numba no inlining pass and LLVM
    sees one loop body to vectorise (a called pair of any size may stay a call)."""
    stmts, ret, names = _body(fn, dtype_index)
    rename = {n: prefix + n for n in names}
    rename["z"] = arg

    class _Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = rename.get(node.id, node.id)
            return node

    lines = [indent + ast.unparse(_Rename().visit(st)) for st in stmts]
    return lines + [indent + f"{out} = " + ast.unparse(_Rename().visit(ret))]


def _scalar(fn, new_name: str, dtype_index: int) -> str:
    """The pair ``fn`` as a stand-alone function for a dtype (what the kernels inline)."""
    return "\n".join([f"def {new_name}(z, slope):"]
                     + _inline(fn, dtype_index, "z", "out", "", "    ") + ["    return out", ""])


_MARK = re.compile(r"^(\s*)@([FD])\((\w+)\) -> (\w+)$")


def _expand(text: str, entry, dtype_index: int) -> str:
    out = []
    for line in text.split("\n"):
        m = _MARK.match(line)
        if m is None:
            out.append(line)
            continue
        indent, which, arg, res = m.groups()
        fn = entry.forward if which == "F" else entry.derivative
        out.extend(_inline(fn, dtype_index, arg, res, which.lower() + "_", indent))
    return "\n".join(out)


def generate() -> str:
    """The text of kernels/_activation_kernels.py for the current pairs."""
    _F32_CONSTANTS.clear()
    out = []
    table = []
    for name, entry in P.REGISTRY.items():
        out.append(f"\n\n# {'-' * 77} {name}")
        for i, (t, np_type) in enumerate(DTYPES):
            cast = "\n    slope = np.float32(slope)" if t == "f32" else ""
            out.append(_expand(_TEMPLATE.format(a=name, t=t, cast=cast), entry, i).rstrip("\n"))
            table.append(f"    ({name!r}, np.dtype({np_type})): Kernels("
                         + ", ".join(f"{k}_{name}_{t}" for k in KERNEL_NAMES) + "),")
    out.append("\n\n\n# (name, dtype) -> the kernels of that activation\nKERNELS = {\n"
               + "\n".join(table) + "\n}\n")
    consts = "".join(f"{n} = np.float32({v!r})\n" for v, n in _F32_CONSTANTS.items())
    return (_HEADER.format(digest=_digest(), names=KERNEL_NAMES)
            + "\n# float32 constants of the pairs\n" + consts + "".join(out))


def main(argv=None) -> int:
    text = generate()
    with open(PATH, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {PATH} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
