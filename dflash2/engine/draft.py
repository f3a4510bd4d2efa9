"""Drafting half of a speculative step: draft forward, unary top-k, selector walk.

    h       = draft([anchor, mask x N], new context features)        [B, 1+N, H]
    logits  = target.head(h[:, 1:])                                  [B, N, V]
    (U, C)  = vocab_topk(logits, k, output_multiplier, softcap)      [B, N, k] fp32 / int64
    DFlash2:  eta = W_h h[:, 1:];  (d, _, q) = selector_walk(U, C, eta, A, Z, anchor, T, ...)
    v1:       d = C[..., 0] (per-slot argmax), q = one-hot (k = 1)    (z-lab#169, spec 8)

The engine talks to a drafter only through `propose(DraftStep) -> Proposal`, so tests can
plug in other proposers (an oracle that proposes the target's own tokens) and exercise the
same accept/commit bookkeeping. `Proposal.q[b, j]` must be the true law that drew
`tokens[b, j]` given the drafted prefix; verification is lossless only under that condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dflash2.engine.tree import tree_edge_scores
from dflash2.kernels.selector import selector_walk
from dflash2.kernels.topk import vocab_topk


@dataclass
class DraftStep:
    """Inputs of one drafting step (all on the target's device).

    Attributes:
        anchor: `[B]` last committed token (slot 0 of the block).
        start: `[B]` absolute position of the anchor (= committed length before it).
        context: `[B, c, n*H]` target features of the tokens committed since the last step
            (at the first step: the whole prompt, or, for a proposer with
            `absorb_context(context, positions, counts)`, which took the prompt's after the
            prefill, an empty context with counts 0); entries past `context_counts` are padding.
        context_positions: `[B, c]` absolute positions of those entries.
        context_counts: `[B]` valid entries per row (0 for finished rows).
        temperature: `[B]` fp32 (0 = greedy row).
        seeds: `[B]` int64 per-row seeds (draft stream noise is keyed by them).
        tokens: `[B, S]` committed tokens so far (row b valid through `start[b]`).
        num_speculative_tokens: `N`.
    """

    anchor: torch.Tensor
    start: torch.Tensor
    context: torch.Tensor
    context_positions: torch.Tensor
    context_counts: torch.Tensor
    temperature: torch.Tensor
    seeds: torch.Tensor
    tokens: torch.Tensor
    num_speculative_tokens: int


@dataclass
class Proposal:
    """`tokens [B, N]`, their candidate ids `cand_ids [B, N, k]` and fp32 proposal law
    `q [B, N, k]` over those candidates; `invalid [B]` flags rows whose draft logits were
    NaN/+inf/all -inf (None = not checked); seconds spent drafting and selecting; `edges
    [B, N, k, k]` fp32, the selector's edge scores for tree verify (`dflash2.engine.tree.
    tree_edge_scores`; None: not computed, and the tree scores candidates by `log q`)."""

    tokens: torch.Tensor
    cand_ids: torch.Tensor
    q: torch.Tensor
    invalid: torch.Tensor | None = None
    draft_s: float = 0.0
    select_s: float = 0.0
    edges: torch.Tensor | None = None


class DFlash2Proposer:
    """Drives a `DFlash2DraftModel` (v2, or v1 when `draft.selector_enabled` is False).

    Owns the draft's `DraftContextCache` (one per decoding state, reset at the start of each call).

    Args:
        draft: the draft model.
        target: the `TargetModel` (its embedding table and LM head are the draft's).
        batch_size, max_len: cache rows and slots per row.
        impl: kernel implementation, already resolved (`"torch"` or `"triton"`): top-k, selector
            walk, the draft's conv and its attention's norm-RoPE cache writes.
        clock: returns a wall-clock reading, synchronizing the device first when timing.
        attention_impl: the draft's cached attention, resolved (`"torch"` or `"triton"`).
        use_selector: False proposes the per-slot argmax with one-hot q (k = 1) even for a draft
            with a selector (the selector-off ablation); a v1 draft always does.
        tree: also return the selector's edge scores (`Proposal.edges`) for tree verify.
    All of these are passed to the draft's forward per call; nothing is set on the draft.
    """

    graph_safe = True  # propose() is device work only: it can be captured in a CUDA graph

    def __init__(self, draft, target, batch_size: int, max_len: int, impl: str,
                 clock: Callable[[], float] = time.perf_counter, *, attention_impl: str = "torch",
                 use_selector: bool = True, tree: bool = False):
        self.draft, self.target, self.impl, self.clock = draft, target, impl, clock
        self.attention_impl, self.tree = attention_impl, tree
        self.cache = draft.new_cache(batch_size, max_len)
        cfg = draft.config
        self.mask_token_id = int(cfg.mask_token_id)
        # The block's mask slots, one row for any N < block size (a slice, no fill kernel per step).
        self._mask_ids = torch.full((1, max(1, draft.block_size - 1)), self.mask_token_id, dtype=torch.long,
                                    device=self.cache.lengths.device)
        self.multiplier = float(cfg.output_multiplier)
        self.softcap = float(cfg.final_logit_softcapping)
        self.selector = draft.candidate_selector if draft.selector_enabled and use_selector else None
        self.top_k = int(cfg.selector_top_k) if self.selector is not None else 1

    def absorb_context(self, context: torch.Tensor, positions: torch.Tensor, counts: torch.Tensor) -> None:
        """Take the prompt's target features `context [B, P, n*H]` at `positions [B, P]`
        (`counts [B]` valid per row) into the draft's cache after the prefill; the first
        `propose` then gets an empty context (counts 0), like any step after one that
        committed nothing new (`DFlash2DraftModel.absorb_context`)."""
        dtype = self.target.model.get_input_embeddings().weight.dtype  # what propose casts the context to
        self.draft.absorb_context(context.to(dtype), positions, self.cache, counts, kernel_impl=self.impl)

    def propose(self, step: DraftStep) -> Proposal:
        n = step.num_speculative_tokens
        b = step.anchor.shape[0]
        dev = step.anchor.device
        t0 = self.clock()
        if n > self._mask_ids.shape[1]:
            raise ValueError(f"N={n} speculative tokens exceed the draft's block of {self._mask_ids.shape[1] + 1}")
        block = torch.cat([step.anchor[:, None], self._mask_ids[:, :n].expand(b, n)], dim=1)  # [B, 1+N]
        block_pos = step.start[:, None] + self.cache.arange(1 + n)  # [B, 1+N]
        noise = self.draft.noise_embedding(self.target.embed, block)  # [B, 1+N, H]
        hidden = self.draft(
            position_ids=torch.cat([step.context_positions, block_pos], dim=1),
            noise_embedding=noise,
            target_hidden=step.context.to(noise.dtype),
            past_key_values=self.cache,
            use_cache=True,
            context_lengths=step.context_counts,
            kernel_impl=self.impl,
            attention_impl=self.attention_impl,
        )[:, 1:]  # [B, N, H]: slot j predicts position start + j
        t1 = self.clock()
        # Contiguous, so the head is one GEMM over the B*N rows: the slice is not viewable as 2-D,
        # and on such a strided 3-D input F.linear ran a batched GEMM that read the whole LM head
        # once per row (9.3 ms at batch 32, N = 3 on the H200, against 0.3 ms for one read).
        hidden = hidden.contiguous()
        # The gate before the head: under the engine's linear mode the two are one fused launch
        # whose first member is the gate (`dflash2.engine.state`), and the head takes its slice.
        eta = self.selector.gate(hidden) if self.selector is not None else None  # [B, N, R]
        logits = self.target.head(hidden)  # [B, N, V]
        # The top-k's own launches also flag slots with a NaN, a +inf or no finite logit.
        values, ids, bad_slot = vocab_topk(logits.view(b * n, -1), self.top_k, multiplier=self.multiplier,
                                           softcap=self.softcap, impl=self.impl, with_invalid=True)
        invalid = bad_slot.view(b, n).any(-1)  # [B], as `invalid_rows(logits)`
        values, ids = values.view(b, n, -1), ids.view(b, n, -1)  # [B, N, k]
        if self.selector is None:
            # v1: per-slot argmax, one-hot q (independent per-slot sampling would be incoherent).
            tokens, cand_ids = ids[..., 0], ids[..., :1]
            q = torch.ones(b, n, 1, dtype=torch.float32, device=dev)
        else:
            tokens, _chosen, q = selector_walk(
                values, ids, eta, self.selector.predecessor_codebook, self.selector.successor_codebook,
                step.anchor, step.temperature, step.seeds, step.start + 1, impl=self.impl,
            )
            cand_ids = ids
        edges = None
        if self.tree and self.selector is not None:
            edges = tree_edge_scores(values, ids, eta, self.selector.predecessor_codebook,
                                     self.selector.successor_codebook, step.anchor)
        t2 = self.clock()
        return Proposal(tokens, cand_ids, q, invalid, draft_s=t1 - t0, select_s=t2 - t1, edges=edges)
