"""`verify="adaptive"`: per-row verify lengths from earlier steps only, and losslessness.

- `verify_within` equals `verify_block` of each row's truncated block, bit for bit (T = 0 and T > 0);
- the recorded lengths follow the documented rule from the recorded accepted counts alone (so a
  step's length is a function of the earlier steps);
- greedy adaptive output equals AR token for token (fp64), and in exact mode bit for bit, with an
  oracle that accepts tokens and lengths that really cut blocks;
- sampled adaptive output passes the chi-square tests of `test_sampling.py` against the target's
  exact law, while an anticipating rule (defined only here: cut the block before the first drafted
  token whose target probability at this very step is low, the DSpark appendix A counterexample)
  fails the same tests with the same proposer, seeds and sizes;
- the graph path's bookkeeping (CPU stand-in) and a kept state's reset, the argument's check.
"""

from __future__ import annotations

import os

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine import state as engine_state
from dflash2.engine.inputs import GenerateInputError
from dflash2.engine.verify import ADAPTIVE_GROW, ADAPTIVE_SHRINK, next_lengths, verify_within
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer, OracleProposer
from dflash2.kernels.verify import verify_block
from tests.engine.helpers import SamplingOracle, qwen3_target
from tests.engine.test_graph_step import fake_graphs  # noqa: F401 (fixture)
from tests.engine.test_sampling import ALPHA, PROMPT, R, STEPS, pvalues, small_target

BLOCK = 10
MAX_NEW = 24
VOCAB = 300  # a small vocabulary keeps the fp64 target's head cheap (the real tokenizer's is 151k)


def rule(lengths: list[int], accepted: list[int], n_spec: int) -> list[int]:
    """The documented rule, written out on the host: the lengths a row's steps must have used."""
    want = [n_spec]
    for length, a in zip(lengths[:-1], accepted[:-1]):
        want.append(min(n_spec, length + ADAPTIVE_GROW) if a == length else max(1, length - ADAPTIVE_SHRINK))
    return want


def check_lengths(out, n_spec: int) -> int:
    """Every row's recorded lengths follow `rule` from its recorded accepted counts; returns the
    number of steps whose length bound the acceptance (accepted == length < N: the cut mattered
    or may have)."""
    bound = 0
    for lengths, accepted in zip(out.verify_lengths, out.accepted, strict=True):
        assert len(lengths) == len(accepted)
        assert all(0 <= a <= length <= n_spec for a, length in zip(accepted, lengths))
        assert lengths == rule(lengths, accepted, n_spec)
        bound += sum(a == length < n_spec for a, length in zip(accepted, lengths))
    return bound


# ---- the truncation itself


def _kernel_device(impl: str) -> str:
    """Where `impl` runs here: the torch reference on the CPU; Triton on CUDA, or on the CPU in its
    interpreter (tests/conftest.py turns it on without CUDA), else the case is skipped."""
    if impl == "torch":
        return "cpu"
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton without CUDA needs TRITON_INTERPRET=1")
    return "cpu"


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")  # masked-off lanes (kernels conftest)
# Triton's interpreter costs about 0.1 s per row and call on this CPU: its case is small, sampled.
@pytest.mark.parametrize("temperature,impl", [(0.0, "torch"), (0.9, "torch"), (0.9, "triton")])
def test_verify_within_is_verify_block_of_the_truncated_block(temperature, impl):
    device = _kernel_device(impl)
    g = torch.Generator().manual_seed(3)
    bsz, n, vocab, k = 40 if impl == "torch" else 12, 5, 12, 3
    logits = torch.randn(bsz, n + 1, vocab, generator=g) * 2
    # Candidates: the target's top-k per slot; q a softmax over them; draft drawn from q (greedy:
    # the argmax), so many slots are accepted and long accepted runs meet the cut.
    cand = logits[:, :n].topk(k, dim=-1).indices  # [B, N, k]
    q = torch.softmax(torch.randn(bsz, n, k, generator=g) + 2 * logits[:, :n].gather(-1, cand), dim=-1)
    pick = torch.zeros(bsz, n, dtype=torch.long)  # greedy: the argmax
    if temperature:
        pick = torch.multinomial(q.view(-1, k), 1, generator=g).view(bsz, n)
    d = cand.gather(-1, pick[..., None])[..., 0]
    temps = torch.full((bsz,), temperature)
    seeds = torch.randint(0, 2**62, (bsz,), generator=g)
    positions = torch.randint(5, 50, (bsz,), generator=g)
    lengths = torch.randint(0, n + 1, (bsz,), generator=g)
    args = [t.to(device) for t in (logits, d, cand, q, temps, seeds, positions)]
    acc, nxt = verify_within(*args, lengths.to(device), impl=impl)
    full_acc, _ = verify_block(*args, impl=impl)
    for L in range(n + 1):  # the rows of each length, verified as blocks of that length
        rows = (lengths == L).nonzero()[:, 0].to(device)
        lg, db, cb, qb, tb, sb, pb = (t[rows] for t in args)
        want_acc, want_nxt = verify_block(lg[:, :L + 1], db[:, :L], cb[:, :L], qb[:, :L], tb, sb, pb, impl=impl)
        assert torch.equal(acc[rows], want_acc) and torch.equal(nxt[rows], want_nxt), L
    assert int(acc.sum()) > 0
    assert bool((full_acc.cpu() > lengths).any())  # rows where the cut changed the outcome were checked


