"""blasnet kernels: free functions over arrays the caller owns.

Every kernel writes into output arrays it is given (outputs first, then inputs, then
options) and allocates nothing on the hot path. ``kernels.reference`` holds a naive NumPy
version of each one: the oracle for tests and the baseline for benchmarks.
"""
from . import reference
from .activations import ACTIVATIONS, act_backward, bias_act_forward, bias_grad
from .dropout import dropout_backward, dropout_forward
from .gemm import check_array, gemm, gemm_unchecked, gemv_colsum
from .layernorm import layernorm_backward, layernorm_forward
from .losses import (mse_backward, mse_forward, softmax_cross_entropy_backward,
                     softmax_cross_entropy_forward)
from .optim import adamw_update, sgd_update
from .threads import ENV_VAR, blas_info, get_num_threads, num_threads, set_num_threads

__all__ = [
    "ACTIVATIONS", "ENV_VAR", "act_backward", "adamw_update", "bias_act_forward", "bias_grad",
    "blas_info", "check_array", "dropout_backward", "dropout_forward", "gemm", "gemm_unchecked",
    "gemv_colsum", "get_num_threads", "layernorm_backward", "layernorm_forward", "mse_backward",
    "mse_forward", "num_threads", "reference", "set_num_threads", "sgd_update",
    "softmax_cross_entropy_backward", "softmax_cross_entropy_forward",
]
