"""The static state of a `speculative_generate` call, its decoding step, and its reuse across calls.

`DecodeState` holds every buffer the steady-state step reads or writes (tokens, per-row lengths,
budgets and finished flags, the target cache, the draft's proposer with its context cache, the
next step's context features, each row's next verify length, the `[REPORT_ROWS, B]` report) and
`DecodeState.step` updates them in place.
The step reads nothing else: no per-call Python value is baked into it (the token budget is a
per-row tensor), so a CUDA graph captured from it by one call replays correctly in the next.

**Batch buckets.** On the graph path a call's B rows run in a state of `batch_bucket(B)` rows
(1, 2, 4, 8, 16, 32, then multiples of 32). The extra rows are idle from the start (budget 0):
they ride along like finished rows, commit nothing and are not prefilled (the prefill writes rows
0..B-1 only); their outputs are dropped.

**Reuse across calls.** On the graph path a state, with its CUDA graphs, stays on the target for
later calls with the same settings (`dflash2.engine.kept`). The eager loop and custom proposers
(whose state is their own) build a state per call, at the call's own batch size.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from dflash2.engine.cache import FULL_WINDOW, StaticTargetCache
from dflash2.engine.draft import DraftStep, Proposal
from dflash2.engine.reports import REPORT_ROWS, StepReports
from dflash2.engine.sampling import filter_logits, invalid_rows
from dflash2.engine.settings import EXACT_SPLIT_KEYS, EngineSettings
from dflash2.engine.tree import accept_matching, expand_tree
from dflash2.engine.verify import initial_lengths, next_lengths, target_draw, verify_within
from dflash2.kernels.linear import MAX_ROWS, FusedLinears, SmallMLinearMode, fusable_groups
from dflash2.kernels.tree_mask import tree_attention_mask, tree_positions
from dflash2.kernels.verify import verify_block
from dflash2.target import TargetModel

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)  # graph-path batch sizes; above 32, multiples of 32
LEN_BUCKET = 512  # slots per row of a reusable state, rounded up to a multiple of this


def _selector_head_group(proposer, tgt: TargetModel) -> list[FusedLinears]:
    """The DFlash2 proposer's selector gate and the target's LM head as one fused group (both read
    the draft's final states; `DFlash2Proposer.propose` calls the gate first, so the target's own
    head calls, with other inputs, stay unfused), or none where they do not fuse (no selector,
    another dtype, a head that is not an `nn.Linear`)."""
    selector = getattr(proposer, "selector", None)
    head = tgt.model.get_output_embeddings()
    if selector is None or not isinstance(head, torch.nn.Linear):
        return []
    try:
        return [FusedLinears([selector.hidden_projection, head])]
    except ValueError:
        return []


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple` (> 0)."""
    return -(-n // multiple) * multiple


def batch_bucket(batch: int) -> int:
    """The state's row count for a call of `batch` rows on the graph path."""
    for b in BATCH_BUCKETS:
        if batch <= b:
            return b
    return round_up(batch, BATCH_BUCKETS[-1])


def forward_rows(tgt: TargetModel, block: torch.Tensor, pos: torch.Tensor, cache: StaticTargetCache,
                 layer_ids: list[int], kv_len: int, kernel: str):
    """Exact-mode block forward: one forward per row, each with the shapes of a batch of one.

    GEMM kernels may pick other algorithms (other reduction orders) for another number of rows
    M = B x W; on the H200 a bf16 Qwen3-8B-shaped row changed with its batch neighbours even
    with the attention kernel fixed. Row by row, a row runs the very kernels it runs alone.

    Returns:
        `(logits [B, W, V], features [B, W, n*H] or None)`.
    """
    logits, feats = [], []
    for b in range(block.shape[0]):
        cache.prepare(pos[b:b + 1], kv_len=kv_len, row=b)
        out = tgt(block[b:b + 1], position_ids=pos[b:b + 1], past_key_values=cache, layer_ids=layer_ids,
                  **cache.attention_kwargs(kernel, exact=True))
        logits.append(out.logits)
        if out.features is not None:
            feats.append(out.features)
    return torch.cat(logits), (torch.cat(feats) if feats else None)


class DecodeState:
    """Static buffers of `batch` rows x `max_len` slots and the step that updates them in place.

    Args:
        tgt: the target. proposer: a `propose(DraftStep) -> Proposal` object or None (AR); a
            `DFlash2Proposer` is built for this state's rows by the caller.
        batch, max_len: rows and slots per row (`tokens` has one more column, the trash column
            that absorbs masked writes).
        n_spec: N. width: the target forward's block width (N + 1, or the padded block of exact
            mode with `exact_impl="rows"`).
        sampled, top_k, top_p: the target-side sampling rule (T > 0) and its filters.
        n_stops: number of stop tokens (None: no stop tokens).
        layer_ids: target layers whose features the draft reads.
        engine: the call's `EngineSettings` (kernels, exact mode: row-by-row target forwards over
            the whole buffer, compile level, graphs, verify policy); a kept state serves only calls
            with equal ones.
        key: the reuse key (`state_key`), or None for a state of one call.
    """

    def __init__(self, tgt: TargetModel, proposer, *, batch: int, max_len: int, n_spec: int, width: int,
                 sampled: bool, top_k: int, top_p: float, n_stops: int | None, layer_ids: list[int],
                 engine: EngineSettings, key: tuple | None = None):
        device = tgt.device
        self.tgt, self.proposer, self.key, self.engine = tgt, proposer, key, engine
        self.batch, self.max_len, self.n_spec, self.width, self.exact = batch, max_len, n_spec, width, engine.exact
        self.sampled, self.top_k, self.top_p, self.layer_ids = sampled, top_k, top_p, layer_ids
        self.lock = threading.Lock()
        self.runner = None  # the StepGraphs of this state's decoding step (graph path), kept with it
        self.prefill_runner = None  # the StepGraphs of its batched prefill, one graph per PrefillShape
        # The function modes entered around the forwards of a call on this state live with it:
        # graphs captured under them replay their buffers (the small-M linear's split-K tickets).
        # Invariant exact mode routes every linear (any row count) and the norms' means through
        # batch-invariant kernels around the steps; the normal mode's linear mode (linear_impl)
        # covers prefill and steps.
        # Each attention's q/k/v and each MLP's gate/up as one launch, where their modules run
        # uncompiled. Inside compiled modules (the MLPs at "light", everything at "full") each
        # linear runs as its own operator, so no group is formed for them: a frame that ran eagerly
        # after all would then still run its linears one by one, with the tilings of the compiled
        # code. In exact mode too: a column's bits depend on its weight row, the input row and the
        # tiling of the (fused) matrix, which every call and arm of a run shares. The DFlash2 draft
        # (compiled "light" at every level) projects its context rows with its block rows through
        # the q/k/v group (kernel_impl "triton"); with the reference kernels it projects the context
        # apart, and its k/v pair group runs that as one launch.
        self.mean_mode = None
        self.linear_mode = None
        if engine.invariant_exact or engine.linear_impl == "triton":
            fused = (fusable_groups(tgt.model, mlp=engine.compile_level is None)
                     if engine.compile_level != "full" else [])
            draft = getattr(proposer, "draft", None)
            if isinstance(draft, torch.nn.Module):
                fused += fusable_groups(draft, kv_pairs=True)
            fused += _selector_head_group(proposer, tgt)
            self.linear_mode = SmallMLinearMode("triton", device, max_rows=None if engine.invariant_exact else MAX_ROWS,
                                                fused=fused)
        if engine.invariant_exact:
            from dflash2.kernels.row_mean import RowMeanMode

            self.mean_mode = RowMeanMode("triton", device)
        self.trash = max_len  # the column of `tokens` that absorbs masked writes
        longs = dict(dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, max_len + 1, **longs)
        self.plens = torch.ones(batch, **longs)
        self.budget = torch.zeros(batch, **longs)  # per row: max_new_tokens (0 = an idle bucket row)
        self.gen = torch.ones(batch, **longs)
        self.done = torch.ones(batch, dtype=torch.bool, device=device)
        self.hit_stop = torch.zeros(batch, dtype=torch.bool, device=device)
        self.temps = torch.zeros(batch, dtype=torch.float32, device=device)
        self.seeds = torch.zeros(batch, **longs)
        self.stops = None if n_stops is None else torch.zeros(n_stops, **longs)
        # Per row, the verify length of the next step (dflash2.engine.verify): set by `load` and by
        # each step from its own outcome, so a step's length is fixed before it runs.
        self.verify_len = initial_lengths(engine.verify, batch, n_spec, device)
        self.cache = StaticTargetCache(tgt.config, batch, max_len, tgt.dtype, device)
        if engine.verify == "tree" and self.cache.windows != [FULL_WINDOW]:
            raise ValueError("verify='tree' does not handle sliding-window attention layers yet")
        self.reach = max(n_spec, engine.tree_budget - 1)  # slots past the anchor a step writes
        self.arange_tree = torch.arange(max(engine.tree_budget, 1), device=device)
        self.arange_blk = torch.arange(n_spec + 1, device=device)
        self.arange_w = torch.arange(width, device=device)
        self.pad = torch.zeros(batch, width - n_spec - 1, **longs)  # exact-mode pad slots
        self.empty_d = torch.zeros(batch, 0, **longs)
        self.empty_q = torch.zeros(batch, 0, 1, dtype=torch.float32, device=device)
        # The next step's context: target features, positions and counts of the committed block
        # rows. The first step of a call reads the prompt's instead (`first_context`).
        self.ctx_feats: torch.Tensor | None = None  # allocated by the first step
        self.ctx_pos = torch.zeros(batch, n_spec + 1, **longs)
        self.ctx_counts = torch.zeros(batch, **longs)
        self.first_context: tuple | None = None
        self.report = torch.zeros(REPORT_ROWS, batch, **longs)  # the step's one device-to-host copy
        self.reports = StepReports(self.report, max_len)  # its host copies, one per step (reused by later calls)

    def prefill_modes(self) -> contextlib.AbstractContextManager:
        """The function modes of the prefill: the linear mode in normal mode, the step modes in
        invariant exact mode (its prefill runs the invariant kernels, `dflash2.engine.prefill`), none
        in exact mode `"rows"` (row by row with the stock kernels) or without a linear mode."""
        if self.engine.invariant_exact:
            return self.step_modes()
        if self.exact or self.linear_mode is None:
            return contextlib.nullcontext()
        return self.linear_mode

    @contextlib.contextmanager
    def step_modes(self) -> Iterator[None]:
        """The function modes of the decoding steps (entered around their eager runs, captures
        and replays): the linear mode and, in invariant exact mode, the row-mean mode."""
        with contextlib.ExitStack() as stack:
            for mode in (self.linear_mode, self.mean_mode):
                if mode is not None:
                    stack.enter_context(mode)
            yield

    def close(self) -> None:
        """Drop the graphs: the runner's step is this state's bound method, a reference cycle that
        would otherwise hold the buffers and graph pools until the cyclic collector runs."""
        self.runner = self.prefill_runner = None

    def load(self, rows: list[torch.Tensor], temperature: float, seeds: torch.Tensor, max_new_tokens: int,
             stops: torch.Tensor | None) -> None:
        """Reset for a call whose prompts are `rows` (rows 0..len(rows)-1; later rows idle)."""
        n = len(rows)
        self.tokens.zero_()
        for b, r in enumerate(rows):
            self.tokens[b, : r.numel()] = r.to(self.tokens.device)
        self.plens.fill_(1)
        self.plens[:n] = torch.tensor([r.numel() for r in rows], dtype=torch.long)
        self.budget.zero_()
        self.budget[:n] = max_new_tokens
        self.temps.fill_(float(temperature))
        self.seeds.zero_()
        self.seeds[:n] = seeds
        if stops is not None:
            self.stops.copy_(stops)
        self.gen.fill_(1)
        self.hit_stop.zero_()
        self.verify_len.fill_(self.n_spec)
        self.cache.set_lengths(self.plens)
        if hasattr(self.proposer, "cache"):  # a DFlash2 proposer's draft context cache starts empty
            self.proposer.cache.reset()
        if self.linear_mode is not None:  # fused copies of the models' weights follow in-place updates
            self.linear_mode.refresh_fused()

    def target_probs_input(self, logits: torch.Tensor) -> torch.Tensor:
        """What `verify_block` reads for the target: filtered logits when sampling, fp32 logits when
        greedy (`logits` covers the first `logits.shape[0]` rows)."""
        if not self.sampled:
            return logits.float()
        return filter_logits(logits, self.temps[: logits.shape[0]], self.top_k, self.top_p)

    def start(self, first: torch.Tensor, context: tuple) -> None:
        """After the prefill: commit each row's first token `first [batch]` and hand the prompt's
        features `context = (features, positions, counts)` to the proposer.

        The AR arm reads none. A proposer with `absorb_context` takes them now and the first step
        reads the context buffers with counts 0, so it has the shape of every later step and runs
        as a graph replay (`first_step_replays`); any other proposer gets them in its first step,
        which then runs eagerly."""
        self.tokens[torch.arange(self.batch, device=first.device), self.plens] = first
        torch.ge(self.gen, self.budget, out=self.done)
        if self.stops is not None:
            stop = torch.isin(first, self.stops)
            self.done |= stop
            self.hit_stop.copy_(stop)
        self.first_context = None
        if self.proposer is None:
            return
        if not hasattr(self.proposer, "absorb_context"):
            self.first_context = context
            return
        feats, positions, counts = context
        self.proposer.absorb_context(feats, positions, torch.where(self.done, 0, counts))
        if feats is not None and self.ctx_feats is None:
            self.ctx_feats = feats.new_zeros(self.batch, self.n_spec + 1, feats.shape[-1])
        self.ctx_counts.zero_()

    @property
    def first_step_replays(self) -> bool:
        """Whether the call's first step has the shape of the later ones (no prompt context to
        hand over), so the graph path may replay it."""
        return self.first_context is None

    def step(self, kv_len: int, record=None, clock: Callable[[], float] | None = None) -> float:
        """One decoding step on the static state (no host synchronization unless `clock` syncs).

        `record`: a `StepTimes` for the phase readings of an eager step (None inside graphs).
        Returns when the verify phase began (host clock; 0.0 without `record`)."""
        n_spec, proposer = self.n_spec, self.proposer
        done, gen, tokens = self.done, self.gen, self.tokens
        context = self.first_context if self.first_context is not None else (
            self.ctx_feats, self.ctx_pos, self.ctx_counts)
        active = ~done
        start = self.plens + gen - 1  # [B] anchor positions
        anchor = tokens.gather(1, start[:, None])[:, 0]
        t0 = clock() if record is not None else 0.0
        if proposer is not None:
            prop: Proposal = proposer.propose(DraftStep(
                anchor=anchor, start=start, context=context[0], context_positions=context[1],
                context_counts=torch.where(active, context[2], 0), temperature=self.temps, seeds=self.seeds,
                tokens=tokens, num_speculative_tokens=n_spec))
            d, cand, q = prop.tokens, prop.cand_ids, prop.q
            if record is not None:
                record.draft.append(prop.draft_s)
                record.select.append(prop.select_s)
                t0 = clock()
        else:
            prop, d, cand, q = None, self.empty_d, self.empty_d[..., None], self.empty_q
        # ---- verify: one target forward over [anchor, d_1..d_N] (+ exact-mode padding) at each
        # row's own offset; only the first 1+N slots' logits and features are used.
        pos_w = start[:, None] + self.arange_w
        lengths = self.verify_len  # [B]: fixed by the earlier steps, never by this one's logits
        if self.engine.verify == "tree":  # a token tree instead of the block
            d, acc, nxt, feats, bad = self._tree_verify(prop, anchor, start, pos_w, active, kv_len)
        else:
            acc, nxt, feats, bad = self._block_verify(anchor, d, cand, q, start, pos_w, lengths, kv_len)
        if prop is not None and prop.invalid is not None:
            bad = bad | prop.invalid
        # ---- commit d_1..d_acc then nxt, truncated by the budget and the first stop token
        acc = torch.where(active, acc, 0)
        new = torch.cat([d, torch.zeros_like(nxt)[:, None]], dim=1).scatter(1, acc[:, None], nxt[:, None])
        n_new = torch.minimum(acc + 1, self.budget - gen)
        if self.stops is not None:
            is_stop = torch.isin(new, self.stops) & (self.arange_blk[None] < n_new[:, None])
            stop_hit = is_stop.any(1)
            n_new = torch.where(stop_hit, is_stop.int().argmax(1) + 1, n_new)
            self.hit_stop.logical_or_(stop_hit & active)
        else:
            stop_hit = torch.zeros_like(active)
        n_new = torch.where(active, n_new, 0)
        cols = (self.plens + gen)[:, None] + self.arange_blk
        cols = torch.where(self.arange_blk[None] < n_new[:, None], cols, self.trash)
        tokens.scatter_(1, cols, new)
        gen.add_(n_new)
        done.logical_or_(active & (stop_hit | (gen >= self.budget)))
        self.cache.set_lengths(torch.where(active, start + acc + 1, start))  # rollback = new lengths
        # ---- the next step's context: target features of the committed block rows
        if feats is not None:
            if self.ctx_feats is None:  # allocated by the first step (or by `start`)
                self.ctx_feats = torch.empty_like(feats[:, : n_spec + 1])
            self.ctx_feats.copy_(feats[:, : n_spec + 1])
        self.ctx_pos.copy_(pos_w[:, : n_spec + 1])
        self.ctx_counts.copy_(acc + 1)
        self.first_context = None
        self.report.copy_(torch.stack([acc, n_new, done.long(), (bad & active).long(), active.long(),
                                       self.plens + gen, lengths]))  # rows: dflash2.engine.reports
        if self.engine.verify != "chain":  # the next step's lengths, from this step's outcome (after the report)
            self.verify_len.copy_(torch.where(active, next_lengths(self.engine.verify, lengths, acc, n_spec), lengths))
        return t0

    def _chain_forward(self, block: torch.Tensor, pos_w: torch.Tensor, kv_len: int):
        """One target forward over `block [B, W]` at positions `pos_w` (K/V at the slots of those
        positions), with the call's kernels: row by row in exact mode `"rows"`, the invariant
        kernels in `"invariant"`. Returns `(logits [B, W, V], features or None)`."""
        if self.exact and not self.engine.invariant_exact:
            return forward_rows(self.tgt, block, pos_w, self.cache, self.layer_ids, self.max_len,
                                self.engine.attention_impl)
        self.cache.prepare(pos_w, kv_len=kv_len)
        inv = self.engine.invariant_exact  # fixed key splits and query tile: bits independent of B and W
        out = self.tgt(block, position_ids=pos_w, past_key_values=self.cache, layer_ids=self.layer_ids,
                       **self.cache.attention_kwargs(self.engine.attention_impl,
                                                     split_keys=EXACT_SPLIT_KEYS if inv else None,
                                                     tile_queries=self.engine.exact_block_size if inv else None))
        return out.logits, out.features

    def _block_verify(self, anchor, d, cand, q, start, pos_w, lengths, kv_len):
        """The chain / adaptive verify: one target forward over `[anchor, d_1..d_N]` (+ exact-mode
        padding). Returns `(acc [B], nxt [B], feats [B, W, F] or None, bad [B])`."""
        n_spec = self.n_spec
        all_logits, feats = self._chain_forward(torch.cat([anchor[:, None], d, self.pad], dim=1), pos_w, kv_len)
        logits = all_logits[:, : n_spec + 1]  # [B, 1+N, V]
        bad = invalid_rows(logits)
        if self.engine.verify == "chain":
            acc, nxt = verify_block(self.target_probs_input(logits), d, cand, q, self.temps, self.seeds, start + 1,
                                    impl=self.engine.kernel_impl)
        else:  # accept at most lengths[b] drafted tokens: verify_block of the truncated block, same shapes
            acc, nxt = verify_within(self.target_probs_input(logits), d, cand, q, self.temps, self.seeds, start + 1,
                                     lengths, impl=self.engine.kernel_impl)
        return acc, nxt, feats, bad

    def _target_tokens(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`target_draw` of `logits [B, M, V]` under the call's sampling rule and seeds."""
        return target_draw(self.target_probs_input(logits), self.temps, self.seeds, positions, self.engine.kernel_impl)

    def _tree_verify(self, prop: Proposal, anchor, start, pos_w, active, kv_len):
        """Tree verify (`verify="tree"`): the proposal's token tree of `tree_budget` nodes
        (`dflash2.engine.tree.expand_tree`, the drafted tokens as its chain; the selector's edges
        `prop.edges`, or `log q` per candidate when the proposer gives none), one target forward
        over its nodes (node i's K/V at slot `start + i`, position `start + depth`, the tree
        mask), the target's own token at every node (`_target_tokens`) and the matching
        acceptance (`accept_matching`).

        Normal mode commits the accepted path's K/V and features from the tree forward: the K/V
        move to the slots of their positions (`start + 1 .. start + acc`; chain nodes are already
        there). Exact mode only takes the path from the tree forward (whose masked attention has
        no exact kernel) and confirms it with a second, exact forward over the chain
        `[anchor, path, pad]` (the kernels of `_block_verify`): the step accepts the path's
        leading tokens that equal the target's token from those exact logits (at most the tree's
        count) and takes the bonus from them too, so every committed token, K/V and feature is
        the exact forward's: bit for bit exact AR's. Two forwards per step: exact tree verify
        costs one more chain forward than normal mode.

        Returns `(d [B, N]` the accepted path's tokens (0 past `acc`), `acc [B]`, `nxt [B]` the
        bonus token, `feats [B, N+1, F]` or None the target features of the root and the path,
        `bad [B])`.
        """
        n, budget = self.n_spec, self.engine.tree_budget
        d, cand, q = prop.tokens, prop.cand_ids, prop.q
        chosen = (cand == d[..., None]).int().argmax(-1)  # the drafted chain's candidate indices
        edges = prop.edges
        if edges is None:  # no selector edges: every candidate scored by the proposer's law alone
            edges = torch.log(q.float())[:, :, None, :].expand(-1, -1, cand.shape[-1], -1)
        tree = expand_tree(edges, cand, anchor, budget, chain=chosen, impl=self.engine.kernel_impl)
        self.cache.prepare(start[:, None] + self.arange_tree, kv_len=kv_len)
        mask = tree_attention_mask(tree.parent, start, self.cache.state.kv_len, impl=self.engine.kernel_impl)
        node_pos = tree_positions(tree.depth, start)
        out = self.tgt(tree.tokens, position_ids=node_pos, past_key_values=self.cache,
                       layer_ids=self.layer_ids, dfl2_kernel="torch", dfl2_exact=False,
                       dfl2_masks={FULL_WINDOW: mask})
        bad = invalid_rows(out.logits)
        acc, path, bonus = accept_matching(tree, self._target_tokens(out.logits, node_pos + 1))
        if path.shape[1] < n:
            path = torch.cat([path, path.new_full((path.shape[0], n - path.shape[1]), -1)], dim=1)
        path = path[:, :n]
        slot = self.arange_blk[None, :n]
        on = (slot < acc[:, None]) & active[:, None]
        d = torch.where(on, tree.tokens.gather(1, path.clamp(min=0)), 0)
        if self.exact:  # confirm the path with the exact kernels (docstring)
            all_logits, feats = self._chain_forward(torch.cat([anchor[:, None], d, self.pad], dim=1), pos_w, kv_len)
            logits = all_logits[:, : n + 1]
            bad = invalid_rows(logits)
            draws = self._target_tokens(logits, pos_w[:, : n + 1] + 1)  # [B, N+1]
            match = (d == draws[:, :n]) & (slot < acc[:, None])
            acc = match.long().cumprod(1).sum(1)
            bonus = draws.gather(1, acc[:, None])[:, 0]
            return torch.where(slot < acc[:, None], d, 0), acc, bonus, feats, bad
        dst = start[:, None] + 1 + slot
        self.cache.move_slots(torch.where(on, start[:, None] + path, dst), dst)
        feats = None
        if out.features is not None:
            nodes = torch.cat([torch.zeros_like(path[:, :1]), path.clamp(min=0)], dim=1)  # [B, N+1]
            feats = out.features.gather(1, nodes[..., None].expand(-1, -1, out.features.shape[-1]))
        return d, acc, bonus, feats, bad
