"""How one `speculative_generate` call runs, resolved once and passed down explicitly.

`EngineSettings` is built by the input checks (`dflash2.engine.inputs.check_generate_inputs`)
from the call's arguments and the target's device, frozen, and handed to everything that depends
on it: the decoding state (`dflash2.engine.state.DecodeState`), the draft's proposer
(`dflash2.engine.draft.DFlash2Proposer`, which passes the kernels to the draft's forward) and
the target's attention (through the forward's attention kwargs, `StaticTargetCache.attention_kwargs`).
Nothing is stored on the models, in context variables or in thread-locals, so two calls with
different settings, in one thread after the other or in two threads at once, cannot see each
other's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash2.engine.verify import VERIFY_POLICIES

RESOLVED_IMPLS = ("torch", "triton")
EXACT_IMPLS = ("rows", "invariant")
# Invariant exact mode: key slots per attention split, at fixed absolute boundaries. The decoding
# steps split every 64 keys (one key block per program: as many programs as the normal mode's
# split count gives a decode at a few hundred keys); the prefill every 256, since its workspace
# holds a partial per (query tile, split) and grows with the square of the prompt length. Spec ==
# AR needs only that every step of every arm uses the same value and that both prefill alike.
EXACT_SPLIT_KEYS = 64
EXACT_PREFILL_SPLIT_KEYS = 256
# Exact mode's width when no draft sets it and exact mode is off (`inputs.exact_width` is the rule).
DEFAULT_EXACT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class EngineSettings:
    """Resolved settings of one call.

    Attributes:
        kernel_impl: `"torch" | "triton"`: verify, vocabulary top-k, selector walk, the draft's conv.
        attention_impl: `"torch" | "triton"`: the target's attention over its static cache and the
            draft's cached attention (`dflash2.kernels.row_attention`); exact mode keeps its own kernel.
        exact: exact mode (`dflash2.engine.generate`).
        exact_block_size: exact mode's width: every target forward's padded width (`"rows"`), or
            the attention's fixed query tile, each block running at its own width (`"invariant"`).
        exact_impl: how exact mode keeps a row's bits independent of the batch: `"rows"` (each
            target forward row by row, eager, the stock kernels) or `"invariant"` (one batched
            forward through batch- and width-invariant kernels: the small-M linear for every row
            count (each attention's q/k/v and each MLP's gate/up as one launch, as in normal mode),
            the row attention with fixed key splits and query tile, the row mean of the norms;
            graph-capturable).
        linear_impl: `"torch" | "triton"`: the target's and the draft's `nn.Linear` layers at
            decode and verify sizes (at most 32 rows); `"triton"` routes them through
            `dflash2.kernels.linear.SmallMLinearMode` (the decoding state owns the mode, so graphs
            captured under it keep its buffers), `"torch"` leaves `F.linear`.
        compile_level: None, `"light"` or `"full"` (`dflash2.engine.compiled`).
        graphs: the steady-state step replays CUDA graphs (`dflash2.engine.graphs`).
        verify: the verify policy, `"chain"` (every drafted token), `"adaptive"` (per row, a
            length fixed by the row's earlier steps; `dflash2.engine.verify`) or `"tree"` (a token
            tree of `tree_budget` nodes; `dflash2.engine.tree`).
        tree_budget: nodes of each step's tree, root included (`verify="tree"`; else 0).
    """

    kernel_impl: str
    attention_impl: str
    linear_impl: str = "torch"
    exact: bool = False
    exact_block_size: int = DEFAULT_EXACT_BLOCK_SIZE
    exact_impl: str = "rows"
    compile_level: str | None = None
    graphs: bool = False
    verify: str = "chain"
    tree_budget: int = 0

    def __post_init__(self):
        for name in ("kernel_impl", "attention_impl", "linear_impl"):
            if getattr(self, name) not in RESOLVED_IMPLS:
                raise ValueError(f"{name} must be resolved to one of {RESOLVED_IMPLS}, got {getattr(self, name)!r}")
        if self.exact_impl not in EXACT_IMPLS:
            raise ValueError(f"exact_impl must be one of {EXACT_IMPLS}, got {self.exact_impl!r}")
        if self.verify not in VERIFY_POLICIES:
            raise ValueError(f"verify must be one of {VERIFY_POLICIES}, got {self.verify!r}")

    @property
    def invariant_exact(self) -> bool:
        """Exact mode through the batch-invariant kernels (batched, graph-capturable)."""
        return self.exact and self.exact_impl == "invariant"
