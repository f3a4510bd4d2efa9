"""Candidate selector (spec 5): scores the top-k unary candidates of each slot given the
previous token, so the walk follows a coherent path instead of per-slot argmaxes.

    eta_j      = W_h h_j                                             [R]
    S_j(p, c)  = U_j[c] + sum_r A[p, r] * eta_j[r] * Z[C_j[c], r]

`A` is `predecessor_codebook [V, R]`, `Z` is `successor_codebook [V, R]` (stored without a
`.weight` suffix). Identity init: `Z = 0`, so every score equals its unary logit and a fresh
DFlash2 walks exactly the per-slot argmax path of DFlash v1.
"""

from __future__ import annotations

import torch
from torch import nn



class CandidateSelector(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, rank: int, init_std: float = 0.02):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.init_std = init_std
        self.reset_to_identity()

    @torch.no_grad()
    def reset_to_identity(self) -> None:
        nn.init.normal_(self.hidden_projection.weight, std=self.init_std)
        nn.init.normal_(self.predecessor_codebook, std=self.init_std)
        self.successor_codebook.zero_()

    def gate(self, hidden: torch.Tensor) -> torch.Tensor:
        """Context gate eta: `[..., H] -> [..., R]`."""
        return self.hidden_projection(hidden)

    def scores(
        self, unary: torch.Tensor, cand_ids: torch.Tensor, pred_ids: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """Edge scores with a given predecessor (teacher-forced in training).

        Args:
            unary: `[..., k]` unary logits of the candidates (after multiplier/softcap).
            cand_ids: `[..., k]` candidate token ids.
            pred_ids: `[...]` predecessor token id per slot.
            hidden: `[..., H]` final-normed draft state of the slot.
        Returns:
            `[..., k]` fp32 scores `U + transition`.
        """
        from dflash2.kernels.selector import transition_scores

        eta = self.gate(hidden)
        trans = transition_scores(pred_ids, eta, cand_ids, self.predecessor_codebook, self.successor_codebook)
        return unary.float() + trans
