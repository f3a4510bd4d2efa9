"""Block verification (spec section 8): greedy prefix match and sparse-q speculative sampling.

Obviously-right PyTorch, vectorized over the batch, with no host syncs except the error check.
Row i of ``logits`` scores the token at absolute position ``positions + i``; draft slot i
(``draft_tokens[:, i]``, candidates ``cand_ids[:, i]``, proposal ``q[:, i]``) is tested on row i.

* T = 0: accept the longest prefix with ``draft[i] == argmax(logits[i])`` (ties -> lowest id);
  next token = argmax of row ``accepted``.
* T > 0 (``logits`` already divided by T and filtered): ``p_i = softmax(logits[i])``; accept
  slot i iff ``u_i * q_i(d_i) < p_i(d_i)`` with ``u_i = U(seed, ACCEPT, pos + i, 0)``; stop at
  the first rejection s and draw the next token from the residual ``r = (p_s - q_s)+`` (q
  subtracted only at its k candidate ids; ``r = p_s`` if it is empty), or from ``p_N`` when all
  N were accepted, by the exponential race ``argmax_v r_v / E_v``,
  ``E_v = -log U(seed, TARGET, pos + s, v)``, evaluated in the log domain:
  ``log r_v - log E_v`` with ``log r_v = logits - lse`` off the candidates (exact even where
  ``p_v`` underflows) and ``log((p_c - q_c)+)`` on them.
"""

from __future__ import annotations

import torch

from dflash2.kernels.keyed_random import ACCEPT_STREAM, TARGET_STREAM, keyed_uniform


def bad_rows(logits: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: some logits row of the request has a NaN or a non-finite maximum (all -inf, +inf)."""
    lf = logits.float()
    bad = torch.isnan(lf).any(-1) | ~torch.isfinite(lf.amax(-1))  # [B, N+1]
    return bad.any(-1)


def verify_block_reference(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    cand_ids: torch.Tensor,
    q: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`dflash2.kernels.verify.verify_block`.

    Raises ``ValueError`` on rows with NaN / all -inf / +inf logits, except during CUDA-graph
    capture (no host sync allowed), where such rows get ``accepted = 0, next_token = -1``.
    """
    bsz, n_rows, vocab = logits.shape
    n_draft = n_rows - 1
    dev = logits.device
    bad = bad_rows(logits)  # [B]
    capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing and bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise ValueError(f"verify_block: batch rows {rows} have NaN, all -inf or +inf target logits")

    lf = logits.float()
    sampled = temperature > 0  # [B]
    seeds = seeds.long()
    row_pos = positions.long()[:, None] + torch.arange(n_rows, device=dev)  # [B, N+1]
    argmax = lf.argmax(-1)  # [B, N+1]; first maximum -> lowest id on ties
    lse = torch.logsumexp(lf, -1)  # [B, N+1]

    # Acceptance of each draft slot.
    if n_draft > 0:
        d = draft_tokens.long()  # [B, N]
        p_d = torch.exp(lf[:, :n_draft].gather(-1, d[..., None]).squeeze(-1) - lse[:, :n_draft])
        q_d = (q.float() * (cand_ids.long() == d[..., None])).sum(-1)
        u = keyed_uniform(seeds[:, None], ACCEPT_STREAM, row_pos[:, :n_draft], 0)
        ok = torch.where(sampled[:, None], u * q_d < p_d, d == argmax[:, :n_draft])
        accepted = torch.cumprod(ok.long(), dim=-1).sum(-1)  # length of the accepted prefix
    else:
        accepted = torch.zeros(bsz, dtype=torch.int64, device=dev)

    # Next token from row s = accepted.
    s = accepted
    greedy_next = argmax.gather(1, s[:, None]).squeeze(1)
    l_s = lf.gather(1, s[:, None, None].expand(bsz, 1, vocab)).squeeze(1)  # [B, V]
    lse_s = lse.gather(1, s[:, None])  # [B, 1]
    vocab_ids = torch.arange(vocab, device=dev)
    u_race = keyed_uniform(seeds[:, None], TARGET_STREAM, row_pos.gather(1, s[:, None]), vocab_ids[None, :])
    log_e = torch.log(-torch.log(u_race))  # [B, V]
    p_key = (l_s - log_e) - lse_s  # log p_v - log E_v
    res_key = p_key
    if n_draft > 0:
        has_q = s < n_draft  # rejected inside the block: residual; else bonus from p
        s_c = s.clamp(max=n_draft - 1)
        cand_s = cand_ids.long().gather(1, s_c[:, None, None].expand(-1, 1, cand_ids.shape[-1])).squeeze(1)
        q_s = q.float().gather(1, s_c[:, None, None].expand(-1, 1, q.shape[-1])).squeeze(1)  # [B, k]
        p_c = torch.exp(l_s.gather(1, cand_s) - lse_s)
        r_c = p_c - q_s
        c_key = torch.log(r_c.clamp(min=0.0)) - log_e.gather(1, cand_s)  # log 0 = -inf: no mass
        res_key = p_key.scatter(1, cand_s, torch.where(has_q[:, None], c_key, p_key.gather(1, cand_s)))
    empty = ~(res_key > float("-inf")).any(-1)  # residual has no mass: fall back to p
    key = torch.where(empty[:, None], p_key, res_key)
    race_next = key.argmax(-1)
    next_token = torch.where(sampled, race_next, greedy_next)
    accepted = torch.where(bad, torch.zeros_like(accepted), accepted)
    next_token = torch.where(bad, torch.full_like(next_token, -1), next_token)
    return accepted, next_token
