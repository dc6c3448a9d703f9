"""deltanet.c on torch tensors: the Gated DeltaNet rows of a forward (convolution, gates, delta-rule state
update, gated norm) in one call per layer, and the gated attention's output gate. Both are row-wise in a fixed
order (see deltanet.c); model/deltanet.py has the torch version of the same arithmetic for machines without
the library (SPECDEC_NO_DELTANET_KERNEL=1 turns it off)."""

from __future__ import annotations

from functools import lru_cache

import torch

from specdec.model.kernels.libraries import F32, I32, I64, P, load


@lru_cache(maxsize=1)
def deltanet():
    """The loaded library (ctypes.CDLL), or None (`kernels.why_unavailable("deltanet")`)."""
    return load("deltanet", {"deltanet_rows": [I64] * 6 + [I32, F32, I32] + [P] * 12,
                             "sigmoid_mul": [P, P, I64]}, off="SPECDEC_NO_DELTANET_KERNEL")


def deltanet_rows(sizes: tuple[int, int, int, int, int], tiled: bool, eps: float, mixed: torch.Tensor,
                  z: torch.Tensor, ba: torch.Tensor, conv_w: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor,
                  norm_w: torch.Tensor, conv_in: torch.Tensor, conv_out: torch.Tensor, state_in: torch.Tensor,
                  state_out: torch.Tensor) -> torch.Tensor:
    """n rows through deltanet.c -> (n, nv * dv) float32, the gated norm of each row's output.

    sizes: (nk, nv, dk, dv, K); mixed (n, conv_dim), z (n, nv * dv), ba (n, 2 * nv): float32, contiguous;
    conv_w (conv_dim, K), dt_bias, A (nv,), norm_w (dv,); conv_in, conv_out, state_in, state_out: (n,) int64
    addresses of each row's convolution window and recurrent state, read and written (see deltanet.c).
    """
    nk, nv, dk, dv, K = sizes
    n = mixed.shape[0]
    out = torch.empty(n, nv * dv)
    tensors = [t.contiguous() for t in (mixed, z, ba, conv_w, dt_bias, A, norm_w)]
    deltanet().deltanet_rows(n, nk, nv, dk, dv, K, int(tiled), eps, torch.get_num_threads(),
                             *(t.data_ptr() for t in tensors),
                             *(t.data_ptr() for t in (conv_in, conv_out, state_in, state_out)), out.data_ptr())
    return out


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) for float32 tensors of one shape (deltanet.c, elementwise)."""
    out = x.contiguous().clone()
    gate = gate.contiguous()
    deltanet().sigmoid_mul(out.data_ptr(), gate.data_ptr(), out.numel())
    return out
