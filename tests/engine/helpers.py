"""Shared pieces of the engine tests: tiny models, prompts, oracle proposers, exact laws.

Oracle proposers implement the engine's proposer interface (`propose(DraftStep) -> Proposal`,
`block_size`, `target_layer_ids`) and are passed as `draft=`; the engine then runs its normal
verify/commit bookkeeping on their proposals. They read the committed tokens from
`DraftStep.tokens` and run a *separate copy* of the target (own config object, stock sdpa
attention, no cache) on right-padded prefixes; right padding never changes a causal model's
logits at a row's last real position.
"""

from __future__ import annotations

import copy
import functools

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from dflash2.assets import qwen3_tokenizer_dir
from dflash2.engine.draft import DraftStep, Proposal
from dflash2.modeling import DFlash2DraftModel
from tests.conftest import randomize_, tiny_draft_config, tiny_llama, tiny_qwen3

DTYPE = torch.float64  # exact-equality tests: fp64 makes argmax near-ties across batch shapes vanish

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then half as many in May.",
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "Explain the difference between a list and a tuple in Python.",
    "1, 2, 3, 4, 5,",
    "Q: What is 17 times 23?\nA:",
    "import torch\nimport numpy as np\n",
    "Write a haiku about the sea.",
    "The mitochondria is the powerhouse of",
    "SELECT name FROM users WHERE",
    "Give three tips for staying healthy.",
    "你好，世界",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog.",
    "x",
    "In 1492, Columbus",
    "Translate to German: Good morning, how are you?",
    "for i in range(10):\n    print(i",
    "A train leaves the station at 3 pm traveling 60 miles per hour.",
    "Roses are red,",
    "#include <stdio.h>\nint main() {",
]


@functools.lru_cache(maxsize=1)
def tokenizer():
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())


@functools.lru_cache(maxsize=1)
def prompts() -> list[torch.Tensor]:
    tok = tokenizer()
    return [torch.tensor(tok(t).input_ids, dtype=torch.long) for t in TEXTS]


@functools.cache
def qwen3_target(vocab: int | None = None, sliding: bool = False, seed: int = 0, head_scale: float = 1.0):
    """Tiny random Qwen3 (fp64, 4 layers, hidden 64); vocab defaults to the real tokenizer's.

    `sliding`: layers 1..3 use a 6-token sliding window (shorter than the tests' sequences).
    `head_scale` multiplies the LM head to make the next-token law peakier.
    """
    vocab = vocab or len(tokenizer())
    if not sliding:
        model = tiny_qwen3(vocab=vocab, layers=4, seed=seed)
    else:
        torch.manual_seed(seed)
        cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                          tie_word_embeddings=False, use_sliding_window=True, sliding_window=6, max_window_layers=1)
        model = Qwen3ForCausalLM(cfg).eval()
        assert model.config.layer_types == ["full_attention"] + ["sliding_attention"] * 3
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model.to(DTYPE).eval()


@functools.cache
def llama_target(vocab: int | None = None, seed: int = 0):
    return tiny_llama(vocab=vocab or len(tokenizer()), layers=4, seed=seed).to(DTYPE).eval()


@functools.cache
def random_draft(vocab: int | None = None, v2: bool = True, block_size: int = 10, top_k: int = 4,
                 seed: int = 1, std: float = 0.1):
    """Tiny draft with every parameter random (conv and selector included)."""
    vocab = vocab or len(tokenizer())
    cfg = tiny_draft_config(v2=v2, vocab=vocab, block_size=block_size, selector_top_k=top_k)
    model = DFlash2DraftModel(cfg)
    randomize_(model, seed=seed, std=std)
    return model.to(DTYPE).eval()


