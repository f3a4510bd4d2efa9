"""An oracle proposer with a controlled acceptance rate.

It proposes, for each slot, the token the AR arm produced at that position for the same
sample, right with probability `accept_prob` and otherwise a wrong token (right + 1 mod V).
At T = 0 on the AR path a slot is then accepted iff it and every earlier slot were right, so
the accepted length per step follows a truncated geometric law with parameter `accept_prob`:
E[accepted] = sum_{j=1..N} p^j. That gives the tiny CPU experiment a speculative arm that
really accepts tokens (its spec == AR check is not trivially true), and a cost model a knob.

It implements the engine's proposer interface (`propose(DraftStep) -> Proposal`,
`block_size`, `target_layer_ids`), so the engine's normal verify/commit bookkeeping runs.
`Proposal.q` is the oracle's true law: candidates `[right, wrong]` with probabilities
`[p, 1 - p]`, so speculative sampling stays exact at T > 0 too. Its coin flips are keyed by
(sample seed, position), independent of the engine's noise, and need no model forward.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import torch

from dflash2.engine.draft import DraftStep, Proposal


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) from a hash of (seed, position): the same for every batch layout."""
    digest = hashlib.blake2b(struct.pack("<qq", int(seed) & (2**63 - 1), int(position)), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


class OracleProposer:
    """Proposes each row's reference continuation, slot by slot right with probability `accept_prob`.

    Args:
        references: per row, the reference sequence (prompt + the AR arm's generated tokens);
            row b of the engine's batch is `references[b]`.
        seeds: per row, the sample's seed (keys the coin flips).
        block_size: advertised to the engine (N may be up to `block_size - 1`).
        accept_prob: probability that a slot proposes the reference token.
        vocab_size: the target's vocabulary (the wrong token is right + 1 mod V).
    """

    def __init__(self, references: Sequence[Sequence[int]], seeds: Sequence[int], block_size: int,
                 accept_prob: float, vocab_size: int):
        if not 0.0 <= accept_prob <= 1.0:
            raise ValueError(f"accept_prob={accept_prob}: must be in [0, 1]")
        self.references = [list(map(int, r)) for r in references]
        self.seeds = [int(s) for s in seeds]
        self.block_size = int(block_size)
        self.accept_prob = float(accept_prob)
        self.vocab_size = int(vocab_size)
        self.target_layer_ids: list[int] = []  # needs no target features

    def absorb_context(self, context, positions, counts) -> None:
        """The oracle reads no target context (its proposals come from the references), so the
        prompt's has nothing to go into; having this lets the engine's first step run as a
        graph replay like every later one."""

    def propose(self, step: DraftStep) -> Proposal:
        n = step.num_speculative_tokens
        starts = step.start.tolist()
        if len(starts) != len(self.references):
            raise ValueError(f"oracle built for {len(self.references)} rows, engine batch has {len(starts)}")
        right = torch.empty(len(starts), n, dtype=torch.long)
        hit = torch.empty(len(starts), n, dtype=torch.bool)
        for b, start in enumerate(starts):
            ref = self.references[b]
            for j in range(n):
                pos = start + 1 + j  # slot j+1 predicts this absolute position
                right[b, j] = ref[pos] if pos < len(ref) else ref[-1]
                hit[b, j] = keyed_uniform(self.seeds[b], pos) < self.accept_prob
        wrong = (right + 1) % self.vocab_size
        tokens = torch.where(hit, right, wrong)  # [B, N]
        cand = torch.stack([right, wrong], dim=-1)  # [B, N, 2]
        q = torch.tensor([self.accept_prob, 1.0 - self.accept_prob], dtype=torch.float32).expand(*right.shape, 2)
        dev = step.anchor.device
        return Proposal(tokens.to(dev), cand.to(dev), q.contiguous().to(dev))


class DeviceOracleProposer(OracleProposer):
    """The oracle's law with everything on the device, so `propose` can be captured in a CUDA graph.

    Same proposals as `OracleProposer` in law (slot right with probability `accept_prob`, else
    right + 1 mod V; candidates `[right, wrong]` with q = `[p, 1 - p]`), but its coins come from
    the engine's keyed uniforms on the device (`dflash2.kernels.keyed_random`, the acceptance
    stream at index 1, which the verifier never reads), keyed by (row seed, position); so the
    draws differ from `OracleProposer`'s while following the same law. Used by the graph tests
    and benchmarks, where a proposer must accept tokens without running host code per step.

    Args:
        references, seeds, block_size, accept_prob, vocab_size: as for `OracleProposer`.
        device: where the engine runs.
    """

    graph_safe = True

    def __init__(self, references: Sequence[Sequence[int]], seeds: Sequence[int], block_size: int,
                 accept_prob: float, vocab_size: int, device: torch.device | str):
        super().__init__(references, seeds, block_size, accept_prob, vocab_size)
        refs = self.references
        if not refs or any(not r for r in refs):
            raise ValueError("every reference must hold at least one token")
        width = max(map(len, refs))
        # Past its end a row's reference repeats its last token (as OracleProposer does).
        self.reference_ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in refs], dtype=torch.long,
                                          device=device)
        self.seed_ids = torch.tensor([s - 2**64 if s >= 2**63 else s for s in self.seeds], dtype=torch.long,
                                     device=device)
        self.law = torch.tensor([self.accept_prob, 1.0 - self.accept_prob], dtype=torch.float32, device=device)

    def propose(self, step: DraftStep) -> Proposal:
        from dflash2.kernels.keyed_random import ACCEPT_STREAM, keyed_uniform

        n = step.num_speculative_tokens
        b = self.reference_ids.shape[0]
        if step.start.shape[0] != b:
            raise ValueError(f"oracle built for {b} rows, engine batch has {step.start.shape[0]}")
        pos = step.start[:, None] + 1 + torch.arange(n, device=step.start.device)  # slot j+1 predicts pos
        right = self.reference_ids.gather(1, pos.clamp(max=self.reference_ids.shape[1] - 1))
        hit = keyed_uniform(self.seed_ids[:, None], ACCEPT_STREAM, pos, 1) < self.accept_prob
        wrong = (right + 1) % self.vocab_size
        return Proposal(torch.where(hit, right, wrong), torch.stack([right, wrong], dim=-1),
                        self.law.expand(b, n, 2))
