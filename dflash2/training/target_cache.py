"""Memoized target passes for small datasets (`train.cache_target=true`).

The frozen target's outputs for a packed training sequence (context features and the teacher's
next-token argmax) never change, but the trainer recomputes them at every visit. On a GPU that
is a small share of the step; on a CPU with a small dataset trained for many epochs it is most
of it (SmolLM2-135M: ~0.27 GFLOP per token, against a one-layer draft's few MFLOP). This cache
runs the target once per sequence, on that sequence alone, and keeps its outputs on the host;
later visits only pad and stack. Outputs depend on the sequence alone (never on its batch
neighbours or padding), so a resumed run recomputes exactly what the killed run had cached.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch


class TargetPassCache:
    """`outputs(keys, samples, seq_len)` -> the target pass of a padded batch, from cache.

    Args:
        compute: `compute(batch_of_one) -> dict[str, Tensor [1, S, ...]]` (the trainer's
            `target_pass` with its layer ids bound); run under `no_grad`.
        device: where the stacked batch goes.
    """

    def __init__(self, compute: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]], device):
        self.compute = compute
        self.device = torch.device(device)
        self._store: dict[Hashable, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._store)

    def _one(self, key: Hashable, sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if key not in self._store:
            batch = {k: v[None].to(self.device) for k, v in sample.items()}
            with torch.no_grad():
                out = self.compute(batch)
            self._store[key] = {k: v[0].detach().cpu() for k, v in out.items()}
        return self._store[key]

    def outputs(self, keys: Sequence[Hashable], samples: Sequence[dict[str, torch.Tensor]],
                seq_len: int) -> dict[str, torch.Tensor]:
        """Stack the cached outputs of `samples` (identified by `keys`), right-padded with zeros to
        `seq_len` positions (padding positions carry no loss and no anchors)."""
        per = [self._one(k, s) for k, s in zip(keys, samples)]
        out = {}
        for key in per[0]:
            rows = []
            for p in per:
                v = p[key]
                pad = seq_len - v.shape[0]
                rows.append(torch.nn.functional.pad(v, (0, 0) * (v.dim() - 1) + (0, pad)) if pad else v)
            out[key] = torch.stack(rows).to(self.device)
        return out