def hf_greedy(model, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """transformers' own greedy `generate` (sdpa + DynamicCache), prompt + generated."""
    with torch.no_grad():
        # An explicit all-ones mask: without it HF infers padding from pad_token_id, and token 0
        # ("!") occurs in real prompts.
        out = model.generate(prompt[None], attention_mask=torch.ones_like(prompt)[None], do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=0, eos_token_id=None)
    return out[0]


def detached_copy(model):
    """Same weights, separate config object: switching the engine's attention never touches it."""
    clone = type(model)(copy.deepcopy(model.config))
    clone.load_state_dict(model.state_dict())
    clone.config._attn_implementation_internal = "sdpa"
    return clone.to(DTYPE).eval()


class _Oracle:
    """Proposes from the target itself: slot j's law is a function of the target's logits
    given the committed prefix plus the slots already drafted."""

    def __init__(self, model, block_size: int, target_layer_ids=(0,)):
        self.model = detached_copy(model)
        self.block_size = block_size
        self.target_layer_ids = list(target_layer_ids)
        self.calls = 0

    def _next_logits(self, seqs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Target logits `[B, V]` at position `lens - 1` of right-padded `seqs [B, L]`."""
        hidden = self.model.model(input_ids=seqs).last_hidden_state  # [B, L, H]
        last = hidden[torch.arange(seqs.shape[0]), lens - 1]
        return self.model.lm_head(last).double()

    def choose(self, logits: torch.Tensor, step: DraftStep, j: int):
        raise NotImplementedError

    def propose(self, step: DraftStep) -> Proposal:
        self.calls += 1
        n = step.num_speculative_tokens
        lens = step.start + 1  # committed tokens incl. the anchor
        width = int(lens.max()) + n
        seqs = step.tokens[:, :width].clone()
        toks, cands, qs = [], [], []
        for j in range(n):
            tok, cand, q = self.choose(self._next_logits(seqs, lens + j), step, j)
            seqs.scatter_(1, (lens + j)[:, None], tok[:, None])
            toks.append(tok), cands.append(cand), qs.append(q)
        return Proposal(torch.stack(toks, 1), torch.stack(cands, 1), torch.stack(qs, 1).float())


class GreedyOracle(_Oracle):
    """Proposes the target's own greedy tokens with one-hot q: every slot must be accepted.

    `known`: optional greedy sequences (prompt + continuation) computed beforehand by HF
    `generate`; a row whose committed prefix is a prefix of one of them takes its proposal
    from there (no forwards), any other row is computed from the target. Both give the
    target's greedy continuation of the committed prefix.
    """

    def __init__(self, model, block_size: int, known: list[torch.Tensor] = (), **kw):
        super().__init__(model, block_size, **kw)
        self.known = [k.tolist() for k in known]

    def choose(self, logits, step, j):
        tok = logits.argmax(-1)
        return tok, tok[:, None], torch.ones(tok.shape[0], 1, dtype=torch.float64)

    def propose(self, step: DraftStep) -> Proposal:
        n = step.num_speculative_tokens
        rows = []
        for b, end in enumerate((step.start + 1).tolist()):
            prefix = step.tokens[b, :end].tolist()
            hit = next((k[end:end + n] for k in self.known if len(k) >= end + n and k[:end] == prefix), None)
            if hit is None:
                return super().propose(step)
            rows.append(hit)
        tok = torch.tensor(rows, dtype=torch.long).reshape(len(rows), n)
        return Proposal(tok, tok[..., None], torch.ones(*tok.shape, 1))


class SamplingOracle(_Oracle):
    """Samples slot j from the target's softmax(logits / T) restricted to its top-k and
    renormalized (q = exactly that law), with a private torch generator. Close to p, so most
    slots are accepted, yet q != p, so the residual path runs too."""

    def __init__(self, model, block_size: int, temperature: float, k: int = 4, seed: int = 0, **kw):
        super().__init__(model, block_size, **kw)
        self.temperature, self.k = temperature, k
        self.gen = torch.Generator().manual_seed(seed)

    def choose(self, logits, step, j):
        vals, ids = torch.topk(logits / self.temperature, self.k, dim=-1)
        q = torch.softmax(vals, dim=-1)  # [B, k]
        pick = torch.multinomial(q, 1, generator=self.gen)[:, 0]
        return ids.gather(1, pick[:, None])[:, 0], ids, q


def fp32_target_draft_prompts(vocab: int, layers: int):
    """A tiny fp32 Qwen3 target with `layers` layers, a random block-8 draft, and three prompts
    of lengths 5, 19 and 11 (different lengths exercise the padding and prefill paths)."""
    target = tiny_qwen3(vocab=vocab, hidden=64, layers=layers, seed=0).float()
    draft = randomize_(DFlash2DraftModel(tiny_draft_config(vocab=vocab, block_size=8)), seed=1, std=0.05).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab - 1, (n,), generator=g) for n in (5, 19, 11)]
    return target, draft, prompts
