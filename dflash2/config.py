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
        if self.dflash_config is not None and not isinstance(self.dflash_config, dict):
            _fail("dflash_config", f"{self.dflash_config!r} is not a dict", "write an object with block_size, "
                  "mask_token_id, target_layer_ids (and, for DFlash2, conv_* and selector_*)")
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
        """Raise `DFlash2ConfigError` naming the first bad field, its value and how to fix it.

        Every field the draft reads is checked for type and range (top level and
        `dflash_config`), then the relations between fields. The `target_*` arguments, when
        given, also check compatibility with a target model.
        """
        values = {name: getattr(self, name, None) for name in _TOP_LEVEL}
        values["dflash_config"] = self.dflash_config
        check_config_values(values, target_num_layers=target_num_layers)
        H, V = self.hidden_size, self.vocab_size
        if target_hidden_size is not None and target_hidden_size != H:
            _fail("hidden_size", f"draft {H} != target {target_hidden_size} (fc maps n*H -> H of the target)",
                  "distill the draft for this target, or pick the target it was trained on")
        if target_vocab_size is not None and target_vocab_size != V:
            _fail("vocab_size", f"draft {V} != target {target_vocab_size}; the draft uses the target's "
                  "embedding and head, so vocabularies must match", "use the draft's own target")


# ---------------------------------------------------------------------- field rules
# Top-level fields the draft reads -> the fix to print when one is wrong. Token ids (pad, bos,
# eos) and bookkeeping fields are left to transformers' own checks: the draft never reads them,
# and transformers itself only warns on out-of-vocabulary special tokens (Hub configs have them).
_TOP_LEVEL: dict[str, str] = {
    "architectures": f"['{DFLASH2_ARCHITECTURE}'] (conv + selector) or ['{DFLASH_V1_ARCHITECTURE}'] (v1)",
    "vocab_size": "a positive int: the target's vocabulary size",
    "hidden_size": "a positive int: the target's hidden size",
    "intermediate_size": "a positive int: the draft MLP width",
    "num_hidden_layers": "a positive int: the number of draft layers",
    "num_attention_heads": "a positive int",
    "num_key_value_heads": "a positive int that divides num_attention_heads",
    "head_dim": "a positive even int (RoPE rotates pairs of channels)",
    "hidden_act": "an activation name transformers knows, e.g. 'silu'",
    "max_position_embeddings": "a positive int (the target's context length)",
    "initializer_range": "a finite float >= 0 (published: 0.02)",
    "rms_norm_eps": "a finite float > 0 (published: 1e-5 or 1e-6)",
    "attention_dropout": "a float in [0, 1) (0 for inference)",
    "attention_bias": "true or false",
    "rope_parameters": "a dict like {'rope_type': 'default', 'rope_theta': 1000000.0}",
    "layer_types": "one of 'full_attention' / 'sliding_attention' per draft layer",
    "use_sliding_window": "true or false (false clears sliding_window)",
    "sliding_window": "a positive int (window in tokens) when any layer is 'sliding_attention', else null",
    "num_target_layers": "a positive int (the target's depth) or leave it out",
    "is_causal": "true, false, or leave it out",
    "dtype": "one of 'bfloat16', 'float16', 'float32', 'float64', or leave it out",
}
_FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
_RULE_OF_VALIDATOR = {"validate_layer_type": "layer_types", "validate_rope": "rope_parameters",
                      "validate_architecture": "num_attention_heads"}


def _fail(field: str, problem: str, fix: str) -> None:
    raise DFlash2ConfigError(f"{field}: {problem}. Fix: {fix}.")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int_field(field: str, value: Any, low: int, fix: str, high: int | None = None) -> int:
    if not _is_int(value):
        _fail(field, f"{value!r} is a {type(value).__name__}, not an int", f"write {fix}")
    if value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        _fail(field, f"{value} is out of range (need {span})", f"write {fix}")
    return value


def _real_field(field: str, value: Any, ok, span: str, fix: str) -> float:
    if not _is_real(value) or not ok(value):
        kind = "not a finite number" if not _is_real(value) else f"out of range (need {span})"
        _fail(field, f"{value!r} is {kind}", f"write {fix}")
    return float(value)


def _check_architecture(arch: Any) -> bool:
    """True for DFlash2, False for v1; anything else names the architecture it got."""
    fix = f"set architectures to {_TOP_LEVEL['architectures']}"
    if not isinstance(arch, list) or len(arch) != 1 or arch[0] not in (DFLASH2_ARCHITECTURE, DFLASH_V1_ARCHITECTURE):
        _fail("architectures", f"{arch!r} names no single DFlash draft architecture", fix)
    return arch[0] == DFLASH2_ARCHITECTURE


