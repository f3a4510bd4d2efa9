"""`DFlash2Config`: the draft checkpoint's `config.json` (DFlash v1 and DFlash2).

The top level is a Qwen3 decoder config (the draft mirrors the target's layer shapes); the
drafting-specific fields live in the nested `dflash_config` dict, exactly as the z-lab
checkpoints store them (spec section 7). Which architecture a checkpoint is comes from
`architectures`: `DFlash2DraftModel` turns the grouped dynamic conv and the candidate selector
on, `DFlashDraftModel` (v1) turns both off.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
DFLASH_V1_ARCHITECTURE = "DFlashDraftModel"

# Every `dflash_config` field we interpret: name -> (default, meaning). Unknown keys (vLLM-only
# extras such as `use_aux_hidden_state`) are kept verbatim so a checkpoint round-trips.
DFLASH_FIELDS: dict[str, tuple[Any, str]] = {
    "block_size": (16, "trained block length including the anchor; max speculative tokens = block_size - 1"),
    "mask_token_id": (None, "target-vocabulary id fed at the mask slots of a block"),
    "target_layer_ids": (None, "0-based target decoder layers whose outputs form the context features"),
    "conv_kernel_size": (2, "taps K of the grouped dynamic depthwise conv (DFlash2)"),
    "conv_group_size": (16, "channels per dynamic-kernel group; must divide hidden_size (DFlash2)"),
    "selector_rank": (256, "rank R of the candidate selector's bilinear edge term (DFlash2)"),
    "selector_top_k": (16, "candidates per slot walked by the selector (DFlash2)"),
    "output_multiplier": (1.0, "scale on head logits before softcap and top-k"),
    "final_logit_softcapping": (None, "s * tanh(z / s) on head logits when > 0; absent = off"),
    "input_embedding_scale": (1.0, "scale on the target embeddings of block tokens (anchor included)"),
    "causal": (None, "vLLM extra: per-checkpoint in-block causality when top-level is_causal is absent"),
    "sample_from_anchor": (False, "must be false: slot 0 (the anchor) is never a proposal"),
}


class DFlash2ConfigError(ValueError):
    """A config field is invalid; the message names the field and the fix."""


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The v1 default: evenly spaced target layers from 1 to `num_target_layers - 3` (spec 2.1)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@strict
class DFlash2Config(Qwen3Config):
    """Draft config: Qwen3 layer shapes + `dflash_config` (spec section 7).

    Extra top-level fields: `num_target_layers` (target depth, used to validate
    `target_layer_ids`) and `is_causal` (explicit in-block causality; False = bidirectional).
    """

    dflash_config: dict | None = None
    num_target_layers: int | None = None
    is_causal: bool | None = None
    block_size: int | None = None  # legacy v1 location; moved into dflash_config on load

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if not self.architectures:
            self.architectures = [DFLASH2_ARCHITECTURE]
        dc = dict(self.dflash_config or {})
        if self.block_size is not None and "block_size" not in dc:
            dc["block_size"] = self.block_size
        self.block_size = None
        # Absent optional fields stay absent in the file (Qwen3 checkpoints omit multiplier and
        # softcap); the accessors below supply the defaults. The architecture-defining ones are
        # written out so a saved checkpoint is self-describing.
        required = ["block_size", "mask_token_id", "target_layer_ids"]
        if self.is_dflash2:
            required += ["conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"]
        for name in required:
            dc.setdefault(name, copy.deepcopy(DFLASH_FIELDS[name][0]))
        if dc["target_layer_ids"] is None and self.num_target_layers is not None:
            dc["target_layer_ids"] = build_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        self.dflash_config = dc

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for name in ("block_size", "is_causal", "num_target_layers"):
            if out.get(name) is None:
                out.pop(name, None)
        return out

    # ------------------------------------------------------------------ derived views
    @property
    def is_dflash2(self) -> bool:
        """True for `DFlash2DraftModel` checkpoints (conv + selector), False for v1."""
        return DFLASH2_ARCHITECTURE in (self.architectures or [])

    def _dc(self, name: str) -> Any:
        value = self.dflash_config.get(name)
        return copy.deepcopy(DFLASH_FIELDS[name][0]) if value is None else value

    dflash_block_size = property(lambda self: int(self._dc("block_size")))
    mask_token_id = property(lambda self: self._dc("mask_token_id"))
    target_layer_ids = property(lambda self: list(self._dc("target_layer_ids") or []))
    conv_kernel_size = property(lambda self: int(self._dc("conv_kernel_size")))
    conv_group_size = property(lambda self: int(self._dc("conv_group_size")))
    selector_rank = property(lambda self: int(self._dc("selector_rank")))
    selector_top_k = property(lambda self: int(self._dc("selector_top_k")))
    output_multiplier = property(lambda self: float(self._dc("output_multiplier") or 1.0))
    final_logit_softcapping = property(lambda self: float(self._dc("final_logit_softcapping") or 0.0))
    input_embedding_scale = property(lambda self: float(self._dc("input_embedding_scale") or 1.0))

    def layer_is_causal(self, layer_idx: int) -> bool:
        """In-block causality of one draft layer (spec 2.5): explicit `is_causal` wins, then
        `dflash_config.causal`, else causal iff the layer is a sliding-attention layer."""
        if self.is_causal is not None:
            return bool(self.is_causal)
        if self._dc("causal") is not None:
            return bool(self._dc("causal"))
        return self.layer_types[layer_idx] == "sliding_attention"

    def layer_window(self, layer_idx: int) -> int | None:
        """Sliding window (in absolute positions) of one draft layer, or None for full attention."""
        if self.layer_types[layer_idx] == "sliding_attention" and self.sliding_window:
            return int(self.sliding_window)
        return None

    # ------------------------------------------------------------------ validation
    def check(
        self,
        *,
        target_num_layers: int | None = None,
        target_hidden_size: int | None = None,
        target_vocab_size: int | None = None,
    ) -> None:
        """Raise `DFlash2ConfigError` naming the first bad field and how to fix it.

        The `target_*` arguments, when given, also check compatibility with a target model.
        """

        def fail(field: str, problem: str, fix: str) -> None:
            raise DFlash2ConfigError(f"{field}: {problem}. Fix: {fix}.")

        H, V = self.hidden_size, self.vocab_size
        B = self.dflash_block_size
        if B < 2:
            fail("dflash_config.block_size", f"is {B}, but a block needs the anchor plus at least one mask slot",
                 "set block_size >= 2 (z-lab Qwen3 drafters use 16, speculators 8)")
        if self.num_attention_heads % self.num_key_value_heads:
            fail("num_key_value_heads", f"{self.num_key_value_heads} does not divide num_attention_heads "
                 f"{self.num_attention_heads}", "use a KV head count that divides the query head count")
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            fail("layer_types", f"has {len(self.layer_types)} entries for {self.num_hidden_layers} layers",
                 "give one of 'full_attention'/'sliding_attention' per draft layer")
        mask_id = self.mask_token_id
        if mask_id is None or not 0 <= int(mask_id) < V:
            fail("dflash_config.mask_token_id", f"is {mask_id}, outside the vocabulary [0, {V})",
                 "set it to a reserved/unused token id of the target vocabulary")
        ids = self.target_layer_ids
        if not ids:
            fail("dflash_config.target_layer_ids", "is empty or missing",
                 "list the 0-based target layers whose outputs feed the draft "
                 "(or set num_target_layers to get the v1 default)")
        n_t = target_num_layers if target_num_layers is not None else self.num_target_layers
        if n_t is not None:
            bad = [i for i in ids if not 0 <= int(i) < n_t]
            if bad:
                fail("dflash_config.target_layer_ids", f"{bad} out of range for a target with {n_t} layers "
                     "(ids are 0-based decoder-layer indices, output = hidden_states[i+1])",
                     f"use ids in [0, {n_t}); remember speculators/vLLM ids are z-lab ids + 1")
        if self.is_dflash2:
            g, K = self.conv_group_size, self.conv_kernel_size
            if g < 1 or H % g:
                fail("dflash_config.conv_group_size", f"{g} does not divide hidden_size {H}",
                     f"choose a divisor of {H} (the published drafters use 16)")
            if not 1 <= K <= B:
                fail("dflash_config.conv_kernel_size", f"{K} taps for block_size {B}",
                     "use 1 <= conv_kernel_size <= block_size (published: 2)")
            if self.selector_rank < 1:
                fail("dflash_config.selector_rank", f"is {self.selector_rank}", "use a positive rank (published: 256)")
            k = self.selector_top_k
            if not 1 <= k <= V:
                fail("dflash_config.selector_top_k", f"{k} candidates for a vocabulary of {V}",
                     f"use 1 <= selector_top_k <= vocab_size (published: 16)")
        mult = self.output_multiplier
        if not (mult > 0 and math.isfinite(mult)):
            fail("dflash_config.output_multiplier", f"is {mult}; top-k of scaled logits assumes a positive scale",
                 "use a positive finite multiplier (absent = 1)")
        if self.final_logit_softcapping < 0:
            fail("dflash_config.final_logit_softcapping", f"is {self.final_logit_softcapping}",
                 "use a positive cap or leave it absent/0 for no softcap")
        if self._dc("sample_from_anchor"):
            fail("dflash_config.sample_from_anchor", "is true, but DFlash(2) never proposes the anchor slot",
                 "set sample_from_anchor to false")
        if target_hidden_size is not None and target_hidden_size != H:
            fail("hidden_size", f"draft {H} != target {target_hidden_size} (fc maps n*H -> H of the target)",
                 "distill the draft for this target, or pick the target it was trained on")
        if target_vocab_size is not None and target_vocab_size != V:
            fail("vocab_size", f"draft {V} != target {target_vocab_size}; the draft uses the target's "
                 "embedding and head, so vocabularies must match", "use the draft's own target")
