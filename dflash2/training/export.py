"""Warm start (`init_from=`) and the final z-lab-format export (`DIR/final/`).

The export is `DFlash2DraftModel.save_pretrained` (config.json + model.safetensors with the
fixture's tensor names) plus one extra top-level config field, `dflash2_training`, recording
the run: prompt-format hash of the training data, steps, data name, experiment. Loaders ignore
the field; the evaluation runner reads the hash to warn when it prompts differently.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from dflash2.config import DFLASH2_ARCHITECTURE, DFlash2Config

TRAINING_FIELD = "dflash2_training"
DFLASH2_ONLY = ("attention_conv", "mlp_conv", "candidate_selector")


def export_final(draft, out_dir: str | Path, info: dict, dtype: torch.dtype | None = None) -> Path:
    """Write `draft` (cast to `dtype`) to `out_dir` in z-lab format with `info` under
    `config.json[dflash2_training]`. Returns the directory."""
    out = Path(out_dir)
    model = copy.deepcopy(draft).cpu()
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[TRAINING_FIELD] = info
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def training_info(path: str | Path) -> dict | None:
    """The `dflash2_training` record of an exported checkpoint, or None."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    return cfg.get(TRAINING_FIELD)


def warm_start(path: str | Path, architecture: str, draft_spec=None):
    """A draft initialized from a v1 or v2 checkpoint.

    A v1 checkpoint warm-starts a DFlash2 draft (`architecture=dflash2`): its tensors load into
    the shared modules and conv + selector start at identity (so the new draft equals the v1
    one). Conv/selector sizes then come from `draft_spec`. Returns the model in fp32.
    """
    from dflash2.checkpoint import read_tensors
    from dflash2.modeling import DFlash2DraftModel

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"init_from={path}: no config.json there (expected a z-lab draft checkpoint dir)")
    src = DFlash2DraftModel.from_pretrained(path, dtype=torch.float32)
    if architecture == "v1" or src.config.is_dflash2:
        if architecture == "v1" and src.config.is_dflash2:
            raise ValueError(f"init_from={path} is a DFlash2 checkpoint but draft.architecture=v1; "
                             "use draft.architecture=dflash2")
        return src.train()
    cfg_dict = src.config.to_dict()
    cfg_dict.pop(TRAINING_FIELD, None)
    cfg_dict["architectures"] = [DFLASH2_ARCHITECTURE]
    dc = dict(cfg_dict["dflash_config"])
    if draft_spec is not None:
        dc.update(conv_kernel_size=draft_spec.conv_kernel_size, conv_group_size=draft_spec.conv_group_size,
                  selector_rank=draft_spec.selector_rank,
                  selector_top_k=min(draft_spec.selector_top_k, cfg_dict["vocab_size"]))
    cfg_dict["dflash_config"] = dc
    cfg = DFlash2Config(**{k: v for k, v in cfg_dict.items() if k not in ("transformers_version", "model_type")})
    cfg.check()
    torch.manual_seed(0)
    model = DFlash2DraftModel(cfg)
    tensors = read_tensors(path)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    bad = [k for k in missing if not any(p in k for p in DFLASH2_ONLY)]
    if bad or unexpected:
        raise ValueError(f"init_from={path}: tensors do not fit a DFlash2 draft of its config "
                         f"(missing {bad[:3]}, unexpected {list(unexpected)[:3]})")
    return model.train()
