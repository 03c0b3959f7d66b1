"""blasnet kernels: free functions over arrays the caller owns.

Every kernel writes into output arrays it is given (outputs first, then inputs, then
options) and allocates nothing on the hot path. Each checked public function has an
``*_unchecked`` core for callers (the engine) that own pre-checked buffers.
``kernels.reference`` holds a naive NumPy version of each one: the oracle for tests and the
baseline for benchmarks.
"""
from . import threads  # noqa: F401  (first: sets OpenBLAS's thread timeout before it loads)
from . import reference
from .activations import (ACTIVATIONS, act_backward, act_backward_cached,
                          act_backward_cached_unchecked, act_backward_unchecked, bias_act_forward,
                          bias_act_forward_unchecked, bias_grad, bias_grad_unchecked)
from .dropout import (dropout_backward, dropout_backward_unchecked, dropout_forward,
                      dropout_forward_unchecked)
from .gemm import check_array, gemm, gemm_unchecked, gemv_colsum
from .memory import aligned_empty
from .layernorm import (layernorm_backward, layernorm_backward_unchecked, layernorm_forward,
                        layernorm_forward_unchecked)
from .losses import (mse_backward, mse_backward_unchecked, mse_forward, mse_forward_unchecked,
                     softmax_cross_entropy_backward, softmax_cross_entropy_backward_unchecked,
                     softmax_cross_entropy_forward, softmax_cross_entropy_forward_unchecked)
from .optim import (adamw_consts, adamw_update, adamw_update_many, adamw_update_many_unchecked,
                    adamw_update_unchecked, flat_view, sgd_update, sgd_update_unchecked)
from .threads import ENV_VAR, blas_info, get_num_threads, num_threads, set_num_threads

__all__ = [name for name in dir() if not name.startswith("_")]
