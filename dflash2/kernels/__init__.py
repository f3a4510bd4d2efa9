"""Fused kernels for DFlash2 (inference, and one for training), each beside its PyTorch reference.

One folder per op (``reference.py``: the obviously-right torch version, the CPU and autograd
path; ``triton_kernels.py``: ``@triton.jit`` functions only; ``__init__.py``: the public function,
its launcher and the dispatch on an already-resolved ``impl``):

- ``dynamic_conv.grouped_dynamic_conv``: grouped dynamic causal conv, prepare / finish sides;
  ``dynamic_conv.grouped_dynamic_conv_norm``: a side with its residual add and the RMSNorm of the
  result in one launch (the draft's sublayer end and the next norm);
- ``topk.vocab_topk``: top-k of the (multiplied, soft-capped) head logits, ties -> lowest id,
  optionally with each row's validity (NaN, +inf or no finite logit) from the same launches;
- ``silu_mul.silu_mul``: ``silu(gate) * up`` for a fused gate/up output (the draft's MLP);
- ``selector.transition_scores`` / ``selector.selector_walk``: candidate-selector edges and walk;
- ``verify.verify_block``: greedy prefix match and sparse-q speculative sampling;
- ``row_attention.row_attention``: the engine's per-row masked GQA attention over its static
  cache, split over the keys (the engine's default on CUDA; the reference is SDPA with a mask);
- ``linear.small_m_linear``: a weight-streaming linear for M <= 32 rows (row-invariant, fixed-order
  split-K, up to 4 row tiles of 32 per weight read past that; reference ``F.linear``), and
  ``linear.SmallMLinearMode``, which routes stock ``nn.Linear`` calls through it;
- ``row_mean.row_mean``: the mean over the last dim in one fixed order per row (row-invariant;
  reference ``torch.mean``), and ``row_mean.RowMeanMode``, which routes the stock RMSNorms'
  ``mean(-1)`` calls through it;
- ``norm_rope.norm_rope`` / ``norm_rope.norm_rope_into_cache``: the draft attention's per-head
  RMSNorm and RoPE in one launch, into a fresh tensor or the draft's cache at each token's slot
  with the values (reference: the module's ops and scatters).

Training:

- ``head_ce.head_ce``: the fused head loss's logsumexp, logit gradient and top-k group maxima of the
  draft's logits in one launch (reads them twice; reference: the torch ops of
  ``dflash2.training.losses``).

``dispatch.resolve_impl`` turns ``"auto" | "torch" | "triton"`` into ``"torch" | "triton"`` once;
``keyed_random`` is the counter-based RNG shared by references and kernels; ``python -m
benchmarks.kernels`` (repository root) times every kernel against its reference (docs/PERFORMANCE.md).
"""
