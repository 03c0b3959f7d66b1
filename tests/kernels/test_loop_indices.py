"""Element loops of the compiled kernels index from 0.

A loop ``for k in range(i0, i1): ... x[k] ...`` does not vectorise: to LLVM ``k`` may be
negative, and numba's negative-index fix-up on every access stops the loop vectoriser (the
GLU backward ran at 0.83 ns per element so, 0.17 once sliced). The kernels slice first
(``x = x[i0:i1]``, then ``range(i1 - i0)``). This scans kernels/ for the pattern: a loop over
``range(start, stop)`` with a start other than 0, no loop inside it, and an element read
``x[k]`` by its own variable inside arithmetic. Row loops (``for r in range(i0, i1)``, a
loop over the row's columns inside), block loops and the tails of unrolled loops
(``for i in range(m, n)`` after ``m = n - n % 8``: fewer than 8 elements) are what a start
other than 0 is for.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(ROOT, "kernels")


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id == "jit":
            return True
    return False


def _tail_starts(fn: ast.FunctionDef) -> set:
    """Names assigned an expression with ``%`` (``m = n - n % 8``): where an unrolled
    loop's tail starts."""
    names = set()
    for node in ast.walk(fn):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                        for n in ast.walk(node.value))):
            names.add(node.targets[0].id)
    return names


def _offset_range(loop: ast.For, tails: set) -> bool:
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and len(it.args) >= 2):
        return False
    start = it.args[0]
    if isinstance(start, ast.Name) and start.id in tails:
        return False
    return not (isinstance(start, ast.Constant) and start.value == 0)


def _element_reads(loop: ast.For, var: str) -> list:
    """Lines where ``x[var]`` is read as an operand of arithmetic inside the loop."""
    lines = []
    for node in ast.walk(loop):
        if isinstance(node, (ast.BinOp, ast.AugAssign, ast.UnaryOp, ast.Compare)):
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Load)
                        and isinstance(sub.slice, ast.Name) and sub.slice.id == var):
                    lines.append(sub.lineno)
    return lines


def offending_loops(source: str, name: str = "<src>") -> list:
    """``name:line function`` of every element loop that indexes from an offset."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not (isinstance(fn, ast.FunctionDef) and _is_jit(fn)):
            continue
        tails = _tail_starts(fn)
        for loop in ast.walk(fn):
            if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)
                    and _offset_range(loop, tails)):
                continue
            if any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(loop) if n is not loop):
                continue
            if _element_reads(loop, loop.target.id):
                found.append(f"{name}:{loop.lineno} {fn.name}")
    return found


def test_the_scan_finds_an_offset_element_loop_and_passes_the_others():
    # Check the scan itself: the GLU backward as it was is caught; its sliced form, a row
    # loop, a block loop storing one sum per block and an unrolled loop's tail are not.
    bad = '''
@jit
def k(g, dh, i0, i1):
    for k in range(i0, i1):
        g[k] = g[k] * dh[k]
'''
    good = '''
@jit
def k(g, dh, i0, i1):
    g, dh = g[i0:i1], dh[i0:i1]
    for k in range(i1 - i0):
        g[k] = g[k] * dh[k]

@jit
def rows(x, i0, i1):
    for r in range(i0, i1):
        xr = x[r]
        for j in range(x.shape[1]):
            xr[j] = xr[j] + 1.0

@jit
def blocks(part, x, b0, b1):
    for b in range(b0, b1):
        part[b] = row_sum(x[b * 8:(b + 1) * 8])

@jit
def tail(x):
    n = x.shape[0]
    m = n - n % 8
    s = 0.0
    for i in range(m, n):
        s += x[i]
    return s
'''
    assert offending_loops(bad) == ["<src>:4 k"]
    assert offending_loops(good) == []


def test_no_compiled_kernel_indexes_elements_from_an_offset():
    # Check every kernel module (the generated activation kernels included).
    found = []
    for fname in sorted(os.listdir(KERNELS)):
        if fname.endswith(".py"):
            with open(os.path.join(KERNELS, fname)) as f:
                found += offending_loops(f.read(), fname)
    assert found == [], "element loops from an offset (slice first): " + ", ".join(found)
