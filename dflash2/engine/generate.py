"""`speculative_generate`: lossless DFlash2 speculative decoding, greedy or sampled, batched.

One loop serves both arms. Per step, for every row b (static shapes, per-row lengths):

    anchor = last committed token, at position start_b (= committed K/V length)
    N > 0:  (d, cand, q) = propose(anchor, new context features)         draft + select
    logits = target([anchor, d_1..d_N] at start_b .. start_b+N)            verify
    (acc_b, x_b) = verify_block(filter(logits), d, cand, q, T, seed_b, start_b + 1)
    commit d_1..d_acc, x  ->  start_b += acc_b + 1 (target rollback = set the row length)
    next context = target features of block rows 0..acc_b (the committed tokens)

With `verify="adaptive"` row b accepts at most its verify length L_b <= N of the step, fixed by
its earlier steps (`dflash2.engine.verify.verify_within`: the block keeps its N + 1 slots).
With `verify="tree"` the target scores a token tree of `tree_budget` nodes built
from the proposal (`dflash2.engine.tree`) instead of the block, and the accepted root path is
committed (`DecodeState._tree_verify`).

With `draft=None` or `num_speculative_tokens=0` the block is the anchor alone and
`verify_block` reduces to sampling (or argmax) from the target: the autoregressive baseline,
through the same code. The token after the prompt comes from the prefill logits by the same
`verify_block` call with N = 0, so AR and speculative runs share every sampling rule.

Stopping is per row: `max_new_tokens` caps each row, and a stop token inside an accepted run
truncates the row right after it; finished rows stay in the batch but commit nothing.

What each mode guarantees:
- greedy, normal mode (`exact=False`, the default): the output is the target's greedy path as
  this engine computes it. In fp32 it equals AR's; in bf16 a verify block's kernels may flip a
  0-1 ulp top-2 tie, so a speculative row can leave the AR row there (eval/run.py records each
  departure with its margin);
- sampled (T > 0), any mode: every token follows the target's distribution (speculative
  sampling; tests/engine/test_sampling.py checks it statistically);
- greedy, exact mode (`exact=True`): speculative output equals the exact AR output of the same
  `exact_block_size` bit for bit, in any dtype, and each batch row equals the same prompt run
  alone, for both `exact_impl`s (`"rows"`; `"invariant"`, the default on CUDA);
  tests/gpu/test_exact_mode.py checks it in bf16 at the Qwen3-8B shape.

On CUDA the step replays from CUDA graphs (`graphs=False`: the eager loop). How the loop keeps
the host off the step's critical path, and how each exact mode makes every target forward
independent of N and of the batch: docs/ARCHITECTURE.md, "Engine loop".
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dflash2.engine.cache import static_attention
from dflash2.engine.compiled import compile_modules, eager_forward, is_compiled, strict_recompiles
from dflash2.engine.draft import DFlash2Proposer
from dflash2.engine.graphs import GRAPH_KV_BUCKET, StepGraphs
from dflash2.engine.inputs import GenerateInputError, check_generate_inputs
from dflash2.engine.kept import free_idle_states, keep_state, kept_state, state_key
from dflash2.engine.reports import ACC, ACTIVE, BAD, DONE, END, NEW, VLEN
from dflash2.engine.sampling import invalid_rows, row_seeds
from dflash2.engine.settings import EngineSettings
from dflash2.engine.prefill import prefill_rows, prefill_shape, run_prefill
from dflash2.engine.state import LEN_BUCKET, DecodeState, batch_bucket, round_up
from dflash2.engine.stats import StepTimes, summarize
from dflash2.engine.verify import target_draw
from dflash2.target import TargetModel

EXACT_KV_BUCKET = 1024  # exact mode: K/V slots per row rounded up to a multiple of this
KV_BUCKET = 128  # normal mode on CUDA: attention's K/V length rounded up to a multiple of this
CPU_KV_BUCKET = 0  # the same on CPU (0 = exact lengths; tests set it to exercise the bucketed path)
# On CUDA: a batched prefill forward's length (every row's), rounded up
# to a multiple of this (`dflash2.engine.prefill.prefill_length`). The prompts' SDPA (cuDNN on
# Hopper) builds a plan per new shape, ~50 ms each for a 135M target on an H100, and the graph
# path captures a prefill graph per shape: with the bucket, each serves every prompt length of it.
PREFILL_BUCKET = 64
CPU_PREFILL_BUCKET = 0  # the same on CPU (0 = exact lengths; tests set it to exercise the padded prefill)


@dataclass
class SpeculativeOutput:
    """Result of `speculative_generate`.

    Attributes:
        sequences: per row, prompt + generated tokens (1-D int64, CPU).
        accepted: per row, per step, accepted draft tokens (0..N; all 0 for AR).
        prompt_lengths: per row.
        finish_reasons: per row, `"stop"` (a stop token was emitted) or `"length"`.
        num_speculative_tokens: N used.
        times: wall times per step (see `StepTimes`).
        verify_lengths: per row, per step, the step's verify length: the drafted tokens it could
            accept (N with `verify="chain"`, 1..N with `"adaptive"`, 0 for AR); `accepted[b][k] <=
            verify_lengths[b][k]`, and a ragged verify would score `verify_lengths[b][k] + 1` rows.
        settings: the call's resolved `EngineSettings` (kernels, linear and attention impls, exact
            mode, compile level, graphs, verify policy): what ran, for the caller to record.
    """

    sequences: list[torch.Tensor]
    accepted: list[list[int]]
    prompt_lengths: list[int]
    finish_reasons: list[str]
    num_speculative_tokens: int
    times: StepTimes = field(default_factory=StepTimes)
    verify_lengths: list[list[int]] = field(default_factory=list)
    settings: EngineSettings | None = None

    @property
    def generated(self) -> list[torch.Tensor]:
        """Per row, the generated tokens only."""
        return [s[p:] for s, p in zip(self.sequences, self.prompt_lengths)]

    @property
    def timings(self) -> dict[str, float]:
        return self.times.summary()

    def stats(self) -> dict:
        """tau (pooled and per-request mean, both including the bonus), per-position
        acceptance and accepted-length histogram; see `dflash2.engine.stats`."""
        return summarize(self.accepted, self.num_speculative_tokens)


def _stop_tensor(stop_token_ids: list[int] | None, device) -> torch.Tensor | None:
    return None if stop_token_ids is None else torch.tensor(stop_token_ids, dtype=torch.long, device=device)


def _check_valid(bad: list[bool], what: str, step: int) -> None:
    rows = [i for i, x in enumerate(bad) if x]
    if rows:
        raise ValueError(
            f"{what} at step {step} for rows {rows} contain NaN, +inf or no finite entry; refusing to emit "
            "tokens from them (check the model's dtype/weights, or the inputs of those rows)"
        )


@torch.no_grad()
def speculative_generate(
    target,
    draft,
    input_ids,
    *,
    max_new_tokens: int,
    num_speculative_tokens: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | Sequence[int] | None = None,
    stop_token_ids: int | Sequence[int] | None = None,
    impl: str = "auto",
    timing: bool = False,
    exact: bool = False,
    exact_block_size: int | None = None,
    graphs: bool | None = None,
    compile_level: str | None = "auto",
    attention_impl: str = "auto",
    linear_impl: str = "auto",
    exact_impl: str = "auto",
    progress: Callable[[int], object] | None = None,
    verify: str = "chain",
    tree_budget: int | None = None,
) -> SpeculativeOutput:
    """Generate with DFlash2 speculative decoding (or the AR baseline), losslessly.

    Args:
        target: a `TargetModel` or a plain HF causal LM (Qwen3 / Llama families).
        draft: a `DFlash2DraftModel` (v1 or v2 checkpoint), any proposer with
            `propose(DraftStep) -> Proposal` plus `block_size` and `target_layer_ids`
            attributes, or None for the AR baseline.
        input_ids: `[B, P]` tensor, or a list of 1-D tensors/lists (prompts may differ in length).
        max_new_tokens: cap on generated tokens per row.
        num_speculative_tokens: N in 0..block_size-1 (default block_size - 1; 0 = AR).
        temperature: 0 = greedy; > 0 samples (p shaped by T, top-k, top-p; q by T only).
        top_p, top_k: target-side filters (1.0 / 0 = off); ignored when greedy.
        seed: base seed; row b uses `row_seed(seed, b)`. A list gives one seed per row (row b
            then samples exactly as a batch of one with `seed=seed[b]`). None draws one.
        stop_token_ids: tokens that end a row (the stop token is kept in the output).
        impl: kernel implementation, `"auto" | "torch" | "triton"`, resolved once by the input
            checks into the call's `EngineSettings` (`dflash2.engine.settings`), which is passed
            down: nothing is set on the target or the draft.
        timing: synchronize the device before each phase reading and wait for each step's
            report right after launching it (accurate per-step device times, slower calls).
        exact: exact mode (module docstring): greedy speculative output equals AR output bit
            for bit in any dtype, and each row equals the same prompt run alone. Compare an exact
            run with an exact AR run of the same `exact_block_size`.
        exact_block_size: exact mode's block width (default: the draft's `block_size`); must exceed
            N: the padded width of every target forward with `exact_impl="rows"`, the attention's
            fixed query tile with `"invariant"`. Required in exact mode without a draft (or
            with a proposer that has no `block_size`): runs compare bit for bit only at one width.
        graphs: replay the steady-state step from CUDA graphs (`dflash2.engine.graphs`). None
            (default) = on for a CUDA target outside exact mode whose proposer can be captured
            (the DFlash2 draft, the AR baseline, or a proposer with `graph_safe = True`); False =
            the eager loop; True = on, or an error saying why it cannot be. With graphs the rows run in
            a batch bucket, and the state and its graphs are kept on the target for later calls
            with the same settings (the most recently used few, `dflash2.engine.kept`;
            `release_decode_state(model)` frees them).
        compile_level: `"auto"` (default: `"light"` on CUDA, in normal mode and in exact mode
            with the invariant kernels; off on CPU and in exact mode `"rows"`), None (off),
            `"light"` or `"full"`: compile the target's (and a DFlash2 draft's) small-kernel
            modules with `torch.compile` first, in place and once per model
            (`dflash2.engine.compiled`): fused norm / activation (and, "full", attention-side)
            kernels. The prefill stays uncompiled; each new shape class pays its compile once (a
            first call of a shape takes seconds longer). Exact mode takes `"light"` with the
            invariant kernels only (`dflash2.engine.inputs.resolve_compile`). With None, a model
            an earlier call compiled runs its stock code (compiled code runs eagerly in the call).
        attention_impl: the target attention's kernel, `"auto"` (default: Triton on CUDA, the
            reference on CPU) | `"torch"` (SDPA with a per-row mask) | `"triton"`, resolved once
            (`dflash2.kernels.row_attention`; docs/PERFORMANCE.md compares the two). Exact mode
            keeps its own kernel.
        linear_impl: the target's and the draft's linear layers at decode and verify sizes (at
            most 32 rows): `"auto"` (default: Triton on CUDA, `F.linear` elsewhere) | `"torch"`
            (`F.linear`) | `"triton"` (the small-M
            weight-streaming kernel, `dflash2.kernels.linear`, through a function mode owned by the
            decoding state; under `compile_level` the compiled modules call it as an opaque operator,
            one per linear; outside compiled modules each attention's q/k/v and each MLP's gate/up
            run as one launch that reads the members' weights in place). Exact mode picks its own
            kernels: `"auto"` leaves them, `"triton"` is refused there.
        exact_impl: how exact mode makes a row independent of its batch: `"rows"` (every target
            forward row by row, eagerly, with the stock kernels) | `"invariant"` (one batched
            forward through batch-invariant kernels, replayed from CUDA graphs: module docstring)
            | `"auto"` (default: invariant on a CUDA target whose kernels take it, else rows).
            Ignored outside exact mode.
        progress: called on the host with the number of tokens committed over all rows, once
            after the prefill and once per step as its report is read (a progress bar's hook:
            the counts add up to the generated tokens; it never changes an output).
        verify: the verify-length policy (`dflash2.engine.verify`): `"chain"` (default: every step
            may accept all N drafted tokens) | `"adaptive"` (per row and step, a length in 1..N set
            by the row's earlier accepted counts alone, applied by truncating acceptance within the
            same fixed-shape block; lossless like `"chain"`: greedy equals AR, exact mode bit for
            bit, sampled output follows the target's law). Recorded in `verify_lengths`. `"tree"`:
            each step's target forward runs over a token tree of `tree_budget` nodes (the root,
            the drafted chain, then the best-first candidates by the selector's path scores;
            `dflash2.engine.tree`) and commits the longest root path whose every token is the
            target's own token at its position (argmax, or its keyed draw at T > 0): output equals
            the AR loop's for the same logits (greedy: AR's path; exact mode: bit for bit, each
            path confirmed by a second, exact chain forward); graph-captured like the chain.
        tree_budget: nodes of each step's tree, root included, in 1..64 (`verify="tree"` only).
    Returns:
        `SpeculativeOutput`.
    """
    # Every argument is checked on the host before any device work (ids, dtypes, ranges,
    # position limit, draft/target fit); see dflash2.engine.inputs.
    if progress is not None and not callable(progress):
        raise GenerateInputError(f"progress: {progress!r} is not callable. Fix: pass a function of one int, or None.")
    checked = check_generate_inputs(
        target, draft, input_ids, max_new_tokens=max_new_tokens, num_speculative_tokens=num_speculative_tokens,
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop_token_ids=stop_token_ids, impl=impl,
        timing=timing, exact=exact, exact_block_size=exact_block_size, graphs=graphs, compile_level=compile_level,
        attention_impl=attention_impl, linear_impl=linear_impl, exact_impl=exact_impl, verify=verify,
        tree_budget=tree_budget)
    tgt: TargetModel = checked.target
    rows, n_spec, draft = checked.rows, checked.num_speculative_tokens, checked.draft
    proposer_like = draft is not None and hasattr(draft, "propose")
    layer_ids = list(draft.target_layer_ids if proposer_like else draft.config.target_layer_ids) if draft else []

    device = tgt.device
    bsz = len(rows)
    plen_host = [r.numel() for r in rows]
    p_max = max(plen_host)
    if max_new_tokens == 0:
        return SpeculativeOutput([r.cpu() for r in rows], [[] for _ in rows], plen_host, ["length"] * bsz, n_spec,
                                 verify_lengths=[[] for _ in rows], settings=checked.settings)

    engine = checked.settings  # resolved once, passed down (dflash2.engine.settings): nothing is set on the models
    if engine.compile_level is not None:
        compile_modules(tgt, tgt.decoder_layers, engine.compile_level)
        if engine.exact:
            strict_recompiles()
        if draft is not None and not proposer_like:  # a DFlash2 draft model; its attention is ours: light only
            compile_modules(draft, draft.layers, "light")
    # On CUDA a K/V length that grows by one every step gives attention a new shape every step,
    # and each new shape costs the default SDPA path a new plan (docs/PERFORMANCE.md, exact mode,
    # measures the difference). Masked tail
    # slots change no result, so the length is rounded up to a bucket. The CPU keeps exact lengths.
    kv_bucket = KV_BUCKET if device.type == "cuda" else CPU_KV_BUCKET
    sync = timing and device.type == "cuda"

    def clock() -> float:
        if sync:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    # Width of every target forward after prefill: N + 1, or the padded block of exact mode's rows
    # impl. The invariant impl runs N + 1 wide: its kernels fix their tiles (the attention's query
    # tile by exact_block_size), so a token's bits do not depend on the block it sits in.
    width = engine.exact_block_size if exact and not engine.invariant_exact else n_spec + 1
    # Slots: prompt + max_new_tokens; the last block written reaches start + W - 1 <= P + max_new - 3 + W.
    max_len = p_max + max_new_tokens + max(width, engine.tree_budget)  # a tree writes its B nodes past start
    if exact:
        # One K/V length for every call whose rows fit the same bucket, so a row sees the same
        # attention shapes alone and in any batch (the kernel is tail-invariant as well).
        max_len = round_up(max_len, EXACT_KV_BUCKET)
    stops = _stop_tensor(checked.stop_token_ids, device)
    sampled = temperature > 0
    settings = dict(n_spec=n_spec, width=width, sampled=sampled, top_k=top_k if sampled else 0,
                    top_p=top_p if sampled else 1.0, n_stops=None if stops is None else stops.numel(),
                    layer_ids=layer_ids, engine=engine)
    # The graph path runs in a batch-bucket state kept on the target for later calls
    # (dflash2.engine.state), keyed by the draft or proposer object and its tensors' storage: a
    # later call with the same one replays its graphs.
    state, key, batch = None, None, bsz
    if engine.graphs:
        batch = bsz if proposer_like else batch_bucket(bsz)  # a custom proposer is built for its rows
        key = state_key(tgt, draft, **settings)
        state = kept_state(tgt, key, batch, max_len)
        max_len = round_up(max_len, LEN_BUCKET)
    if state is None:
        def build() -> DecodeState:
            if draft is None or proposer_like:
                proposer = draft
            else:
                # A captured step cannot synchronize, so with graphs the proposer's own phase clock never syncs.
                proposer = DFlash2Proposer(draft, tgt, batch, max_len, engine.kernel_impl,
                                           time.perf_counter if engine.graphs else clock,
                                           attention_impl=engine.attention_impl, tree=engine.verify == "tree")
            return DecodeState(tgt, proposer, batch=batch, max_len=max_len, key=key, **settings)

        try:
            state = build()
        except torch.OutOfMemoryError:
            # The states kept for other calls hold device memory this one needs: free the idle ones, once.
            if not free_idle_states(tgt):
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            state = build()
        state.lock.acquire()
        if key is not None:
            keep_state(tgt, state)
    # compile_level=None runs the stock code even on models an earlier call compiled in place.
    stock = engine.compile_level is None and is_compiled(tgt, draft)
    try:
        with eager_forward(stock):
            return _decode(state, tgt, rows, checked, max_new_tokens=max_new_tokens, temperature=temperature,
                           stops=stops, kv_bucket=kv_bucket, clock=clock, sync=sync, pipelined=not timing,
                           progress=progress)
    finally:
        state.lock.release()


def _decode(state: DecodeState, tgt: TargetModel, rows: list[torch.Tensor], checked, *, max_new_tokens: int,
            temperature: float, stops, kv_bucket: int, clock, sync: bool, pipelined: bool,
            progress: Callable[[int], object] | None = None) -> SpeculativeOutput:
    """Prefill, then the decoding loop on `state` (its rows 0..len(rows)-1), then the outputs."""
    device, exact, n_spec, layer_ids = tgt.device, state.exact, state.n_spec, state.layer_ids
    bsz, batch, cache = len(rows), state.batch, state.cache
    plen_host = [r.numel() for r in rows]
    p_max = max(plen_host)
    times = StepTimes(synchronized=sync)

    with static_attention(tgt.model):
        t_start = clock()
        with state.prefill_modes():
            state.load(rows, temperature, row_seeds(checked.seed, bsz, device), max_new_tokens, stops)
            plens = state.plens[:bsz]
            prompt_pos = torch.arange(p_max, device=device)[None]
            if exact and not state.engine.invariant_exact:  # "rows": each prompt alone, eager
                with eager_forward(state.engine.compile_level is not None):  # prompt shapes: no compile
                    first_logits, prefill_features = prefill_rows(tgt, rows, cache, layer_ids, p_max,
                                                                  state.engine.attention_impl)
            else:
                # Batched, prompts right-padded in `tokens` (zeros past each prompt; the padding sits at
                # slots the rows overwrite later). Invariant exact mode runs under the step modes
                # (`prefill_modes`): every row's bits are its prompt's alone. On the graph path one
                # graph per prefill shape, replayed by later calls of that shape.
                shape = prefill_shape(plen_host, max_len=state.max_len, invariant=state.engine.invariant_exact,
                                      tile=state.engine.exact_block_size,
                                      bucket=PREFILL_BUCKET if device.type == "cuda" else CPU_PREFILL_BUCKET)
                with eager_forward(state.engine.compile_level is not None):  # prompt shapes: no compile
                    first_logits, feats, times.prefill_graph = run_prefill(state, shape)
                prefill_features = None if feats is None else feats[:, :p_max]
            _check_valid(invalid_rows(first_logits).tolist(), "target logits", 0)
            first = target_draw(state.target_probs_input(first_logits), state.temps[:bsz], state.seeds[:bsz],
                                plens[:, None], state.engine.kernel_impl)[:, 0]
            if batch > bsz:  # idle bucket rows: token 0, no features
                first = torch.cat([first, first.new_zeros(batch - bsz)])
                if prefill_features is not None:
                    prefill_features = torch.cat([prefill_features, prefill_features.new_zeros(
                        batch - bsz, *prefill_features.shape[1:])])
            state.start(first, (prefill_features, prompt_pos.expand(batch, p_max), state.plens.clone()))
        times.prefill = clock() - t_start
        if progress is not None:
            progress(bsz)   # the prefill commits each row's first token
        # Every buffer the step reads or writes is static and updated in place, so the step can run
        # eagerly or as a captured CUDA graph (dflash2.engine.graphs) on the same state. The AR arm
        # and a proposer that absorbed the prompt's features in `start` read only those buffers from
        # the first step on (it replays too); another proposer's first step reads the prompt's.
        runner = None
        if state.engine.graphs:
            if state.runner is None:
                state.runner = StepGraphs(state.step, device)
            runner = state.runner
            captures_before = runner.captures
        with state.step_modes(), collector_paused():
            steps, last = _run_steps(state, runner, times, plen_host, max_new_tokens=max_new_tokens,
                                     kv_bucket=kv_bucket, clock=clock, pipelined=pipelined, progress=progress)
        if runner is not None:
            times.graph_captures, times.graph_error = runner.captures - captures_before, runner.failed
        times.total = clock() - t_start

    history = state.reports.history(steps)
    acc_hist, act_hist = history[:, ACC, :bsz], history[:, ACTIVE, :bsz] == 1
    accepted = [acc_hist[act_hist[:, b], b].tolist() for b in range(bsz)]
    verify_lengths = [history[act_hist[:, b], VLEN, b].tolist() for b in range(bsz)]
    gen_host = [1] * bsz if last is None else (last[END, :bsz] - np.asarray(plen_host)).tolist()
    tok_cpu = state.tokens[:bsz].cpu()
    reasons = ["stop" if h else "length" for h in state.hit_stop[:bsz].tolist()]
    seqs = [tok_cpu[b, : plen_host[b] + gen_host[b]].clone() for b in range(bsz)]
    return SpeculativeOutput(seqs, accepted, plen_host, reasons, n_spec, times, verify_lengths, state.engine)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, then back in its previous state (also
    on an exception). The decoding loop runs inside it: the loop allocates few objects, while one
    full collection in a process holding compiled models walks all of theirs and can outlast the
    step queued ahead of the host, which the device then waits for."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run_steps(state: DecodeState, runner, times: StepTimes, plen_host: list[int], *, max_new_tokens: int,
               kv_bucket: int, clock, pipelined: bool,
               progress: Callable[[int], object] | None = None) -> tuple[int, np.ndarray | None]:
    """The decoding loop after the prefill: steps until every row is done.

    Pipelined (the default), step k+1 is launched before the host waits for step k's report
    (`dflash2.engine.reports`), so the host never blocks on the step it just launched and the
    device never idles between steps. When a report shows every row done, the step launched after
    it runs on finished rows only, which changes no output (they commit nothing; the device-side
    finished flags gate every write that an output reads). The host waits for a step before
    launching the next only when that step is expected to finish every row: each active row's
    budget left is at most the call's mean tokens per row and step so far (1 for AR, so an AR call
    ends without an extra step). A wrong guess costs either one step on finished rows or one host
    wait, never an output change. `pipelined=False` (the `timing` mode) waits for each step right
    after launching it.

    Per-step host work is a few vectorized reads of the report; the accepted counts are read from
    the report history once per call. `times` gets, per step the device ran (a lookahead step
    included), `replayed` and `verify`: the verify phase of an eager step with phase readings, or
    else the host time from the previous report's arrival to this one's (the step's wall time).

    Returns:
        `(steps, last)`: steps run, and the last report read (`[REPORT_ROWS, B]`, None if no step ran).
    """
    bsz, n_spec, reports = len(plen_host), state.n_spec, state.reports
    reports.reserve(max_new_tokens + 1)  # each step commits a token per active row: <= max_new_tokens steps
    plens = np.asarray(plen_host)
    done = bool(state.done.all())  # one read after the prefill (which synchronized already)
    end_max = max(plen_host) + 1  # the largest committed length among the reports read
    committed = row_steps = 0  # tokens committed and row-steps run by the active rows, over the reports read
    may_end = max_new_tokens - 1 <= 1  # the oldest unread step is expected to finish every row
    launched = seen = 0
    t_prev = clock()
    t0s: list[float] = []
    last = None
    while not done or launched > seen:
        if not done:
            launched += 1
            # Rows grow by at most N + 1 per step and a step writes `reach` slots past its anchor:
            # bound the K/V length over the steps not yet read.
            kv_need = end_max + state.reach + (launched - 1 - seen) * (n_spec + 1)
            if runner is not None and (launched > 1 or state.first_step_replays):
                # Graph buckets are coarser than eager ones: fewer captures; masked tail slots are free.
                t0s.append(clock())
                t_launch = time.perf_counter()
                times.replayed.append(runner.step(min(round_up(kv_need, GRAPH_KV_BUCKET), state.max_len)))
                times.launch.append(time.perf_counter() - t_launch)
            else:
                kv_len = round_up(kv_need, kv_bucket) if kv_bucket else kv_need  # a new shape every bucket only
                t0s.append(state.step(kv_len, record=times, clock=clock))  # (the cache caps it at its slots)
                if runner is not None:
                    times.replayed.append(False)
            reports.post(launched)
        # Wait for the oldest unread step once another is queued behind it, or when it may be the last.
        while launched > seen and (done or not pipelined or may_end or launched - seen >= 2):
            seen += 1
            last = reports.wait(seen)
            t_now = clock()
            times.verify.append(t_now - max(t0s[seen - 1], t_prev))
            t_prev = t_now
            bad = last[BAD, :bsz]
            if bad.any():
                _check_valid(bad.astype(bool).tolist(), "target or draft logits", seen)
            if done:  # a lookahead step on finished rows: nothing to update
                continue
            ends = last[END, :bsz]
            end_max = int(ends.max())
            done = bool(last[DONE].all())
            new = int(last[NEW, :bsz].sum())
            committed += new
            if progress is not None:
                progress(new)
            row_steps += int(last[ACTIVE, :bsz].sum())
            left = max_new_tokens - (ends - plens)  # budget left per row
            may_end = bool(left[last[DONE, :bsz] == 0].max(initial=0) <= committed / max(row_steps, 1))
            if done:
                break
    return seen, last
