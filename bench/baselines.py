"""What the NumPy ufunc chains that the compiled kernels replaced cost per element, measured
once before they were deleted (they are not kept as a second implementation).

``python -m bench.kernel_costs`` on the last commit with the chains (9bc26fb), float32,
2026-11-25 ~17:55 UTC, native OpenBLAS kernel (``env -u OPENBLAS_CORETYPE -u
OPENBLAS_L2_SIZE``), ``BLASNET_NUM_THREADS=1`` and ``=2``, machine shared with four other
sessions (load ~3 on 2 cores): medians of ~0.3 s of calls each, warm caches. Also in
docs/performance.md, "Compiled kernels". ``CASE_OF`` names the bench.kernel_costs case each
``kernels.ops`` entry was measured with; the step profile's report prints the compiled
kernel's ns per element, measured in the bench's own run, beside these.
"""
from __future__ import annotations

# kernel_costs case -> {threads: ns per element}
NS_PER_ELEMENT = {
    "adamw 321k": {1: 1.314, 2: 1.319},
    "adamw 2.1M": {1: 1.922, 2: 1.245},
    "sgd nesterov 321k": {1: 0.785, 2: 0.756},
    "clip_grad_norm 321k": {1: 0.058, 2: 0.057},
    "layernorm fwd 2048x512": {1: 1.549, 2: 0.753},
    "layernorm bwd 2048x512": {1: 1.578, 2: 1.457},
    "gate fwd 1024x512": {1: 0.741, 2: 0.710},          # with one 2 MB copy restoring g
    "gate bwd 1024x512": {1: 0.895, 2: 0.814},          # with three copies restoring g, p, dA
    "softmax fwd 1024x512": {1: 1.279, 2: 1.055},
    "softmax bwd 1024x512": {1: 0.686, 2: 0.955},
    "log_softmax fwd 1024x512": {1: 1.305, 2: 1.205},
    "log_softmax bwd 1024x512": {1: 1.011, 2: 0.799},
    "cross_entropy fwd 1024x512": {1: 1.226, 2: 1.161},
    "cross_entropy bwd 1024x512": {1: 0.214, 2: 0.213},
    "mse fwd+bwd 1024x512": {1: 0.377, 2: 0.411},
    "dropout fwd 1024x512": {1: 2.374, 2: 2.299},
    "dropout bwd 1024x512": {1: 0.126, 2: 0.141},
    "fill_rows res+b 1024x512": {1: 0.156, 2: 0.199},
    "add 1024x512": {1: 0.127, 2: 0.168},
    "sgu_gate fwd 8x128x256": {1: 0.317, 2: 0.309},
    "sgu_gate bwd 8x128x256": {1: 0.543, 2: 0.559},
    "embedding bwd 4096x128": {1: 0.132, 2: 0.132},
}

# kernels.ops entry -> the kernel_costs case that measured its NumPy chain
CASE_OF = {
    "adamw": "adamw 321k",
    "sgd": "sgd nesterov 321k",
    "layernorm_forward": "layernorm fwd 2048x512",
    "layernorm_backward": "layernorm bwd 2048x512",
    "gate_forward": "gate fwd 1024x512",
    "gate_backward": "gate bwd 1024x512",
    "softmax_forward": "softmax fwd 1024x512",
    "softmax_backward": "softmax bwd 1024x512",
    "log_softmax_forward": "log_softmax fwd 1024x512",
    "log_softmax_backward": "log_softmax bwd 1024x512",
    "cross_entropy_forward": "cross_entropy fwd 1024x512",
    "cross_entropy_backward": "cross_entropy bwd 1024x512",
    "mse_forward_backward": "mse fwd+bwd 1024x512",
    "dropout_forward": "dropout fwd 1024x512",
    "dropout_backward": "dropout bwd 1024x512",
    "fill_rows": "fill_rows res+b 1024x512",
    "add": "add 1024x512",
    "sgu_gate_forward": "sgu_gate fwd 8x128x256",
    "sgu_gate_backward": "sgu_gate bwd 8x128x256",
    "embedding_backward": "embedding bwd 4096x128",
}


# The activation kernels' chains, per activation (bench.step_profile.variant names the rows):
# ``python -m bench.activation_cost``'s logic on 9bc26fb, 2026-11-25 18:20 UTC, 1024x128
# float32, 1 thread (docs/performance.md, "Compiled activation kernels"; not measured at 2
# threads). Forward: bias + act in place (relu) or act with act' cached (the others); the
# relu backward recomputes act' in place; "+db" adds the bias gradient's gemv. The cached
# backward is one multiply whatever the activation (measured with GELU's derivative).
ACTIVATION_NS_1THREAD = {
    "bias_act relu": 0.574, "bias_act gelu": 3.148, "bias_act gelu_tanh": 1.788,
    "bias_act silu": 1.887, "bias_act mish": 2.586, "bias_act tanh": 0.771,
    "bias_act sigmoid": 1.606, "bias_act relu2": 0.803, "bias_act leaky_relu": 0.366,
    "act_backward relu": 0.365, "act_backward relu +db": 0.423,
    "act_backward gelu": 2.777, "act_backward gelu_tanh": 1.521, "act_backward silu": 1.669,
    "act_backward_cached": 0.096, "act_backward_cached +db": 0.147,
}


def ns_per_element(op: str, threads: int):
    """The NumPy chain's ns per element for ``kernels.ops`` entry ``op`` (or its per-element
    row, ``bench.step_profile.variant``) at ``threads`` (1 or 2; more threads read the
    2-thread figure), or None when it had no chain here or none was measured at ``threads``."""
    case = CASE_OF.get(op)
    if case is None:
        return ACTIVATION_NS_1THREAD.get(op) if threads <= 1 else None
    return NS_PER_ELEMENT[case].get(min(max(threads, 1), 2))
