"""`TargetModel`: a stock transformers causal LM seen as a DFlash target (spec 2.1).

The target stays an unmodified `transformers` model. Features are captured with forward hooks
on its decoder layers (a public extension point): layer id `i` is the output of decoder layer
`i`, which is entry `i + 1` of HF's `hidden_states` tuple (entry 0 is the embedding output).
Only the layers the draft needs are kept, so no full `hidden_states` tuple is materialized.
HF records the *final-normed* state as the last `hidden_states` entry, and z-lab-trained drafts
saw exactly that tuple, so for the last layer id we capture the final norm's output instead.

transformers renamed the cache keyword of `forward` from `past_key_values` to `cache` (5.24
takes both but warns on the old name, which goes away in 5.40; 5.17 knows only the old one).
`cache_keyword` reads the installed model's signature once, so every supported version gets
the name it declares and no deprecation warning.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class TargetOutput:
    logits: torch.Tensor             # [B, S_kept, V]
    features: torch.Tensor | None    # [B, S, n*H] in layer_ids order, or None when no ids asked
    past_key_values: object | None = None


class TargetModel(nn.Module):
    """Wraps an HF causal LM (Qwen3, Llama families, ...).

    Args:
        model: a `transformers` causal LM (`AutoModelForCausalLM`-style, with
            `get_decoder().layers`, `get_input_embeddings()` and `get_output_embeddings()`).
        layer_ids: default 0-based decoder layers whose outputs `forward` returns as features.
    """

    def __init__(self, model: nn.Module, layer_ids: Sequence[int] | None = None):
        super().__init__()
        self.model = model
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.decoder_layers = decoder.layers
        self.cache_keyword = cache_keyword(model)
        self.layer_ids = list(layer_ids) if layer_ids is not None else []
        # The features of the forward running in this thread (None outside a forward): per thread,
        # so two threads' forwards on one model never read each other's layer outputs.
        self._capturing = threading.local()
        last = len(self.decoder_layers) - 1
        for i, layer in enumerate(self.decoder_layers):
            if i != last:
                layer.register_forward_hook(self._make_hook(i))
        # hidden_states[-1] is norm(last layer output) in transformers: match it.
        (decoder.norm if hasattr(decoder, "norm") else self.decoder_layers[last]).register_forward_hook(
            self._make_hook(last))

    def _make_hook(self, idx: int):
        def hook(_module, _inputs, output):
            capture = getattr(self._capturing, "features", None)
            if capture is not None and idx in capture:
                capture[idx] = output[0] if isinstance(output, tuple) else output
        return hook

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        gguf_file: str | None = None,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        layer_ids: Sequence[int] | None = None,
        **hf_kwargs,
    ) -> TargetModel:
        """Load a hub id, a local directory, or a GGUF file (`gguf_file=` inside the directory,
        or `name_or_path` pointing at the `.gguf` file itself)."""
        from transformers import AutoModelForCausalLM

        path = Path(name_or_path)
        if gguf_file is None and path.suffix == ".gguf":
            if not path.is_file():
                raise FileNotFoundError(f"GGUF file {path} does not exist")
            name_or_path, gguf_file = str(path.parent), path.name
        if gguf_file is not None:
            try:
                import gguf  # noqa: F401  (transformers needs it to dequantize)
            except ImportError as e:
                raise ImportError("loading a GGUF target needs the `gguf` package: pip install gguf") from e
        kwargs = dict(hf_kwargs)
        if dtype is not None:
            kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), gguf_file=gguf_file, **kwargs)
        if device is not None:
            model = model.to(device)
        return cls(model.eval(), layer_ids=layer_ids)

    # ------------------------------------------------------------------ properties
    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.lm_head_weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head_weight.dtype

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """`[V, H]` output projection (tied to the input embedding for tied models)."""
        return self.model.get_output_embeddings().weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings `E_in[ids]` `[..., H]` (with any model-specific input scale applied by
        the HF embedding module itself). A plain `nn.Embedding` (no `max_norm`; weights not being
        trained) is read as `weight[ids]`: the same rows, bit for bit, in one gather kernel instead
        of `F.embedding`'s small-index kernel."""
        emb = self.model.get_input_embeddings()
        if (type(emb) is nn.Embedding and emb.max_norm is None
                and not (torch.is_grad_enabled() and emb.weight.requires_grad)):
            return emb.weight[ids]
        return emb(ids)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head logits `E_out h` `[..., V]` (no multiplier/softcap: those are the draft's)."""
        return self.model.get_output_embeddings()(hidden)

    # ------------------------------------------------------------------ compatibility
    def check_compatible(self, draft_config) -> None:
        """Explain, as a `DFlash2ConfigError`, why a draft cannot run on this target."""
        from dflash2.config import DFlash2ConfigError

        try:
            draft_config.check(target_num_layers=self.num_layers, target_hidden_size=self.hidden_size,
                               target_vocab_size=self.vocab_size)
        except DFlash2ConfigError as e:
            name = getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
            raise DFlash2ConfigError(f"draft does not fit target '{name}' ({self.num_layers} layers, "
                                     f"hidden {self.hidden_size}, vocab {self.vocab_size}): {e}") from e

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
        layer_ids: Sequence[int] | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> TargetOutput:
        """Run the stock model once.

        Args:
            input_ids: `[B, S]`.
            position_ids: `[B, S]` absolute positions (per row).
            past_key_values: any transformers `Cache` (the engine passes its static cache).
            layer_ids: feature layers (default: the ones given at construction).
            logits_to_keep: as in transformers (0 = all positions; an int keeps the last ones;
                a 1-D index tensor keeps those positions).
            kwargs: passed to the HF model; attention kwargs reach the attention function.
        Returns:
            `TargetOutput(logits [B, S_kept, V], features [B, S, n*H] or None)`.
        """
        ids = list(self.layer_ids if layer_ids is None else layer_ids)
        bad = [i for i in ids if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"layer_ids {bad} out of range for a target with {self.num_layers} layers")
        capture = self._capturing.features = {i: None for i in ids}
        kw = self.cache_keyword
        try:
            out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, position_ids=position_ids,
                             use_cache=past_key_values is not None, logits_to_keep=logits_to_keep,
                             **{kw: past_key_values}, **kwargs)
            feats = torch.cat([capture[i] for i in ids], dim=-1) if ids else None
        finally:
            self._capturing.features = None
        # The output field was renamed with the keyword; reading the old name warns on 5.24.
        return TargetOutput(out.logits, feats, out.get(kw))


def cache_keyword(model: nn.Module) -> str:
    """The cache keyword `model.forward` declares: `"cache"` (transformers >= 5.24) or
    `"past_key_values"` (older releases, and models whose signature we cannot read)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def as_target(model, layer_ids: Sequence[int] | None = None) -> TargetModel:
    """`TargetModel` as is, or a plain HF causal LM wrapped (hooks are added once per model)."""
    if isinstance(model, TargetModel):
        return model
    cached = getattr(model, "_dflash2_target", None)
    if cached is None:
        cached = TargetModel(model, layer_ids)
        object.__setattr__(model, "_dflash2_target", cached)
    elif layer_ids is not None:
        cached.layer_ids = list(layer_ids)
    return cached
