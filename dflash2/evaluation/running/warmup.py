"""Untimed warm-up calls of an evaluation: each one-time cost is paid before the timed calls.

A first call pays for things later calls reuse. Examples: a decode state (cache and graph pools)
for its row bucket and slot count, a CUDA-graph capture per K/V bucket its steps reach, compiled
frames per shape class, and cuDNN / Triton plans for a prompt shape. The runner times each arm
over its own calls (`timing`), and the AR arm runs first in every chunk. Without a warm-up,
whichever arm meets such a cost first is charged for setup that every arm then shares.
`Warmup` pays these costs untimed, with the run's own engine settings:

- `phase(rows, prompts)`, at the start of each phase (turn 1, then MT-Bench turn 2, whose prompts
  hold AR's answers): every arm that reads no reference tokens runs calls of `rows` rows at the
  run's `max_new_tokens`. Their prompts are synthetic, from the phase's longest prompt down to
  its shortest in steps of `max_new_tokens`, longest first. The first call builds each arm's
  state at its full size, and the rest reuse it, so together they capture the graph of every
  K/V bucket a timed call reaches. These calls pass the run's number of stop tokens (part of a
  state's identity), all set to the vocabulary's last id. Chat models do not emit that id; if
  one does, the call ends early and only the warm-up's coverage is lost.
- `chunk(prompts)`, before each chunk's timed arms: a chunk with a new row bucket (the last,
  shorter chunk) reruns the phase's calls at its row count. A chunk with a new prompt class
  (row count, longest prompt in `PREFILL_BUCKET`s: what fixes the prefill's shape and graph,
  `dflash2.engine.prefill.prefill_shape`) gets one short call of every such arm on
  its own prompts (`max_new_tokens=2`: the prefill and the first step, where a drafter reads
  the prompt's features). Prompt-shape costs are then charged to no arm.

The number of calls and their seconds go to summary.json (`end_to_end.warmup`). No warm-up call
writes a record or adds to an arm's timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dflash2.engine.generate import PREFILL_BUCKET
from dflash2.engine.state import batch_bucket

# (arm, prompts, max_new_tokens, stop_token_ids) -> None: one untimed generation call
Generate = Callable[[object, list[list[int]], int, list[int] | None], object]

WARM_FIRST_STEP_TOKENS = 2  # a prompt class's warm call: the prefill and the first decoding step


def warm_lengths(shortest: int, longest: int, step: int) -> list[int]:
    """Prompt lengths of a phase's warm-up calls: `longest`, `longest - step`, ... while above
    `shortest`, then `shortest` (longest first, so the first call builds the largest state)."""
    if not 1 <= shortest <= longest or step < 1:
        raise ValueError(f"warm_lengths({shortest}, {longest}, {step}): need 1 <= shortest <= longest, step >= 1")
    lengths = list(range(longest, shortest, -step))
    return lengths + [shortest]


def synthetic_prompt(source: Sequence[int], length: int) -> list[int]:
    """`length` tokens: `source` repeated (then cut), a prompt of the run's own tokens."""
    if not source:
        raise ValueError("synthetic_prompt needs a non-empty source prompt")
    reps = -(-length // len(source))
    return (list(source) * reps)[:length]


@dataclass
class Warmup:
    """The warm-up calls of one evaluation process (module docstring).

    Attributes:
        generate: runs one untimed call of an arm with the run's engine settings.
        arms: the run's arms, the AR baseline first; arms that need reference tokens are skipped.
        max_new_tokens: the run's generation length.
        n_stops: how many stop tokens the run passes (0: none).
        vocab: the target's vocabulary size (the warm calls' stop id is `vocab - 1`).
        clock: a synchronizing clock (seconds).
        calls, seconds: warm-up calls made and their wall time.
    """

    generate: Generate
    arms: Sequence
    max_new_tokens: int
    n_stops: int
    vocab: int
    clock: Callable[[], float]
    calls: int = 0
    seconds: float = 0.0
    _span: tuple[list[int], int] | None = None     # the current phase's longest prompt, its shortest length
    _rows: set[int] = field(default_factory=set)   # row buckets warmed in this phase
    _classes: set[tuple[int, int]] = field(default_factory=set)

    def _warm_arms(self) -> list:
        return [a for a in self.arms if not a.spec.needs_references]

    def _call(self, arm, prompts: list[list[int]], max_new_tokens: int, stops: list[int] | None) -> None:
        t0 = self.clock()
        self.generate(arm, prompts, max_new_tokens, stops)
        self.seconds += self.clock() - t0
        self.calls += 1

    def _full_length(self, rows: int) -> None:
        longest, shortest = self._span
        stops = [self.vocab - 1] * self.n_stops if self.n_stops else None
        for length in warm_lengths(shortest, len(longest), self.max_new_tokens):
            prompt = synthetic_prompt(longest, length)
            for arm in self._warm_arms():
                self._call(arm, [prompt] * rows, self.max_new_tokens, stops)
        self._rows.add(batch_bucket(rows))

    def phase(self, rows: int, prompts: Sequence[list[int]]) -> None:
        """Warm a phase whose chunks have `rows` rows (fewer for its last chunk) and whose prompts
        are `prompts` (its samples still to generate; nothing runs for none)."""
        if not prompts or rows < 1:
            return
        self._span = (list(max(prompts, key=len)), min(len(p) for p in prompts))
        self._rows = set()
        self._full_length(min(rows, len(prompts)))

    def chunk(self, prompts: Sequence[list[int]], stops: list[int] | None) -> None:
        """Warm whatever this chunk (`prompts`, generated with `stops`) would meet first."""
        if not prompts or self._span is None:
            return
        rows = batch_bucket(len(prompts))
        if rows not in self._rows:
            self._full_length(len(prompts))
        key = (len(prompts), -(-max(len(p) for p in prompts) // PREFILL_BUCKET))  # the prefill's shape
        if key in self._classes:
            return
        self._classes.add(key)
        for arm in self._warm_arms():
            self._call(arm, [list(p) for p in prompts], WARM_FIRST_STEP_TOKENS, stops)

    def summary(self) -> dict:
        """summary.json's `end_to_end.warmup`."""
        return {"calls": self.calls, "seconds": self.seconds,
                "what": "untimed calls before the timed ones: per phase, every arm at the run's max_new_tokens "
                        "over its prompt lengths (states, graphs, compiles); per new prompt class, every arm's "
                        "prefill and first step on the chunk's prompts"}
