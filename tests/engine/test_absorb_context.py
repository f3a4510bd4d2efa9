"""`DFlash2DraftModel.absorb_context`: taking the prompt's context into the draft cache after the
prefill, then drafting from an empty context (counts 0, as the engine's graph-replayed first step
does), gives the same block hidden states and the same cache as drafting with the prompt's context
in the first forward (the engine's former eager first step)."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine.draft import DFlash2Proposer
from dflash2.target import TargetModel
from tests.engine.helpers import fp32_target_draft_prompts

VOCAB = 300


@pytest.mark.parametrize("kernel_impl", [None, "triton"], ids=["reference", "fused-norm-rope"])
def test_absorbed_prompt_context_drafts_the_same_block(kernel_impl):
    if kernel_impl == "triton":
        pytest.importorskip("triton")
        from dflash2.kernels.dispatch import triton_interpreter_enabled

        if not triton_interpreter_enabled():
            pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")
    target, draft, _ = fp32_target_draft_prompts(VOCAB, layers=4)
    target = TargetModel(target)
    cfg = draft.config
    b, p, n = 2, 9, 5
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(b, p, cfg.hidden_size * len(cfg.target_layer_ids), generator=g)
    counts = torch.tensor([9, 6])  # row 1 has a shorter prompt: entries past 6 are padding
    pos = torch.arange(p)[None].expand(b, p)
    start = counts.clone()  # the anchor sits right after each row's prompt
    block_pos = start[:, None] + torch.arange(1 + n)
    anchor = torch.tensor([4, 7])
    block = torch.full((b, 1 + n), int(cfg.mask_token_id))
    block[:, 0] = anchor
    noise = draft.noise_embedding(target.embed, block)

    with torch.no_grad():
        direct = draft.new_cache(b, 64)
        h_direct = draft(position_ids=torch.cat([pos, block_pos], 1), noise_embedding=noise, target_hidden=feats,
                         past_key_values=direct, context_lengths=counts, kernel_impl=kernel_impl)
        absorbed = draft.new_cache(b, 64)
        draft.absorb_context(feats, pos, absorbed, counts, kernel_impl=kernel_impl)
        assert absorbed.lengths.tolist() == counts.tolist()
        empty = torch.zeros(b, 1 + n, feats.shape[-1])  # the engine's context buffer, nothing valid
        h_absorbed = draft(position_ids=torch.cat([torch.zeros(b, 1 + n, dtype=torch.long), block_pos], 1),
                           noise_embedding=noise, target_hidden=empty, past_key_values=absorbed,
                           context_lengths=torch.zeros(b, dtype=torch.long), kernel_impl=kernel_impl)
    assert torch.equal(h_direct, h_absorbed)
    assert direct.lengths.tolist() == absorbed.lengths.tolist()
    for layer in range(cfg.num_hidden_layers):  # the valid context slots hold the same K/V
        for row, c in enumerate(counts.tolist()):
            assert torch.equal(direct.keys[layer][row, :, :c], absorbed.keys[layer][row, :, :c])
            assert torch.equal(direct.values[layer][row, :, :c], absorbed.values[layer][row, :, :c])

    # The proposer's hook casts and forwards to the model, into its own cache.
    proposer = DFlash2Proposer(draft, target, b, 64, "torch")
    proposer.absorb_context(feats, pos, counts)
    assert proposer.cache.lengths.tolist() == counts.tolist()