def _check_top_level(v: dict[str, Any]) -> None:
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    t = _TOP_LEVEL
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings"):
        _int_field(name, v.get(name), 1, t[name])
    heads = v["num_attention_heads"]
    kv = _int_field("num_key_value_heads", v.get("num_key_value_heads"), 1, t["num_key_value_heads"])
    if heads % kv:
        _fail("num_key_value_heads", f"{kv} does not divide num_attention_heads {heads}",
              "use a KV head count that divides the query head count")
    hd = _int_field("head_dim", v.get("head_dim"), 2, t["head_dim"])
    if hd % 2:
        _fail("head_dim", f"{hd} is odd", f"write {t['head_dim']}")
    if v.get("hidden_act") not in ACT2FN:
        _fail("hidden_act", f"{v.get('hidden_act')!r} is not a known activation", f"write {t['hidden_act']}")
    _real_field("initializer_range", v.get("initializer_range"), lambda x: x >= 0, ">= 0", t["initializer_range"])
    _real_field("rms_norm_eps", v.get("rms_norm_eps"), lambda x: x > 0, "> 0", t["rms_norm_eps"])
    _real_field("attention_dropout", v.get("attention_dropout", 0.0), lambda x: 0 <= x < 1, "in [0, 1)",
                t["attention_dropout"])
    for name in ("attention_bias", "use_sliding_window"):
        if not isinstance(v.get(name, False), bool):
            _fail(name, f"{v.get(name)!r} is not a bool", f"write {t[name]}")
    if v.get("is_causal") is not None and not isinstance(v["is_causal"], bool):
        _fail("is_causal", f"{v['is_causal']!r} is not a bool", f"write {t['is_causal']}")
    rope = v.get("rope_parameters")
    if rope is not None:
        kinds = ("default", *ROPE_INIT_FUNCTIONS)
        if not isinstance(rope, dict) or rope.get("rope_type", "default") not in kinds:
            _fail("rope_parameters", f"{rope!r} is not a RoPE setting this draft can build (types {kinds})",
                  f"write {t['rope_parameters']}")
        _real_field("rope_parameters.rope_theta", rope.get("rope_theta"), lambda x: x > 0, "> 0",
                    "the target's positive RoPE base, e.g. 1000000.0")
    n_layers = v["num_hidden_layers"]
    types = v.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or \
                any(x not in ("full_attention", "sliding_attention") for x in types):
            _fail("layer_types", f"{types!r} for {n_layers} draft layers", f"write {t['layer_types']}")
        window = v.get("sliding_window")
        sliding = [i for i, x in enumerate(types) if x == "sliding_attention"]
        if sliding and window is None:
            _fail("sliding_window", f"is null (use_sliding_window={v.get('use_sliding_window')!r} clears it) but "
                  f"layers {sliding} are 'sliding_attention'", "set use_sliding_window true and sliding_window to "
                  "the window in tokens, or make those layers 'full_attention'")
        if sliding:
            _int_field("sliding_window", window, 1, t["sliding_window"])
    if v.get("num_target_layers") is not None:
        _int_field("num_target_layers", v["num_target_layers"], 1, t["num_target_layers"])
    dtype = v.get("dtype")
    if dtype is not None and str(dtype).removeprefix("torch.") not in _FLOAT_DTYPES:
        _fail("dtype", f"{dtype!r} is not a floating-point dtype (draft weights are real-valued)",
              f"write {t['dtype']}")


def _check_dflash(dc: Any, *, v2: bool, hidden: int, vocab: int, n_target: int | None) -> None:
    """Types, ranges and relations of the `dflash_config` fields this architecture reads."""
    if not isinstance(dc, dict):
        _fail("dflash_config", f"{dc!r} is not a dict", "write an object with block_size, mask_token_id, "
              "target_layer_ids (and, for DFlash2, conv_* and selector_*)")

    def get(name: str) -> Any:
        return DFLASH_FIELDS[name][0] if dc.get(name) is None else dc[name]

    f = "dflash_config."
    B = _int_field(f + "block_size", get("block_size"), 2, "an int >= 2: the anchor plus at least one mask "
                   "slot (z-lab Qwen3 drafters use 16, speculators 8)")
    mask = get("mask_token_id")
    if mask is None:
        _fail(f + "mask_token_id", "is missing", "set it to a reserved/unused token id of the target vocabulary")
    _int_field(f + "mask_token_id", mask, 0, f"a reserved/unused token id of the target vocabulary, in "
               f"[0, {vocab - 1}]", high=vocab - 1)
    ids = get("target_layer_ids")
    if not ids:
        _fail(f + "target_layer_ids", "is empty or missing", "list the 0-based target layers whose outputs feed "
              "the draft (or set num_target_layers to get the v1 default)")
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        _fail(f + "target_layer_ids", f"{ids!r} is not a list of ints", "list 0-based target layer indices")
    bad = [i for i in ids if not 0 <= i < (n_target if n_target is not None else 1 << 62)]
    if bad:
        span = f"a target with {n_target} layers" if n_target is not None else "any target (ids are >= 0)"
        _fail(f + "target_layer_ids", f"{bad} out of range for {span} "
              "(ids are 0-based decoder-layer indices, output = hidden_states[i+1])",
              f"use ids in [0, {n_target}); remember speculators/vLLM ids are z-lab ids + 1"
              if n_target is not None else "use 0-based layer indices")
    if v2:
        g = _int_field(f + "conv_group_size", get("conv_group_size"), 1, "a divisor of hidden_size "
                       "(the published drafters use 16)")
        if hidden % g:
            _fail(f + "conv_group_size", f"{g} does not divide hidden_size {hidden}",
                  f"choose a divisor of {hidden} (the published drafters use 16)")
        _int_field(f + "conv_kernel_size", get("conv_kernel_size"), 1,
                   f"1 <= conv_kernel_size <= block_size {B} (published: 2)", high=B)
        _int_field(f + "selector_rank", get("selector_rank"), 1, "a positive rank (published: 256)")
        _int_field(f + "selector_top_k", get("selector_top_k"), 1,
                   f"1 <= selector_top_k <= vocab_size {vocab} (published: 16)", high=vocab)
    _real_field(f + "output_multiplier", get("output_multiplier"), lambda x: x > 0, "> 0",
                "a positive finite multiplier (absent = 1); top-k of scaled logits assumes a positive scale")
    _real_field(f + "final_logit_softcapping", get("final_logit_softcapping") or 0.0, lambda x: x >= 0, ">= 0",
                "a positive cap, or leave it absent/0 for no softcap")
    _real_field(f + "input_embedding_scale", get("input_embedding_scale"), lambda x: x > 0, "> 0",
                "a positive finite scale (absent = 1)")
    for name in ("causal", "sample_from_anchor"):
        if dc.get(name) is not None and not isinstance(dc[name], bool):
            _fail(f + name, f"{dc[name]!r} is not a bool", "write true or false (or leave it out)")
    if dc.get("sample_from_anchor"):
        _fail(f + "sample_from_anchor", f"{dc['sample_from_anchor']!r}, but DFlash(2) never proposes the anchor slot",
              "set sample_from_anchor to false")


