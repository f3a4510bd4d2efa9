"""lm-evaluation-harness integration: our speculative decoder as the lm-eval model `dflash2`.

`generate_until` runs `speculative_generate` (the same lossless engine as `eval/run.py`; greedy
output equals the target's AR output), honouring each request's `until` strings and
`max_gen_toks`; `loglikelihood` / `loglikelihood_rolling` score with the target's logits
(the draft never changes a probability). Command line (lm-eval's own CLI, with `dflash2`
registered first, since lm-eval 0.4 discovers no plug-in models by itself):

    python -m dflash2.evaluation.running.lm_eval --model dflash2 \\
        --model_args target=qwen3-8b,draft=/ckpt/dflash2-5l,num_speculative_tokens=7 \\
        --tasks gsm8k --batch_size 8

Python: `lm_eval.simple_evaluate(model="dflash2", model_args="target=...,draft=...")` after
`import dflash2.evaluation.running.lm_eval` (or pass a `DFlash2LM` instance as `model=`).

Model args: `target` = a preset in `configs/target/` (e.g. `qwen3-8b`, `smollm2-135m`), a hub
id / local directory, or a `.gguf` file; `draft` = a checkpoint directory, or `none` for the
AR baseline; `num_speculative_tokens` (default block_size - 1), `dtype` (overrides the preset's),
`max_new_tokens` (default cap when a request gives none),
`max_length` (context window for scoring), `temperature` / `seed` (generation; default greedy),
`impl` (kernel implementation), `tokenizer` (overrides the target's). The device and batch size
come from lm-eval's own `--device` / `--batch_size` flags (its CLI always passes `--device`,
default cuda:0, which falls back to CPU with a warning when CUDA is absent).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from dflash2.runconfig import target_spec  # noqa: F401 (part of this module's API)

log = logging.getLogger(__name__)


def _none(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "null", "ar"))


class DFlash2LM(TemplateLM):
    """lm-eval model running DFlash2 speculative decoding through `dflash2.engine`.

    Args:
        target: preset name, hub id, directory or `.gguf` path; or a loaded `TargetModel` /
            HF causal LM (then pass `tokenizer=` a tokenizer object).
        draft: checkpoint directory, a `DFlash2DraftModel`, or None / "none" (AR baseline).
        num_speculative_tokens: N (default block_size - 1; 0 = AR).
        device: auto | cpu | cuda | cuda:i (ignored for an already loaded target).
        dtype: target dtype override (float32, bfloat16, float16).
        max_new_tokens: generation cap when a request sets no `max_gen_toks`.
        max_length: context window for loglikelihood (default: min(target max positions, 4096)).
        batch_size: prompts per engine call (lm-eval passes its `--batch_size`).
        temperature, seed: sampling (default greedy); a request's own `temperature` wins when
            it sets `do_sample`.
    """

    def __init__(self, target: Any = "tiny-qwen3", draft: Any = None, num_speculative_tokens: int | None = None,
                 device: str | None = "auto", dtype: str | None = None, max_new_tokens: int = 256,
                 max_length: int | None = None, batch_size: int | str | None = 1, max_batch_size: int | None = None,
                 temperature: float = 0.0, seed: int = 0, impl: str = "auto", tokenizer: Any = None, **kwargs):
        super().__init__()
        from dflash2.modeling import DFlash2DraftModel
        from dflash2.runconfig import HardwareSpec, load_target, resolve_device
        from dflash2.target import as_target

        if kwargs:
            log.warning("dflash2: ignoring unknown model args %s", sorted(kwargs))
        if isinstance(target, str):
            if device and str(device).startswith("cuda") and not torch.cuda.is_available():
                # lm-eval's CLI passes --device (default cuda:0) even on a CPU-only machine.
                log.warning("dflash2: device=%s but CUDA is not available; running on CPU", device)
                device = "cpu"
            dev = resolve_device(HardwareSpec(device=device or "auto"))
            tok_name = tokenizer if isinstance(tokenizer, str) else None
            self.target, self.tokenizer = load_target(target_spec(target, dtype=dtype, tokenizer=tok_name), dev)
            if tokenizer is not None and not isinstance(tokenizer, str):
                self.tokenizer = tokenizer
        else:
            if tokenizer is None or isinstance(tokenizer, str):
                raise ValueError("dflash2: a loaded target model needs tokenizer=<tokenizer object>")
            self.target, self.tokenizer = as_target(target), tokenizer
        self._device = self.target.device
        if _none(draft):
            self.draft = None
        elif isinstance(draft, (str, Path)):
            if not Path(draft).is_dir():
                raise FileNotFoundError(f"draft={draft}: not a checkpoint directory (or pass draft=none for AR)")
            self.draft = DFlash2DraftModel.from_pretrained(str(draft), dtype=self.target.dtype, device=self._device)
        else:
            self.draft = draft
        if isinstance(self.draft, torch.nn.Module):
            self.draft.eval()
        if self.draft is not None and hasattr(self.draft, "config"):  # proposer objects have no config
            self.target.check_compatible(self.draft.config)
        self.num_speculative_tokens = None if _none(num_speculative_tokens) else int(num_speculative_tokens)
        self.max_new_tokens = int(max_new_tokens)
        cap = getattr(self.target.config, "max_position_embeddings", 4096) or 4096
        self.max_length = int(max_length) if max_length else min(int(cap), 4096)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 1  # "auto" -> 1
        self.temperature, self.seed, self.impl = float(temperature), int(seed), impl
        from dflash2.runconfig import stop_token_ids

        self.stop_ids = stop_token_ids(self.tokenizer)
        self.accepted: list[list[int]] = []  # per generated row, per step (for tau after a run)

    # ------------------------------------------------------------------ tokenizer
    @property
    def eot_token_id(self) -> int:
        return self.stop_ids[0] if self.stop_ids else int(self.tokenizer.eos_token_id)

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "tokenizer")).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def tok_decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """Sum of log p(continuation | context) under the target, and whether greedy decoding
        would produce the continuation. Rows are right-padded, which leaves a causal model's
        logits at real positions unchanged."""
        out: list[tuple[float, bool]] = []
        bs = max(self.batch_size, 1)
        for i in tqdm(range(0, len(requests), bs), disable=disable_tqdm, desc="dflash2 loglikelihood"):
            chunk = requests[i:i + bs]
            rows, conts = [], []
            for _, ctx, cont in chunk:
                if not cont:
                    raise ValueError("dflash2: empty continuation in a loglikelihood request")
                full = (list(ctx) + list(cont))[-(self.max_length + 1):]
                rows.append(full[:-1])  # inputs; position j predicts full[j + 1]
                conts.append(list(cont)[-min(len(cont), len(full) - 1):])  # tokens that have a prediction
            width = max(len(r) for r in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long, device=self._device)
            for b, r in enumerate(rows):
                ids[b, :len(r)] = torch.tensor(r, device=self._device)
            logits = self.target(ids).logits  # [b, S, V]
            acc = torch.float64 if logits.dtype == torch.float64 else torch.float32  # never below fp32
            for b, (r, cont) in enumerate(zip(rows, conts)):
                k = len(cont)
                # [k, V]: log-probabilities of the positions that predict the continuation tokens
                lp = torch.log_softmax(logits[b, len(r) - k:len(r)].to(acc), dim=-1)
                want = torch.tensor(cont, device=self._device)
                out.append((float(lp.gather(-1, want[:, None]).sum()), bool((lp.argmax(-1) == want).all())))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="dflash2 rolling loglikelihood"):
            (string,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows], disable_tqdm=True)
            out.append(sum(s for s, _ in scores))
        return out

    # ------------------------------------------------------------------ generation
    @staticmethod
    def _cut(text: str, until: list[str]) -> str:
        """Text up to the first occurrence of any stop string."""
        cut = len(text)
        for s in until:
            if s:
                j = text.find(s)
                if j != -1:
                    cut = min(cut, j)
        return text[:cut]

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Speculative generation per request, batched by identical generation kwargs.

        Stop strings are applied to the decoded text after generation (the engine stops on
        end-of-turn tokens and `max_gen_toks`), so what is returned equals what an AR decoder
        with the same stop rules returns.
        """
        from dflash2.engine import speculative_generate

        results: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items(), key=lambda kv: kv[0])), []).append(i)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="dflash2 generate_until")
        for idxs in groups.values():
            kw = dict(requests[idxs[0]].args[1])
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", self.max_new_tokens))
            # The task's sampling settings win over the model's (as in lm-eval's HF model).
            do_sample, t_req = kw.pop("do_sample", None), kw.pop("temperature", None)
            temp = 0.0 if do_sample is False else (self.temperature if t_req is None else float(t_req))
            top_p, top_k = float(kw.pop("top_p", 1.0) or 1.0), int(kw.pop("top_k", 0) or 0)
            if kw:
                log.warning("dflash2: ignoring generation kwargs %s", sorted(kw))
            for j in range(0, len(idxs), max(self.batch_size, 1)):
                batch = idxs[j:j + max(self.batch_size, 1)]
                prompts = []
                for i in batch:
                    ids = self.tok_encode(requests[i].args[0])
                    keep = max(self.max_length - max_new, 1)  # left-truncate long contexts, as HFLM does
                    prompts.append(torch.tensor(ids[-keep:] or [self.eot_token_id], dtype=torch.long))
                out = speculative_generate(self.target, self.draft, prompts, max_new_tokens=max_new,
                                           num_speculative_tokens=self.num_speculative_tokens, temperature=temp,
                                           top_p=top_p, top_k=top_k, seed=self.seed, stop_token_ids=self.stop_ids,
                                           impl=self.impl)
                self.accepted.extend(out.accepted)
                for i, gen in zip(batch, out.generated):
                    text = self._cut(self.tok_decode(gen.tolist()), until)
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(batch))
        bar.close()
        if self.accepted and self.draft is not None:
            from dflash2.engine.stats import tau_pooled

            log.info("dflash2: tau pooled (incl. bonus) %.3f over %d steps", tau_pooled(self.accepted),
                     sum(len(a) for a in self.accepted))
        return results  # type: ignore[return-value]


def register() -> None:
    """Register `DFlash2LM` as lm-eval model `dflash2` (idempotent: `python -m` runs this file as
    `__main__`, and a later `import dflash2.evaluation.running.lm_eval` must not collide with it)."""
    import lm_eval.models  # noqa: F401  (lm-eval fills its built-in models only into an empty registry)
    from lm_eval.api.registry import model_registry

    if "dflash2" not in model_registry:
        register_model("dflash2")(DFlash2LM)


register()


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the `dflash2` model registered (importing this module did)."""
    from lm_eval.__main__ import cli_evaluate

    # lm-eval's HarnessCLI reads sys.argv itself (it inserts the legacy `run` subcommand there).
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
