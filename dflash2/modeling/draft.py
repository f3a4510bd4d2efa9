"""DFlash2 draft model: one non-causal forward drafts a whole block (spec 2, 4, 5).

    c      = RMSNorm_hidden(W_fc concat(target features))             [B, ctx, H]
    x      = E_in[anchor, mask, ..., mask] * input_embedding_scale     [B, q, H]
    layer: u = norm_in(x); u' = conv_prep(u); a = Attn(Q(u'), [K(c); K(u')], [V(c); V(u')])
           x = x + conv_fin(W_o a);  then the same around the SiLU MLP with norm_post
    h      = RMSNorm_final(x)                                          [B, q, H]

Context enters every layer only as extra keys/values projected with the layer's own `k_proj`,
`v_proj` and `k_norm`, with RoPE at true positions. The block is non-causal unless the layer's
config says causal (spec 2.5); sliding windows are measured in absolute positions. The draft
owns neither an embedding nor a head: both are the target's (`dflash2.target.TargetModel`).

One module tree serves training (no cache, differentiable, optional explicit mask over many
packed blocks) and inference (with a `DraftContextCache`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from dflash2.checkpoint import load_draft, save_draft
from dflash2.config import DFlash2Config
from dflash2.kernels.dispatch import triton_interpreter_enabled
from dflash2.kernels.norm_rope import fits as norm_rope_fits
from dflash2.kernels.norm_rope import norm_rope_into_cache, norm_rope_queries_and_cache
from dflash2.kernels.row_attention import kernel_fits, row_attention
from dflash2.kernels.silu_mul import silu_mul
from dflash2.modeling.cache import DraftContextCache, StepSlots
from dflash2.modeling.conv import GroupedDynamicConv
from dflash2.modeling.selector import CandidateSelector


class FP32RotaryEmbedding(Qwen3RotaryEmbedding):
    """RoPE whose inverse frequencies stay fp32 through `.to(dtype)`: a bf16-rounded table would
    shift every angle, and a model cast to bf16 would then differ from the same weights loaded
    in bf16 (HF keeps them fp32 on load)."""

    def _apply(self, fn, recurse=True):
        keep = {name: buf for name, buf in self.named_buffers(recurse=False)}
        super()._apply(fn, recurse)
        for name, buf in keep.items():
            new = getattr(self, name)
            if new.dtype != buf.dtype:
                setattr(self, name, buf.to(new.device))
        return self


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, S, hd]; cos/sin [B, S, hd]."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def _context_counts(batch: int, c: int, context_lengths: torch.Tensor | None, device) -> torch.Tensor:
    """`[B]` int64 valid new context entries per row: `context_lengths`, or all `c` of them."""
    if context_lengths is None:
        return torch.full((batch,), c, dtype=torch.long, device=device)
    return context_lengths.to(device=device, dtype=torch.long)


def _is_block_mask(mask) -> bool:
    return mask is not None and type(mask).__name__ == "BlockMask"


_FLEX: dict[str, object] = {}


def _block_rows_of(stacked: torch.Tensor | None, u: torch.Tensor) -> bool:
    """Whether `u [B, q, H]` is the last `q` rows of `stacked [B, c + q, H]` in place (the prepare
    conv wrote it there), so `stacked` already is `[context; u]`. Compares pointers, shapes and
    strides on the host: no device work."""
    if stacked is None:
        return False
    tail = stacked[:, stacked.shape[1] - u.shape[1]:]
    return u.data_ptr() == tail.data_ptr() and u.shape == tail.shape and u.stride() == tail.stride()


def _rule_mask(valid_k: torch.Tensor, key_blk: torch.Tensor, pos_q: torch.Tensor, pos_k: torch.Tensor | None,
               causal: bool, window: int | None) -> torch.Tensor:
    """One layer rule's visibility `[B, 1, q, Kn]` (True = attend), for training and cached
    inference alike: key j is visible to block query i iff `valid_k[b, j]`; on a causal layer,
    unless j is a block key after slot i (`key_blk [B or 1, Kn]`: j's block index, < 0 for
    context); with a window, iff `|pos_q[b, i] - pos_k[b, j]| < window` (`pos_k` may be None
    without one)."""
    q = pos_q.shape[1]
    m = valid_k[:, None, :].expand(-1, q, -1)                     # [B, q, Kn]
    if causal:
        m = m & (key_blk[:, None, :] <= torch.arange(q, device=pos_q.device)[None, :, None])
    if window is not None:
        m = m & ((pos_q[:, :, None] - pos_k[:, None, :]).abs() < window)
    return m[:, None]


def _flex_attention(device: torch.device):
    """FlexAttention, compiled on CUDA (its fused kernel), eager elsewhere (reference math)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if "cuda" not in _FLEX:
        _FLEX["cuda"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["cuda"]


class DraftAttention(nn.Module):
    """Qwen3 attention whose keys/values are [context; block] (KV injection, spec 2.4)."""

    def __init__(self, config: DFlash2Config):
        super().__init__()
        H, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        bias = config.attention_bias
        self.q_proj = nn.Linear(H, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, H, bias=bias)
        self.q_norm = Qwen3RMSNorm(hd, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(hd, eps=config.rms_norm_eps)

    def _projections(self, x: torch.Tensor, *, queries: bool = False) -> tuple[torch.Tensor, ...]:
        """`x [B, S, H]`'s key and value projections `[B, S, nkv, hd]` (queries first, `[B, S, nh,
        hd]`, if asked), in the order q, k, v: under a `SmallMLinearMode` with this module's
        fused groups (`fusable_groups(draft, kv_pairs=True)`) that is one launch."""
        B, S, _ = x.shape
        kv = (B, S, self.num_kv_heads, self.head_dim)
        q = (self.q_proj(x).view(B, S, self.num_heads, self.head_dim),) if queries else ()
        return (*q, self.k_proj(x).view(kv), self.v_proj(x).view(kv))

    def _kv_from(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Normed, rotated keys and the values, `[B, nkv, S, hd]` each, from their projections."""
        return _rope(self.k_norm(k).transpose(1, 2), cos, sin), v.transpose(1, 2)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._kv_from(*self._projections(x), cos, sin)  # [B, nkv, S, hd]

    def fused_norm_rope(self, x: torch.Tensor, cos: torch.Tensor, impl: str | None) -> bool:
        """Whether the cached forward runs the norms, RoPE and cache writes of `x`'s projections
        as `dflash2.kernels.norm_rope` launches: `impl == "triton"`, on CUDA or under the Triton
        interpreter, with the norms' weights, `x` and `cos` in one dtype the kernel takes."""
        if impl != "triton" or not (x.is_cuda or triton_interpreter_enabled()):
            return False
        probe = torch.empty((1, 1, self.num_kv_heads, self.head_dim), dtype=x.dtype, device="meta")
        return (norm_rope_fits(probe, self.q_norm.weight, cos) and norm_rope_fits(probe, self.k_norm.weight, cos)
                and x.dtype == self.q_proj.weight.dtype)

    def _into_cache(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    cache: DraftContextCache, layer_idx: int, slots: torch.Tensor, fused: bool) -> None:
        """Projections `k, v [B, S, nkv, hd]` normed, rotated and written into the cache at
        `slots [B, S]`: one norm-RoPE launch if `fused`, else the module's ops and the cache's scatter."""
        if fused:
            norm_rope_into_cache(k, v, self.k_norm.weight, self.k_norm.variance_epsilon, cos, sin,
                                 cache.keys[layer_idx], cache.values[layer_idx], slots, impl="triton")
        else:
            cache.write(layer_idx, *self._kv_from(k, v, cos, sin), slots)

    def write_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: DraftContextCache,
                 layer_idx: int, slots: torch.Tensor, impl: str | None = None) -> None:
        """The keys and values of `x [B, S, H]` (RoPE at `cos, sin [B, S, hd]`) into the cache at
        `slots [B, S]`, as the cached forward writes its context (`fused_norm_rope` picks the path;
        the fused path projects through the q/k/v group, as the forward's stacked projection does,
        so a row-invariant linear gives the forward's bits)."""
        fused = self.fused_norm_rope(x, cos, impl)
        k, v = self._projections(x, queries=fused)[-2:]
        self._into_cache(k, v, cos, sin, cache, layer_idx, slots, fused)

    def _cached_qkv(self, u, ctx, rope_blk, rope_ctx, rope_all, cache: DraftContextCache, layer_idx,
                    slots: StepSlots, impl, stacked=None):
        """Queries `[B, nh, q, hd]` of the block; the context's and then the block's keys and values
        written into the cache (the block at the slots right after the context, which the next
        step's context overwrites: padding context entries of a row share slots with its block).

        Fused path (`fused_norm_rope`): the context rows and the block rows are projected together,
        `[ctx; u]` through the q/k/v group (one launch under a fused linear mode; the context's
        queries are not used); the block's queries and, at `slots.both`, the keys and values of both
        go through one norm-RoPE launch (`rope_all`: RoPE of the context, then the block); `[ctx; u]`
        is `stacked` itself where `u` lies in its last rows (`_block_rows_of`), else a concatenation. Otherwise
        the block's q/k/v, then the context's k/v, and two cache writes in that order."""
        if self.fused_norm_rope(u, rope_blk[0], impl):
            c = ctx.shape[1]
            both = stacked if _block_rows_of(stacked, u) else torch.cat([ctx.to(u.dtype), u], dim=1)
            q_all, k_all, v_all = self._projections(both, queries=True)
            return norm_rope_queries_and_cache(
                q_all[:, c:], self.q_norm.weight, self.q_norm.variance_epsilon, *rope_blk, k_all, v_all,
                self.k_norm.weight, self.k_norm.variance_epsilon, *rope_all, cache.keys[layer_idx],
                cache.values[layer_idx], slots.both, impl="triton")
        q_blk, k_blk, v_blk = self._projections(u, queries=True)
        k_ctx, v_ctx = self._projections(ctx)
        Q = _rope(self.q_norm(q_blk).transpose(1, 2), *rope_blk)  # [B, nh, q, hd]
        self._into_cache(k_ctx, v_ctx, *rope_ctx, cache, layer_idx, slots.ctx, False)
        self._into_cache(k_blk, v_blk, *rope_blk, cache, layer_idx, slots.blk, False)
        return Q

    def forward(self, u, ctx, rope_blk, rope_ctx, mask, cache: DraftContextCache | None, layer_idx,
                slots: StepSlots | None, kernel_impl: str | None = None, rope_all=None, stacked=None):
        B, q, _ = u.shape
        gqa = self.num_heads != self.num_kv_heads
        if cache is not None:
            # Inference: the attention reads the cache buffer in place (no [context; block] copy
            # per layer); `kernel_impl == "triton"` fuses the norms, RoPE and cache writes.
            Q = self._cached_qkv(u, ctx, rope_blk, rope_ctx, rope_all, cache, layer_idx, slots, kernel_impl, stacked)
            K, V = (t.to(Q.dtype) for t in cache.readable(layer_idx))
            if mask.dtype == torch.bool:  # [B, 1, q, S] visibility
                out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=gqa).transpose(1, 2)
            else:  # [B, q] last visible slot per query: the split-key kernel, no mask tensor
                out = row_attention(Q, K, V, mask, impl="triton")
            return self.o_proj(out.reshape(B, q, -1))
        q_blk, k_blk, v_blk = self._projections(u, queries=True)
        Q = _rope(self.q_norm(q_blk).transpose(1, 2), *rope_blk)  # [B, nh, q, hd]
        k_blk, v_blk = self._kv_from(k_blk, v_blk, *rope_blk)     # [B, nkv, q, hd]
        k_ctx, v_ctx = self._kv(ctx, *rope_ctx)                   # [B, nkv, c, hd]
        K = torch.cat([k_ctx.to(k_blk.dtype), k_blk], dim=2)
        V = torch.cat([v_ctx.to(v_blk.dtype), v_blk], dim=2)
        if _is_block_mask(mask):  # training layouts: block-sparse FlexAttention (dflash2.training.layout)
            out = _flex_attention(Q.device)(Q, K.to(Q.dtype), V.to(Q.dtype), block_mask=mask, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(B, q, -1))


class DraftDecoderLayer(nn.Module):
    def __init__(self, config: DFlash2Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        H = config.hidden_size
        self.self_attn = DraftAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        if config.is_dflash2:
            K, g = config.conv_kernel_size, config.conv_group_size
            self.attention_conv = GroupedDynamicConv(H, K, g)
            self.mlp_conv = GroupedDynamicConv(H, K, g)
        else:
            self.attention_conv = self.mlp_conv = None

    def _mlp(self, u: torch.Tensor, impl: str | None) -> torch.Tensor:
        """The MLP of `u [B, q, H]`. With `impl == "triton"`, a SiLU MLP and nothing needing grad:
        its gate and up projections called in that order on `u` (one launch under a linear mode
        with the draft's fused groups), `silu_mul` (one launch) and its down projection, the
        module's own math in one launch fewer than a compiled module's gate, up, fused product and
        down (a compiled module runs each linear alone). Otherwise the module's forward."""
        mlp = self.mlp
        cfg = getattr(mlp, "config", None)
        if (impl != "triton" or getattr(cfg, "hidden_act", None) != "silu"
                or (torch.is_grad_enabled() and u.requires_grad)):
            return mlp(u)
        return mlp.down_proj(silu_mul(mlp.gate_proj(u), mlp.up_proj(u), impl="triton"))

    def forward(self, x, ctx, rope_blk, rope_ctx, mask, cache, slots, block_len, conv_impl=None, rope_all=None,
                normed=None, next_norm=None, stacked=None):
        """The layer on the residual stream `x [B, q, H]`; returns the new stream, or with
        `next_norm` (the RMSNorm that reads it next: the next layer's input norm or the final
        norm) `(x, next_norm(x))`. `normed`: this layer's `input_layernorm(x)` where the previous
        layer computed it so. Each finish conv, its residual add and the norm after it are one
        launch with the Triton conv (`GroupedDynamicConv.finish_norm`). `stacked` (cached
        inference): a `[B, c + q, H]` buffer holding the context rows, into whose last `q` rows the
        prepare conv writes, so the attention projects context and block without a concatenation."""
        u = self.input_layernorm(x) if normed is None else normed
        if self.attention_conv is not None:
            d = self.attention_conv.project(u)                    # [B, q, 2*K*G] from the input
            if stacked is None:
                u = self.attention_conv(u, d, 0, block_len, impl=conv_impl)
            else:  # into the block rows of [context; block]
                rows = stacked[:, stacked.shape[1] - u.shape[1]:]
                u = self.attention_conv(u, d, 0, block_len, impl=conv_impl, out=rows)
        y = self.self_attn(u, ctx, rope_blk, rope_ctx, mask, cache, self.layer_idx, slots, conv_impl, rope_all,
                           stacked=stacked)
        x, u = self._finish(self.attention_conv, y, d if self.attention_conv is not None else None, block_len,
                            conv_impl, x, self.post_attention_layernorm)
        if self.mlp_conv is not None:
            d = self.mlp_conv.project(u)
            u = self.mlp_conv(u, d, 0, block_len, impl=conv_impl)
        y = self._mlp(u, conv_impl)
        if next_norm is not None:
            return self._finish(self.mlp_conv, y, d if self.mlp_conv is not None else None, block_len, conv_impl,
                                x, next_norm)
        return x + y if self.mlp_conv is None else self.mlp_conv(y, d, 1, block_len, conv_impl, residual=x)

    @staticmethod
    def _finish(conv, y, d, block_len, impl, x, norm):
        """`(x', norm(x'))` with `x' = x + y` (v1) or `x + conv.finish(y)` (DFlash2)."""
        if conv is None:
            x = x + y
            return x, norm(x)
        return conv.finish_norm(y, d, block_len, impl, x, norm)


class DFlash2DraftModel(PreTrainedModel):
    """DFlash2 (or v1, per `config.architectures`) draft model. See the module docstring."""

    config_class = DFlash2Config
    base_model_prefix = ""
    _no_split_modules = ["DraftDecoderLayer"]
    supports_gradient_checkpointing = False  # own switch: `layer_checkpointing` (training)

    def __init__(self, config: DFlash2Config):
        super().__init__(config)
        H, n = config.hidden_size, len(config.target_layer_ids)
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.rotary_emb = FP32RotaryEmbedding(config)
        self.candidate_selector = (
            CandidateSelector(H, config.vocab_size, config.selector_rank, config.initializer_range)
            if config.is_dflash2 else None
        )
        self.post_init()

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, Qwen3RMSNorm):
            module.weight.fill_(1.0)

    def post_init(self) -> None:
        super().post_init()
        self.reset_dflash2_parts()

    @torch.no_grad()
    def reset_dflash2_parts(self) -> None:
        """Conv = identity and selector bilinear term = 0: the model then equals DFlash v1.

        Called after the generic init, which would otherwise re-randomize both (spec addendum).
        """
        for layer in self.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    conv.reset_to_identity()
        if self.candidate_selector is not None:
            self.candidate_selector.reset_to_identity()

    # ------------------------------------------------------------------ properties
    @property
    def selector_enabled(self) -> bool:
        return self.candidate_selector is not None

    @property
    def block_size(self) -> int:
        return self.config.dflash_block_size

    def new_cache(self, batch_size: int, max_len: int) -> DraftContextCache:
        return DraftContextCache.for_model(self, batch_size, max_len)

    # RoPE variants whose angles depend on more than the position (the sequence length seen so far).
    _LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")

    @torch.no_grad()
    def rope_table(self, length: int, dtype: torch.dtype, device) -> torch.Tensor | None:
        """`[length, 2, hd]`: the rotary module's cos (`[:, 0]`) and sin (`[:, 1]`) in `dtype` at
        positions 0 .. length - 1, or None for a RoPE type whose angles depend on more than the
        position. Each entry is computed as the module computes it for that position (elementwise
        ops on the same inputs), so gathering from the table gives the module's bits."""
        if getattr(self.rotary_emb, "rope_type", "default") in self._LENGTH_DEPENDENT_ROPE:
            return None
        pos = torch.arange(length, device=device)[None]
        cos, sin = self.rotary_emb(torch.empty(0, dtype=dtype, device=device), pos)
        return torch.stack([cos[0], sin[0]], dim=1).contiguous()

    def _rope(self, x: torch.Tensor, position_ids: torch.Tensor, cache: DraftContextCache | None):
        """`(cos, sin)` `[B, S, hd]` in `x`'s dtype at `position_ids`: gathered from the cache's
        table where it has one in that dtype (one gather per step instead of the module's
        elementwise ops), else the rotary module's."""
        rope = cache.rope_at(position_ids, x.dtype) if cache is not None else None
        return rope if rope is not None else self.rotary_emb(x, position_ids)

    def noise_embedding(self, embed, block_tokens: torch.Tensor) -> torch.Tensor:
        """Target embeddings of `[anchor, mask, ...]` times `input_embedding_scale` (all slots)."""
        scale = self.config.input_embedding_scale
        emb = embed(block_tokens)
        return emb * scale if scale != 1.0 else emb

    def head_logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        """Draft logits (spec 2.7): `softcap(output_multiplier * head(hidden))`, fp32.

        Args:
            hidden: `[..., H]` final-normed draft states.
            head: the target's LM head (`TargetModel.head` or an `nn.Linear`).
        Returns:
            `[..., V]` fp32 logits; the softcap `s * tanh(z / s)` applies only when `s > 0`.
        """
        from dflash2.kernels.topk.reference import head_transform

        cfg = self.config
        return head_transform(head(hidden), cfg.output_multiplier, cfg.final_logit_softcapping).float()

    # ------------------------------------------------------------------ masks
    def _per_rule(self, build) -> list:
        """`build(causal, window)` once per distinct layer rule, listed per layer."""
        cfg = self.config
        rules = [(cfg.layer_is_causal(i), cfg.layer_window(i)) for i in range(len(self.layers))]
        built = {rule: build(*rule) for rule in dict.fromkeys(rules)}
        return [built[rule] for rule in rules]

    def _cached_visibility(self, pos_blk: torch.Tensor, first_blk: torch.Tensor, cache: DraftContextCache,
                           attention_impl: str) -> list[torch.Tensor]:
        """Per layer, what the cached attention may see, with the block at cache slots
        `first_blk + i`: a bool mask `[B, 1, q, max_len]` (`_rule_mask`), or (Triton kernel, a full
        or causal layer without a window) the last visible slot of each query `[B, q]` (int64; for
        a full layer an expanded view of one `[B, 1]` column, which the kernel reads by stride).

        Context slot j (< first_blk) keeps its slot index as its position, as the cache always
        did; block slot first_blk + i has position `pos_blk[:, i]`."""
        B, q = pos_blk.shape
        dev = pos_blk.device
        cfg = self.config
        # (On CPU the kernel runs only under the Triton interpreter, in tests.)
        kernel = (attention_impl == "triton"
                  and (dev.type == "cuda" or triton_interpreter_enabled())
                  and kernel_fits(cfg.num_attention_heads, cfg.num_key_value_heads, q, cfg.head_dim))
        blk = cache.arange(q)
        j = key_blk = None  # slot indices [S] and their block index [B, S] (< 0: context), if a mask is needed

        def build(causal: bool, window: int | None) -> torch.Tensor:
            nonlocal j, key_blk
            if kernel and window is None:
                if causal:
                    return first_blk[:, None] + blk[None]                          # [B, q] int64
                return (first_blk + (q - 1))[:, None].expand(B, q)
            if key_blk is None:
                j = cache.arange(cache.max_len)
                key_blk = j[None] - first_blk[:, None]
            pos_k = None if window is None else torch.where(
                key_blk < 0, j[None], pos_blk.gather(1, key_blk.clamp(0, q - 1)))
            return _rule_mask(key_blk < q, key_blk, pos_blk, pos_k, causal, window)

        return self._per_rule(build)

    def _masks(self, pos_q, pos_k, valid_k, q, attention_mask):
        """Boolean masks `[B, 1, q, Kn]` (True = attend), one per distinct layer rule; the block
        is the last q keys."""
        if _is_block_mask(attention_mask):
            return [attention_mask] * len(self.layers)
        if attention_mask is not None:
            m = attention_mask if attention_mask.dim() == 4 else attention_mask[:, None]
            return [m.bool()] * len(self.layers)
        Kn = pos_k.shape[1]
        key_blk = (torch.arange(Kn, device=pos_q.device) - (Kn - q))[None]  # [1, Kn] block index (< 0: context)
        return self._per_rule(lambda causal, window: _rule_mask(valid_k, key_blk, pos_q, pos_k, causal, window))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        position_ids: torch.Tensor,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        past_key_values: DraftContextCache | None = None,
        use_cache: bool = False,
        context_lengths: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        block_len: int | None = None,
        kernel_impl: str | None = None,
        attention_impl: str = "torch",
    ) -> torch.Tensor:
        """Draft one block (or, in training, many packed blocks).

        Args:
            position_ids: `[B or 1, c + q]` positions of the new context tokens, then the block.
            noise_embedding: `[B, q, H]` embeddings of `[anchor, mask x N]` (already scaled).
            target_hidden: `[B, c, n*H]` raw concatenated target features of new context tokens.
            past_key_values: a `DraftContextCache`; new context K/V are written at each row's
                current length, which then grows by `context_lengths` (default `c`).
            use_cache: accepted for z-lab signature compatibility; the cache is used iff given.
            context_lengths: `[B]` number of valid new context tokens per row (cache only).
            attention_mask: optional explicit bool mask `[B, (1,) q, c + q]`, True = attend, or a
                FlexAttention `BlockMask` over the same grid (training layouts with many blocks);
                without a cache only. Either replaces every layer's own causal/window rule.
            block_len: conv block length; default `q` (one block).
            kernel_impl: the conv kernels' implementation for this call, resolved (`"torch"` or
                `"triton"`); None = each conv's own `impl`. With a cache, `"triton"` also runs the
                attention's norms, RoPE and cache writes as `dflash2.kernels.norm_rope` launches
                (`DraftAttention.fused_norm_rope`).
            attention_impl: the cached (inference) attention's kernel, resolved: `"torch"` (SDPA
                with a mask) or `"triton"` (`dflash2.kernels.row_attention`, where its limits
                allow); cache-free (training) forwards ignore it.
        Returns:
            `[B, q, H]` final-normed hidden states of the block positions.
        """
        B, q, _ = noise_embedding.shape
        c = target_hidden.shape[1]
        position_ids = position_ids.expand(B, -1)
        if position_ids.shape[1] != c + q:
            raise ValueError(f"position_ids covers {position_ids.shape[1]} positions, expected ctx {c} + block {q}")
        ctx = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self._rope(noise_embedding, position_ids, past_key_values)
        rope_ctx, rope_blk = (cos[:, :c], sin[:, :c]), (cos[:, c:], sin[:, c:])
        pos_blk = position_ids[:, c:]

        cache, slots = past_key_values, None
        if attention_impl not in ("torch", "triton"):
            raise ValueError(f"attention_impl must be a resolved 'torch' or 'triton', got {attention_impl!r}")
        if cache is not None:
            if attention_mask is not None:
                raise ValueError("attention_mask is for cache-free (training) forwards")
            counts = _context_counts(B, c, context_lengths, pos_blk.device)
            first_blk = cache.lengths + counts  # [B] the block's slots follow the row's valid context
            cache.check_capacity(c, first_blk + q)
            slots = StepSlots(cache, counts, first_blk, c, q)
            masks = self._cached_visibility(pos_blk, first_blk, cache, attention_impl)
        else:
            valid_k = torch.ones(B, c + q, dtype=torch.bool, device=pos_blk.device)
            masks = self._masks(pos_blk, position_ids, valid_k, q, attention_mask)

        x = noise_embedding
        # Training only (no cache, grad on): recompute each layer in backward to save memory.
        ckpt = getattr(self, "layer_checkpointing", False) and cache is None and torch.is_grad_enabled()
        normed = None  # cached inference: each layer also returns the norm that reads its output next
        stacked = None  # cached, fused: [ctx; block] rows, the block rows rewritten by each layer's prepare conv
        if cache is not None and kernel_impl == "triton" and self.layers[0].attention_conv is not None:
            stacked = torch.empty(B, c + q, ctx.shape[-1], dtype=noise_embedding.dtype, device=ctx.device)
            stacked[:, :c] = ctx
        for i, (layer, mask) in enumerate(zip(self.layers, masks)):
            if ckpt:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(layer, x, ctx, rope_blk, rope_ctx, mask, None, None, block_len or q, kernel_impl,
                               use_reentrant=False)
            elif cache is not None:
                nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
                x, normed = layer(x, ctx, rope_blk, rope_ctx, mask, cache, slots, block_len or q, kernel_impl,
                                  (cos, sin), normed=normed, next_norm=nxt, stacked=stacked)
            else:
                x = layer(x, ctx, rope_blk, rope_ctx, mask, cache, slots, block_len or q, kernel_impl, (cos, sin))
        if cache is not None:
            cache.advance(counts)
            return normed if normed is not None else self.norm(x)
        return self.norm(x)

    def absorb_context(self, target_hidden: torch.Tensor, position_ids: torch.Tensor, cache: DraftContextCache,
                       context_lengths: torch.Tensor | None = None, kernel_impl: str | None = None) -> None:
        """Write the context K/V of `target_hidden` into `cache`, as `forward` does for its new
        context, without drafting a block (the prompt after the prefill, so the first drafting
        step has the shape of every later one).

        Args:
            target_hidden: `[B, c, n*H]` raw concatenated target features.
            position_ids: `[B or 1, c]` their absolute positions.
            cache: the draft's cache; each row's entries go at its current length, which then
                grows by `context_lengths` (default `c`).
            context_lengths: `[B]` valid entries per row.
            kernel_impl: as `forward`'s (`"triton"`: the fused norm-RoPE cache writes).
        Guarantees: the cache ends as `forward` with the same context and `kernel_impl` would
        leave it (each layer's context K/V depend on the context alone; the same kernels at the
        same shapes), so drafting from it gives the same blocks.
        """
        B, c, _ = target_hidden.shape
        position_ids = position_ids.expand(B, -1)
        ctx = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self._rope(ctx, position_ids, cache)
        counts = _context_counts(B, c, context_lengths, ctx.device)
        cache.check_capacity(c)
        slots = cache.slots_for(c)
        for layer in self.layers:
            layer.self_attn.write_kv(ctx, cos, sin, cache, layer.layer_idx, slots, kernel_impl)
        cache.advance(counts)

    # ------------------------------------------------------------------ checkpoint IO
    @classmethod
    def from_pretrained(cls, path, *, dtype: torch.dtype | None = None, device=None, **_ignored):
        """Load a z-lab-format checkpoint dir (`DFlash2DraftModel` or v1 `DFlashDraftModel`)."""
        return load_draft(cls, path, dtype=dtype, device=device)

    def save_pretrained(self, save_directory, **_ignored) -> None:
        """Write `config.json` + `model.safetensors` with the z-lab tensor names."""
        save_draft(self, save_directory)

    # ------------------------------------------------------------------ generation
    def spec_generate(self, target, input_ids, max_new_tokens: int, temperature: float = 0.0,
                      stop_token_ids=None, **kwargs):
        """z-lab-style convenience wrapper around `dflash2.speculative_generate`."""
        from dflash2.engine import speculative_generate

        return speculative_generate(target, self, input_ids, max_new_tokens=max_new_tokens,
                                    temperature=temperature, stop_token_ids=stop_token_ids, **kwargs)