def check_config_values(values: dict[str, Any], *, target_num_layers: int | None = None) -> None:
    """Check a checkpoint config given as plain values (a config.json dict, or a config's
    attributes): architecture, every top-level field the draft reads, then `dflash_config`.

    Raises:
        DFlash2ConfigError: the first bad field, with its value and the fix.
    """
    v2 = _check_architecture(values.get("architectures") or [DFLASH2_ARCHITECTURE])
    _check_top_level(values)
    dc = values.get("dflash_config") or {}
    if isinstance(dc, dict):  # the legacy locations `__post_init__` reads, for raw config.json values
        dc = dict(dc)
        if values.get("block_size") is not None:
            dc.setdefault("block_size", values["block_size"])
        if dc.get("target_layer_ids") is None and _is_int(values.get("num_target_layers")):
            dc["target_layer_ids"] = build_target_layer_ids(values["num_target_layers"], values["num_hidden_layers"])
    n_target = target_num_layers if target_num_layers is not None else values.get("num_target_layers")
    _check_dflash(dc, v2=v2, hidden=values["hidden_size"], vocab=values["vocab_size"], n_target=n_target)


def _explain_strict_errors(cls):
    """Re-raise the strict dataclass's own errors as `DFlash2ConfigError` naming the field,
    the value and the fix: a wrong type on assignment (also during `__init__`), or a failed
    transformers class validator after `__init__`. For the latter the constructor's values
    (class defaults filled in) go through our top-level checks first, so the message names the
    root cause, e.g. `num_hidden_layers: -1` rather than transformers' complaint about
    `layer_types`.
    """
    import dataclasses
    import functools
    import re

    from huggingface_hub.errors import StrictDataclassError

    strict_init, strict_setattr = cls.__init__, cls.__setattr__
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    declared = {f.name: f.type for f in dataclasses.fields(cls)}

    def plain(err: StrictDataclassError, field: str, value: Any) -> DFlash2ConfigError:
        fix = _TOP_LEVEL.get(field, f"a value of the declared type {declared.get(field, 'of Qwen3Config')}")
        return DFlash2ConfigError(f"{field}: {value!r} is invalid ({err.__cause__ or err}). Fix: write {fix}.")

    @functools.wraps(strict_init)
    def __init__(self, *args, **kwargs):
        try:
            strict_init(self, *args, **kwargs)
        except StrictDataclassError as e:
            values = {**defaults, **kwargs}
            try:
                _check_architecture(values.get("architectures") or [DFLASH2_ARCHITECTURE])
                _check_top_level(values)
            except DFlash2ConfigError as better:
                raise better from e
            match = re.search(r"validator '(\w+)'", str(e))
            field = _RULE_OF_VALIDATOR.get(match.group(1), match.group(1)) if match else "config"
            raise plain(e, field, values.get(field)) from e

    def __setattr__(self, name, value):
        try:
            strict_setattr(self, name, value)
        except StrictDataclassError as e:
            raise plain(e, name, value) from e

    cls.__init__, cls.__setattr__ = __init__, __setattr__
    return cls


DFlash2Config = _explain_strict_errors(DFlash2Config)
