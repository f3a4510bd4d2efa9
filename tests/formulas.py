"""Explicit loops written straight from the spec's formulas, shared by the tests."""

from __future__ import annotations

import torch


def conv_loop(z, base, proj, side, block_len, g):
    """Spec 4.2, one position and channel at a time, in fp64:
    out[b, i, c] = sum_t [i mod block_len >= t] (base[side, t, c] + proj[b, i, side*K*G + t*G + c//g]) z[b, i-t, c]
    """
    bsz, seq, hidden = z.shape
    taps = base.shape[1]
    groups = hidden // g
    out = torch.zeros(bsz, seq, hidden, dtype=torch.float64)
    for b in range(bsz):
        for i in range(seq):
            for c in range(hidden):
                acc = 0.0
                for t in range(taps):
                    if i % block_len >= t:  # same block: position i - t exists and is in range
                        w = base[side, t, c] + proj[b, i, side * taps * groups + t * groups + c // g]
                        acc += float(w) * float(z[b, i - t, c])
                out[b, i, c] = acc
    return out
