"""Verify policies of `speculative_generate` (`verify="chain" | "adaptive" | "tree"`).

Each step drafts N tokens and the target scores the whole block `[anchor, d_1..d_N]` in one
forward (fixed shapes: the CUDA graphs capture that width). The policy decides, per row b and
step k, how many of the drafted tokens the step may accept, its verify length `L_k[b]`:

- `"chain"` (default): `L = N` at every step; the step is `verify_block` over the whole block.
- `"adaptive"`: `L_k[b]` in `1..N`, a function of row b's earlier steps only (lagged acceptance):

      L_1     = N
      L_{k+1} = min(N, L_k + ADAPTIVE_GROW)     if a_k == L_k  (every verified token accepted)
              = max(1, L_k - ADAPTIVE_SHRINK)   otherwise      (a rejection among the L_k)

  where `a_k` is the count step k accepted (at most `L_k`). This is transformers' "heuristic"
  schedule of assisted generation's draft length, per row. With N = 0 (the AR arm) there is
  nothing to verify: every length is 0 under either policy.

A length L is applied by truncating acceptance, not by changing shapes (`verify_within`): the
step still scores all N + 1 block rows, then accepts `min(a, L)` drafted tokens, and a row whose
first L tokens were all accepted takes the bonus token drawn from the target at block row L.
That is, bit for bit, `verify_block` on the truncated block `[anchor, d_1..d_L]`: the target is
causal, so block rows 0..L do not depend on the tokens after d_L; the acceptance test of slot i
and the residual draw at a rejection depend only on slot i, its logits row and the keyed noise
of its absolute position, never on N; and the bonus draw at row L is keyed by that row's
position, as in a block of L.

Why adaptive is lossless: speculative sampling with a block of any length fixed before the
step's verification emits tokens that follow the target's law given the committed prefix
(greedy: its argmax path), whatever else happened before the step, because the step's draft,
acceptance and resampling noise is keyed by positions past the committed length, which no
earlier outcome read, so it is independent of what chose L. `L_k[b]` is a function of
`a_1..a_{k-1}` of row b (each `a` counts only the tests of its own L slots), all fixed when
step k begins: it never reads step k's target logits, its proposal or its noise. So every step
is a lossless step of a length fixed in advance, and the output follows the target's law step
after step (greedy: equals AR token for token, in exact mode bit for bit). What would break it
is a length chosen from the current step, e.g. cutting the block before the first drafted token
whose target probability is low (DSpark, appendix A): whether a sampled d_i is tested then
depends on d_i itself, and low-probability tokens are under-emitted
(`tests/engine/test_adaptive_verify.py`: the same chi-square test rejects that rule and passes
this one).

`"tree"` verifies a token tree of `tree_budget` nodes built from the
proposal instead of the chain (`dflash2.engine.tree`; `DecodeState._tree_verify`); its length is
N at every step, as for `"chain"`.

The lengths are recorded per row and step (`SpeculativeOutput.verify_lengths`): the target rows a
ragged verify would run (L + 1), for cost accounting. Today the forward still scores N + 1 rows.
"""

from __future__ import annotations

import torch

from dflash2.kernels.verify import verify_block

VERIFY_POLICIES = ("chain", "adaptive", "tree")
ADAPTIVE_GROW = 2  # added to a row's verify length after a step that accepted all of it
ADAPTIVE_SHRINK = 1  # taken from it after a step with a rejection inside it


def initial_lengths(verify: str, batch: int, n_spec: int, device: torch.device | str) -> torch.Tensor:
    """`[batch]` int64 verify lengths of a call's first step: N under both policies."""
    if verify not in VERIFY_POLICIES:
        raise ValueError(f"verify must be one of {VERIFY_POLICIES}, got {verify!r}")
    return torch.full((batch,), n_spec, dtype=torch.long, device=device)


def next_lengths(verify: str, lengths: torch.Tensor, accepted: torch.Tensor, n_spec: int) -> torch.Tensor:
    """The next step's verify lengths `[B]` from this step's `lengths [B]` and `accepted [B]`
    (accepted <= lengths): unchanged (N) for `"chain"` and `"tree"`, the module's rule for
    `"adaptive"`, in `1..N` (0 when N = 0). Device ops only (graph-capturable); reads nothing else."""
    if verify != "adaptive" or n_spec == 0:
        return lengths
    grown = torch.clamp(lengths + ADAPTIVE_GROW, max=n_spec)
    shrunk = torch.clamp(lengths - ADAPTIVE_SHRINK, min=1)
    return torch.where(accepted >= lengths, grown, shrunk)


def target_draw(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                impl: str) -> torch.Tensor:
    """`[B, M]` int64: the target's own token at each of the `M` logits rows of every row b, i.e.
    `verify_block` of one row with no drafted token (the AR loop's draw): the argmax at T = 0,
    else the race keyed by (row b's seed, the row's position).

    Args:
        logits: `[B, M, V]` fp32, `verify_block`'s input (`DecodeState.target_probs_input`).
        temperature, seeds: `[B]`. positions: `[B, M]` int64, the position each row predicts.
        impl: as for `verify_block`.
    Returns:
        `[B, M]` tokens; -1 for an invalid logits row (`verify_block`'s flag).
    """
    bsz, m, vocab = logits.shape
    no_draft = torch.zeros(bsz * m, 0, dtype=torch.long, device=logits.device)
    _, tok = verify_block(logits.reshape(bsz * m, 1, vocab), no_draft, no_draft[..., None],
                          torch.zeros(bsz * m, 0, 1, dtype=torch.float32, device=logits.device),
                          temperature.repeat_interleave(m), seeds.repeat_interleave(m), positions.reshape(-1),
                          impl=impl)
    return tok.view(bsz, m)


def verify_within(logits: torch.Tensor, draft_tokens: torch.Tensor, cand_ids: torch.Tensor, q: torch.Tensor,
                  temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor,
                  impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify_block` of each row's first `lengths[b]` drafted tokens, on the whole block's tensors.

    Args:
        logits, draft_tokens, cand_ids, q, temperature, seeds, positions, impl: as for
            `dflash2.kernels.verify.verify_block` (`logits [B, N+1, V]`, `draft_tokens [B, N]`,
            `cand_ids [B, N, k]`, `q [B, N, k]`, `positions [B]` = the position logits row 0 predicts).
        lengths: `[B]` int64 in `0..N`, fixed before this call.
    Returns:
        `(accepted [B] in 0..lengths, next_token [B])`: for every row, bit for bit what
        `verify_block` returns on `logits[b, :L+1]`, `draft_tokens[b, :L]`, `cand_ids[b, :L]`,
        `q[b, :L]` with `L = lengths[b]` (module docstring). Fixed shapes, no host sync.
    """
    accepted, next_token = verify_block(logits, draft_tokens, cand_ids, q, temperature, seeds, positions, impl=impl)
    rows = torch.arange(logits.shape[0], device=logits.device)
    # The bonus of a block of L: the target's token at block row L (argmax, or the race keyed by
    # row L's position), which is `verify_block` of that one row with no drafted token.
    bonus = target_draw(logits[rows, lengths][:, None], temperature, seeds, (positions + lengths)[:, None], impl)[:, 0]
    cut = accepted >= lengths  # all L verified tokens accepted: the block of L ends with its bonus
    return torch.minimum(accepted, lengths), torch.where(cut, bonus, next_token)
