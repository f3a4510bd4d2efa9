"""The prefill: the prompts' target forward before the first decoding step, and its shape.

A call's prefill writes each prompt's K/V into the decoding state's cache and gives each row's
first-token logits and (for a drafter) the prompt's target features. Two kinds:

- **Batched** (`prefill_forward`, normal mode and invariant exact mode): the prompts, right-padded
  in the state's `tokens` buffer, all at one `prefill_length` (the longest prompt rounded up to a
  bucket, so attention plans and graphs serve every prompt length of a bucket), in contiguous row
  groups of a `PrefillShape` (`prefill_group_rows`): at most `PREFILL_ROWS` rows each (a group's
  first logits pass through `[rows, rows, V]`) and, in invariant exact mode, at most
  `PREFILL_TOKENS` padded tokens (the invariant kernels' workspaces). The shape is then a function
  of the row count and the padded length alone, the prompt class that the evaluation's warm-up
  pays (`dflash2.evaluation.running.warmup`). Invariant exact mode runs the invariant kernels (the
  caller enters the state's step modes), the attention in query tiles of `exact_block_size`, so
  nothing a row computes depends on the other rows, its group or the padding.
- **Row by row** (`prefill_rows`, exact mode `"rows"`): each prompt alone at its own length.

`prefill_forward` reads nothing but the state's static buffers (`tokens`, `plens`, the cache) and
the shape, the host value that fixes every kernel and tensor size, so
the graph path captures it once per shape and replays it for every later call of that shape
(`dflash2.engine.graphs.StepGraphs`, keyed by the `PrefillShape`): a prefill then costs one
graph launch instead of an eager forward of the stock modules, which at small targets is host
time (docs/PERFORMANCE.md, "Defaults"). Each row's first logits come from its own last prompt
position (`logits_to_keep` = the per-row last index, a device tensor: `[rows, rows, V]` logits
of which the diagonal is kept), with no host read of the lengths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dflash2.engine.graphs import StepGraphs
from dflash2.engine.settings import EXACT_PREFILL_SPLIT_KEYS
from dflash2.engine.state import DecodeState, round_up

if TYPE_CHECKING:
    from dflash2.engine.cache import StaticTargetCache
    from dflash2.target import TargetModel

# A batched prefill forward's rows (its kept logits are [rows, rows, V]) and, in invariant exact mode,
# padded prompt tokens (bounds the invariant kernels' workspaces).
PREFILL_TOKENS = 8192
PREFILL_ROWS = 32


def prefill_length(p_max: int, max_len: int, bucket: int) -> int:
    """A batched prefill forward's length for prompts of at most `p_max` tokens: `p_max` rounded up
    to a multiple of `bucket` (0: `p_max`), within the state's `max_len` slots. The padded slots
    hold token 0 at positions past each prompt: no prompt token attends to them, and a row
    overwrites each before anything reads it (a step writes its block's K/V before its attention)."""
    if bucket <= 0:
        return p_max
    return min(round_up(p_max, bucket), max_len)


def prefill_group_rows(length: int, invariant: bool, budget: int | None = None) -> int:
    """Rows per batched prefill forward at `length` padded tokens: `PREFILL_ROWS`, and in invariant
    mode also at most `budget` (default `PREFILL_TOKENS`) tokens, `budget // length` rows (at least
    one: a prompt longer than the budget runs alone)."""
    if not invariant:
        return PREFILL_ROWS
    budget = PREFILL_TOKENS if budget is None else budget
    return max(1, min(PREFILL_ROWS, budget // max(length, 1)))


@dataclass(frozen=True)
class PrefillShape:
    """What fixes a batched prefill's kernels and sizes (the graph path's key for it).

    Attributes:
        rows: the prompts (rows `0..rows-1` of the state).
        length: every row's padded length (>= every prompt).
        group_rows: rows per forward (`prefill_group_rows`); the last group may hold fewer.
        invariant: the invariant exact mode's kernels and attention (else normal mode's).
        tile: the attention's query tile (invariant; `exact_block_size`), else 0.
    """

    rows: int
    length: int
    group_rows: int
    invariant: bool = False
    tile: int = 0

    @property
    def groups(self) -> tuple[tuple[int, int, int], ...]:
        """One forward per group, `(start, rows, length)`: rows `start..start+rows-1`."""
        return tuple((a, min(self.group_rows, self.rows - a), self.length)
                     for a in range(0, self.rows, self.group_rows))


def prefill_shape(lengths: list[int], *, max_len: int, bucket: int, invariant: bool = False,
                  tile: int = 0, budget: int | None = None) -> PrefillShape:
    """The `PrefillShape` of prompts of `lengths` (host ints, row order) in a state of `max_len`
    slots: every row at `prefill_length` of the longest prompt, in consecutive groups of
    `prefill_group_rows` rows (`budget`: invariant mode's token budget, default `PREFILL_TOKENS`).
    Two calls with as many prompts whose longest pads to the same length get the same shape."""
    if not lengths:
        raise ValueError("a prefill needs at least one prompt")
    n = prefill_length(max(lengths), max_len, bucket)
    return PrefillShape(len(lengths), n, prefill_group_rows(n, invariant, budget), invariant=invariant,
                        tile=int(tile) if invariant else 0)


def prefill_forward(state: DecodeState, shape: PrefillShape) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The batched prefill of the prompts loaded in `state` (`DecodeState.load`), of `shape`.

    Writes the prompts' K/V into rows `0..shape.rows-1` of `state.cache`. Reads only static
    buffers and allocates its outputs, so it may be captured and replayed (a replay rewrites the
    captured outputs).

    Returns:
        `(first_logits [rows, 1, V], features [rows, shape.length, n*H] or None)`; features past a
        row's end are zero in invariant mode, unspecified in normal mode.
    """
    tgt, cache, device = state.tgt, state.cache, state.tokens.device
    logits, feats = [], []
    n = shape.length
    positions = torch.arange(n, device=device)[None].expand(shape.rows, n)
    for start, rows, _ in shape.groups:
        pos = positions[:rows]
        last = state.plens[start:start + rows] - 1                           # [rows], on the device
        if shape.invariant:
            cache.prepare(pos, kv_len=n, rows=rows, start=start)
            kw = cache.attention_kwargs("triton", split_keys=EXACT_PREFILL_SPLIT_KEYS, tile_queries=shape.tile)
        else:
            cache.prepare(pos, kv_len=n, rows=rows if state.batch > rows else None, start=start)
            kw = cache.attention_kwargs(state.engine.attention_impl)
        out = tgt(state.tokens[start:start + rows, :n], position_ids=pos, past_key_values=cache,
                  layer_ids=state.layer_ids, logits_to_keep=last, **kw)
        r = torch.arange(rows, device=device)
        logits.append(out.logits[r, r][:, None])                             # row i at its own last position
        if out.features is not None:
            f = out.features
            if shape.invariant:
                f = f.masked_fill((pos > last[:, None])[..., None], 0)
            feats.append(f)
    return torch.cat(logits), (torch.cat(feats) if feats else None)


def run_prefill(state: DecodeState, shape: PrefillShape) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """`prefill_forward(state, shape)` on the state's engine path: with graphs, through the
    state's prefill `StepGraphs` (created here, kept with the state), else eagerly.

    Returns:
        `(first_logits, features, how)`, the first two as `prefill_forward` gives them, `how` one of
        `"replay"` (a captured graph ran), `"capture"` (ran eagerly, then captured for its shape),
        `"eager"`.
    """
    if not state.engine.graphs:
        return (*prefill_forward(state, shape), "eager")
    if state.prefill_runner is None:
        state.prefill_runner = StepGraphs(functools.partial(prefill_forward, state), state.tokens.device,
                                          what="the prefill")
    runner = state.prefill_runner
    captures = runner.captures
    replayed, (first, feats) = runner.run(shape)
    return first, feats, "replay" if replayed else "capture" if runner.captures > captures else "eager"


def prefill_rows(tgt: TargetModel, rows: list[torch.Tensor], cache: StaticTargetCache, layer_ids: list[int],
                 p_max: int, kernel: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact-mode prefill (`"rows"`): each prompt alone (a batch of one at its own length, written
    into row b's slots of `cache`), so prefill shapes never depend on the other rows.

    Returns:
        `(first_logits [B, 1, V], features [B, p_max, n*H] or None)`, features zero past a row's end.
    """
    device = cache.lengths.device
    logits, feats = [], []
    for b, r in enumerate(rows):
        n = r.numel()
        pos = torch.arange(n, device=device)[None]
        cache.prepare(pos, kv_len=n, row=b)
        out = tgt(r.to(device)[None], position_ids=pos, past_key_values=cache, layer_ids=layer_ids, logits_to_keep=1,
                  **cache.attention_kwargs(kernel, exact=True))
        logits.append(out.logits[:, -1:])
        if out.features is not None:
            feats.append(torch.nn.functional.pad(out.features, (0, 0, 0, p_max - n)))
    return torch.cat(logits), (torch.cat(feats) if feats else None)