def test_next_lengths_rule():
    lengths = torch.tensor([1, 1, 4, 5, 5, 3])
    accepted = torch.tensor([1, 0, 4, 5, 2, 0])
    assert next_lengths("adaptive", lengths, accepted, 5).tolist() == [3, 1, 5, 5, 4, 2]
    assert next_lengths("chain", lengths, accepted, 5) is lengths
    none = torch.zeros(2, dtype=torch.long)
    assert next_lengths("adaptive", none, none, 0).tolist() == [0, 0]  # N = 0: nothing to verify


# ---- greedy: adaptive == AR


def small_vocab_rows(lengths=(5, 17, 9, 12)) -> list[torch.Tensor]:
    """Random prompts of different lengths (padding and prefill paths differ per row)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]


@pytest.fixture(scope="module")
def greedy_setup():
    target = qwen3_target(vocab=VOCAB, head_scale=4.0)
    rows = small_vocab_rows()
    ar = speculative_generate(target, None, rows, max_new_tokens=MAX_NEW)
    exact_ar = speculative_generate(target, None, rows, max_new_tokens=MAX_NEW, exact=True, exact_block_size=BLOCK)
    return target, rows, ar, exact_ar


def _oracle(ar, accept_prob):
    return OracleProposer([s.tolist() for s in ar.sequences], seeds=list(range(len(ar.sequences))), block_size=BLOCK,
                          accept_prob=accept_prob, vocab_size=VOCAB)


@pytest.mark.parametrize("exact", [False, True], ids=["normal", "exact"])
@pytest.mark.parametrize("n_spec", [3, 9])
def test_greedy_adaptive_equals_ar(greedy_setup, n_spec, exact):
    target, rows, ar, exact_ar = greedy_setup
    ref = exact_ar if exact else ar
    spec = speculative_generate(target, _oracle(ref, 0.85), rows, max_new_tokens=MAX_NEW,
                                num_speculative_tokens=n_spec, verify="adaptive", exact=exact)
    for a, b in zip(spec.sequences, ref.sequences, strict=True):
        assert torch.equal(a, b)
    assert sum(map(sum, spec.accepted)) >= len(rows) * 4  # the oracle really accepts: not a trivial equality
    assert any(min(lengths) < n_spec for lengths in spec.verify_lengths)  # shortened blocks were verified
    assert check_lengths(spec, n_spec) > 0  # and some ended at their length (the bonus at the cut)


def test_chain_is_the_default_and_ar_has_nothing_to_adapt(greedy_setup):
    target, rows, ar, _ = greedy_setup
    oracle = _oracle(ar, 0.75)
    default = speculative_generate(target, oracle, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=5)
    chain = speculative_generate(target, oracle, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=5,
                                 verify="chain")
    assert [s.tolist() for s in default.sequences] == [s.tolist() for s in chain.sequences]
    assert default.accepted == chain.accepted
    assert all(lengths == [5] * len(acc) for lengths, acc in zip(chain.verify_lengths, chain.accepted))
    adaptive_ar = speculative_generate(target, None, rows, max_new_tokens=MAX_NEW, verify="adaptive")
    assert [s.tolist() for s in adaptive_ar.sequences] == [s.tolist() for s in ar.sequences]
    assert all(set(lengths) == {0} for lengths in adaptive_ar.verify_lengths)


@pytest.mark.parametrize("bad", ["fast", "Adaptive", None, 3])
def test_bad_verify_values_are_refused_in_one_line(bad):
    with pytest.raises(GenerateInputError, match=r"^verify: is .*Fix: use 'chain'") as err:
        speculative_generate(qwen3_target(vocab=VOCAB), None, small_vocab_rows((3,)), max_new_tokens=2, verify=bad)
    assert "\n" not in str(err.value)


# ---- sampled: the target's law, and the anticipating rule that breaks it

N_SAMPLED, T_SAMPLED, TOPK_SAMPLED = 3, 0.8, 5
# The proposer samples from the target's top-2 (renormalized): q != p, about 70% of first slots
# accepted, so most rows run two or three steps and shortened blocks shape positions 2..4.
ORACLE_K = 2
TAU = 0.2  # the anticipating rule's cut: the first drafted token whose target probability is below this


class SharedPrefixOracle(SamplingOracle):
    """`SamplingOracle` that runs the target once per distinct prefix: the R rows share a prompt,
    so a step's rows hold a few hundred distinct prefixes (same law, less CPU)."""

    def _next_logits(self, seqs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        distinct, inverse = torch.unique(torch.cat([seqs, lens[:, None]], 1), dim=0, return_inverse=True)
        return super()._next_logits(distinct[:, :-1], distinct[:, -1])[inverse]


def _sampled_run(**kw):
    oracle = SharedPrefixOracle(small_target(), BLOCK, T_SAMPLED, k=ORACLE_K, seed=1)
    return speculative_generate(small_target(), oracle, PROMPT[None].expand(R, -1), max_new_tokens=STEPS,
                                num_speculative_tokens=N_SAMPLED, temperature=T_SAMPLED, top_k=TOPK_SAMPLED,
                                seed=1234, verify="adaptive", **kw)


def test_sampled_adaptive_follows_the_target_law():
    out = _sampled_run()
    ps = pvalues(out, T_SAMPLED, top_k=TOPK_SAMPLED)
    assert min(ps) > ALPHA, f"chi-square p-values {ps}"
    assert out.stats()["per_position_acceptance"][0] > 0.5  # the proposer accepts: the test is not vacuous
    # Blocks shorter than N were verified, and steps ended at their cut, within the 4 checked tokens.
    assert sum(length < N_SAMPLED for row in out.verify_lengths for length in row) > R // 2
    assert check_lengths(out, N_SAMPLED) > R // 4


def test_anticipating_cut_fails_the_same_test(monkeypatch):
    """Negative control: the same run, but each step's length chosen from that step's own target
    probabilities of the drafted tokens (a look-ahead the engine's policy never takes). Whether a
    sampled token is tested then depends on the token itself, so low-probability tokens are
    under-emitted; the chi-square tests that pass the adaptive rule reject this one."""
    cuts = []

    def anticipating(logits, draft_tokens, cand_ids, q, temperature, seeds, positions, lengths, impl):
        n = draft_tokens.shape[1]
        p_d = torch.softmax(logits[:, :n].double(), -1).gather(-1, draft_tokens[..., None])[..., 0]  # [B, N]
        low = p_d < TAU
        cut = torch.where(low.any(1), low.int().argmax(1), n)  # stop before the first low-probability token
        cuts.append(int((cut < n).sum()))
        return verify_within(logits, draft_tokens, cand_ids, q, temperature, seeds, positions, cut, impl)

    monkeypatch.setattr(engine_state, "verify_within", anticipating)
    out = _sampled_run()
    assert sum(cuts) > R // 4  # the rule did cut blocks
    assert out.stats()["per_position_acceptance"][0] > 0.5
    ps = pvalues(out, T_SAMPLED, top_k=TOPK_SAMPLED)
    assert min(ps) < ALPHA, f"chi-square p-values {ps}"


# ---- graph-path bookkeeping and kept states


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_adaptive_graph_path_equals_the_eager_loop(fake_graphs, temperature):  # noqa: F811
    target = qwen3_target(vocab=VOCAB, head_scale=4.0)
    rows = small_vocab_rows((7, 4, 13))
    ar = speculative_generate(target, None, rows, max_new_tokens=16, temperature=temperature, seed=[1, 2, 3])
    refs = [s.tolist() for s in ar.sequences]
    oracle = DeviceOracleProposer(refs, [1, 2, 3], block_size=BLOCK, accept_prob=0.8,
                                  vocab_size=target.config.vocab_size, device="cpu")
    kw = dict(max_new_tokens=16, num_speculative_tokens=6, temperature=temperature, seed=[1, 2, 3],
              verify="adaptive")
    eager = speculative_generate(target, oracle, rows, graphs=False, **kw)
    graphed = speculative_generate(target, oracle, rows, graphs=True, **kw)
    again = speculative_generate(target, oracle, rows, graphs=True, **kw)  # a kept state: lengths start at N again
    assert fake_graphs[-1].replays > 0
    for out in (graphed, again):
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in eager.sequences]
        assert out.accepted == eager.accepted and out.verify_lengths == eager.verify_lengths
    if temperature == 0.0:  # (at T = 1 the oracle's reference is one sampled path: few tokens accepted)
        assert [s.tolist() for s in eager.sequences] == refs
        assert check_lengths(eager, 6) > 0
