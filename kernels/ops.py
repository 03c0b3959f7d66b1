"""The kernels the engine calls on its hot path, by name: ``ops.gemm(...)``, ``ops.bias_act(...)``.

Each entry is an unchecked core (the engine checks arguments once, at its public boundary).
The engine looks entries up here at call time and never binds them at import, so
``kernels.instrument`` can record or time every call by replacing entries for the length of
a ``with`` block. ``NAMES`` lists every entry; a test checks each one exists.
"""
from __future__ import annotations

import numpy as np

from .activations import (act_backward_cached_unchecked, act_backward_unchecked,
                          bias_act_forward_unchecked)
from .dropout import dropout_backward_unchecked, dropout_forward_unchecked
from .gating import gate_backward, gate_forward
from .gemm import gemm_unchecked, gemv_colsum
from .layernorm import layernorm_backward_unchecked, layernorm_forward_unchecked
from .losses import (mse_forward_backward_unchecked,
                     softmax_cross_entropy_backward_unchecked,
                     softmax_cross_entropy_forward_unchecked)
from .optim import adamw_update_many_unchecked, sgd_update_unchecked
from .rows import add, fill_rows

gemm = gemm_unchecked                      # out = alpha op(a) op(b) + beta out
colsum = gemv_colsum                       # out = x.sum(0) + beta out
bias_act = bias_act_forward_unchecked      # z += bias; h = act(z) (grad = act'(z))
act_backward = act_backward_unchecked      # dz = dh * act'(z), act' recomputed (db += dz.sum(0))
act_backward_cached = act_backward_cached_unchecked  # dz = dh * grad (db += dz.sum(0))
dropout_forward = dropout_forward_unchecked
dropout_backward = dropout_backward_unchecked
layernorm_forward = layernorm_forward_unchecked
layernorm_backward = layernorm_backward_unchecked
mse_forward_backward = mse_forward_backward_unchecked
cross_entropy_forward = softmax_cross_entropy_forward_unchecked
cross_entropy_backward = softmax_cross_entropy_backward_unchecked
adamw = adamw_update_many_unchecked
sgd = sgd_update_unchecked

NAMES = ("gemm", "colsum", "bias_act", "act_backward", "act_backward_cached",
         "dropout_forward", "dropout_backward", "layernorm_forward", "layernorm_backward",
         "gate_forward", "gate_backward", "fill_rows", "add", "mse_forward_backward",
         "cross_entropy_forward", "cross_entropy_backward", "adamw", "sgd")

del np

# --- row-wise softmax, gated FFN, spatial gating unit, embedding -----------------------------
from .embedding import embedding_backward_unchecked, embedding_forward_unchecked  # noqa: E402
from .glu import (fill_by_row_unchecked, glu_backward_unchecked,  # noqa: E402
                  glu_forward_unchecked, rowsum_unchecked)
from .softmax import (log_softmax_backward_unchecked,  # noqa: E402
                      log_softmax_forward_unchecked, softmax_backward_unchecked,
                      softmax_forward_unchecked)
from .token_mix import (causal_grad_add_unchecked, causal_weight_unchecked,  # noqa: E402
                        sgu_gate_backward_unchecked, sgu_gate_forward_unchecked,
                        swap01_unchecked)

softmax_forward = softmax_forward_unchecked            # y = softmax(x) per row
softmax_backward = softmax_backward_unchecked          # dx = y (dy - sum dy y)
log_softmax_forward = log_softmax_forward_unchecked    # y = x - logsumexp(x) per row
log_softmax_backward = log_softmax_backward_unchecked  # dx = dy - exp(y) sum dy
glu_forward = glu_forward_unchecked                    # h = act(g) u; g, u = act'(g) u, act(g)
glu_backward = glu_backward_unchecked                  # g, u *= dh
fill_by_row = fill_by_row_unchecked                    # out[i, :] = v[i]
rowsum = rowsum_unchecked                              # out = x.sum(1) + beta out
swap01 = swap01_unchecked                              # out[i, j] = x[j, i]
sgu_gate_forward = sgu_gate_forward_unchecked          # a = u * (swap01(s_tm) + bias)
sgu_gate_backward = sgu_gate_backward_unchecked        # dS in s_tm, du, dbias of a = u * s
causal_weight = causal_weight_unchecked                # out = w * mask
causal_grad_add = causal_grad_add_unchecked            # dw += g * mask
embedding_forward = embedding_forward_unchecked        # out[i] = weight[ids[i]] (+ res[i])
embedding_backward = embedding_backward_unchecked      # dweight[ids[i]] += dout[i]

NAMES += ("softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
          "glu_forward", "glu_backward", "fill_by_row", "rowsum", "swap01", "sgu_gate_forward",
          "sgu_gate_backward", "causal_weight", "causal_grad_add", "embedding_forward",
          "embedding_backward")

# --- multi-head attention layouts -----------------------------------------------------------
from .attention import (causal_fill_unchecked, heads_merge_unchecked,  # noqa: E402
                        heads_split_unchecked)

heads_split = heads_split_unchecked    # (B, T, M*d) rows -> (M, B, H, T, dh) head-major
heads_merge = heads_merge_unchecked    # (M, B, H, T, dh) head-major -> (B, T, M*d) rows
causal_fill = causal_fill_unchecked    # s[p, i, j > i] = value

NAMES += ("heads_split", "heads_merge", "causal_fill")

# --- compiled scaled dot-product attention over all (batch, head) pairs -----------------------
from .sdpa import sdpa_backward_unchecked, sdpa_forward_unchecked  # noqa: E402

sdpa_forward = sdpa_forward_unchecked    # O rows = softmax(q k^T scale + mask) v; P kept
sdpa_backward = sdpa_backward_unchecked  # d[q | k | v] rows from dO rows, P, qkv

NAMES += ("sdpa_forward", "sdpa_backward")
