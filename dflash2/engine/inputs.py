"""Host-side checks of every `speculative_generate` argument, before any device work.

A bad token id reaching the embedding is an `IndexError` on CPU and, on CUDA, a device-side
assert that poisons the whole process's CUDA context; a float prompt is silently truncated;
a sequence past the target's `max_position_embeddings` runs on positions the model never saw.
So everything is checked here, on the host, once per call and never inside the decode loop:
each error names the argument (row and position for ids), the value, the limit and the fix.

The position limit is the one serving engines enforce as their maximum model length: every
position the row occupies must be below `max_position_embeddings`. A row of `P` prompt tokens
and `M` new tokens spans positions `0 .. P+M-1`; with `N` speculative tokens the last verify
block starts at the anchor `P+M-2` and reaches `P+M-2+N`, i.e. `N-1` positions further
(static shapes: the engine always verifies a full block).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from dflash2.engine.compiled import COMPILE_LEVELS
from dflash2.engine.settings import DEFAULT_EXACT_BLOCK_SIZE, EXACT_IMPLS, EngineSettings
from dflash2.engine.verify import VERIFY_POLICIES
from dflash2.kernels.dispatch import IMPLS, resolve_impl
from dflash2.target import TargetModel, as_target


class GenerateInputError(ValueError):
    """An argument of `speculative_generate` is invalid; the message names it and the fix."""


@dataclass
class GenerateInputs:
    """Checked arguments: `rows` are 1-D int64 CPU prompts; `stop_token_ids` is None or a
    non-empty list of ints; `num_speculative_tokens` is resolved (0 = AR, draft dropped);
    `seed` is None, an int, or one int per row; `settings` holds the kernels resolved for the
    target's device, exact mode with its padded width (resolved even when exact mode is off),
    the compile level, whether graphs replay and the verify policy (`"chain"` whenever N = 0)
    (`dflash2.engine.settings`)."""

    target: TargetModel
    draft: object | None
    rows: list[torch.Tensor]
    num_speculative_tokens: int
    stop_token_ids: list[int] | None
    seed: int | list[int] | None
    settings: EngineSettings


MAX_TREE_BUDGET = 64  # tree verify: nodes per step's tree (the mask is B x kv per row)


def _graphs_arg(graphs, tgt: TargetModel, draft, exact: bool) -> bool:
    """Resolve `graphs` (None = auto) to whether the steady-state step replays CUDA graphs."""
    if graphs is not None and not isinstance(graphs, bool):
        _fail("graphs", f"is {graphs!r}", "pass None (auto), True or False")
    reasons = []
    if tgt.device.type != "cuda":
        reasons.append(f"the target is on {tgt.device}, and CUDA graphs need a CUDA device")
    if exact:
        reasons.append("exact mode with exact_impl='rows' runs its row-by-row forwards eagerly")
    if draft is not None and hasattr(draft, "propose") and not getattr(draft, "graph_safe", False):
        reasons.append(f"the proposer {type(draft).__name__} does not declare graph_safe = True (its propose() "
                       "may run host code, which a captured step would not repeat)")
    if graphs and reasons:
        _fail("graphs", "is True but " + "; ".join(reasons), "pass graphs=None (auto) or graphs=False")
    return not reasons if graphs is None else bool(graphs)


def invariant_unavailable(device: torch.device) -> str | None:
    """Why exact mode's invariant kernels cannot run on `device` (None: they can): Triton missing,
    or a non-CUDA device without Triton's interpreter. Shared by the engine's check and
    `eval/run.py`'s, which runs before any model is loaded."""
    from dflash2.kernels.dispatch import triton_available, triton_interpreter_enabled

    if not triton_available():
        return "needs Triton, which is not installed"
    if device.type != "cuda" and not triton_interpreter_enabled():
        return f"runs its kernels on CUDA (elsewhere only under TRITON_INTERPRET=1), not on {device}"
    return None


def exact_width(block_size: int | None, num_speculative_tokens: Iterable[int] = ()) -> int | None:
    """The exact-mode width of runs compared bit for bit: the draft's `block_size`, widened to the
    largest N + 1 of the runs (an oracle may verify more tokens than the drafter's block holds);
    None when neither is given. Only runs of one width are bit-identical, so every run of a
    comparison (the AR reference included) is given this one width. `speculative_generate` applies
    it to its own draft when `exact_block_size` is not passed; the evaluation runner and the
    preflight apply it to the arms of a run."""
    widths = ([int(block_size)] if block_size is not None else []) + [int(n) + 1 for n in num_speculative_tokens]
    return max(widths) if widths else None


def resolve_exact(exact, exact_impl, device: torch.device, *, compile_level=None,
                  shape: tuple[int, int, int] | None = None, width: int | None = None) -> str:
    """The one resolver and check of exact mode's settings: `exact` a bool; `compile_level` one
    exact mode can run (`resolve_compile`); `exact_impl` (`"auto" | "rows" | "invariant"`)
    resolved: auto = `"invariant"` on a CUDA device whose kernels can run it (proven in bf16 on the
    H200: tests/gpu/test_exact_mode.py), `"rows"` everywhere else (on a CPU the interpreter would
    run the Triton kernels slowly). With `exact`, `"invariant"` is refused where its kernels cannot
    run (no Triton; a non-CUDA device without the interpreter; with `shape` = (heads, kv_heads,
    head_dim) and `width`, an attention layout the row-attention kernel does not take at `width`,
    the padded block of `"rows"` and the query tile of `"invariant"`). `speculative_generate`'s
    checks call it with the target's shapes; `eval/run.py`'s config checks call it before any
    model is loaded (no `shape`). Raises `GenerateInputError` naming the argument and the fix."""
    if not isinstance(exact, bool):
        _fail("exact", f"is {exact!r}", "pass True or False")
    if exact_impl not in ("auto", *EXACT_IMPLS):
        _fail("exact_impl", f"is {exact_impl!r}", "use 'auto', 'rows' or 'invariant'")
    if exact_impl == "rows" or (exact_impl == "auto" and device.type != "cuda"):
        resolve_compile(compile_level, device, exact, "rows")
        return "rows"
    unavailable = invariant_unavailable(device)
    reasons = [f"it {unavailable}"] if unavailable else []
    if shape is not None and width is not None:
        from dflash2.kernels.row_attention import kernel_fits

        heads, kv_heads, head_dim = shape
        if not kernel_fits(heads, kv_heads, width, head_dim, head_groups=True):
            reasons.append(f"the row-attention kernel does not take {heads}/{kv_heads} heads x width {width} x "
                           f"head_dim {head_dim}")
    if exact_impl == "auto":
        kind = "rows" if reasons else "invariant"
    else:
        if exact and reasons:
            _fail("exact_impl", "is 'invariant' but " + "; ".join(reasons), "pass exact_impl='rows' (or 'auto')")
        kind = "invariant"
    resolve_compile(compile_level, device, exact, kind)
    return kind


def resolve_compile(compile_level, device: torch.device, exact: bool, exact_kind: str) -> str | None:
    """The compile level a call runs (`dflash2.engine.compiled`), from `compile_level`
    (`"auto"`, the default, None = off, `"light"` or `"full"`).

    `"auto"` = `"light"` on a CUDA device with Triton, in normal mode and in exact mode with the
    invariant kernels (compiled, their norms' means and linears stay the invariant operators and
    everything Inductor fuses around them is per element: `dflash2.engine.compiled`); None on
    any other device and in exact mode `"rows"`, whose proof is the stock kernels run eagerly.
    Refused (`GenerateInputError`): an unknown level; a level with exact mode `"rows"`;
    `"full"` with exact mode (it compiles each attention module, which exact mode's proof does
    not cover)."""
    if compile_level is not None and compile_level not in ("auto", *COMPILE_LEVELS):
        _fail("compile_level", f"is {compile_level!r}", f"pass 'auto' (the default), None (off) or one of "
              f"{COMPILE_LEVELS}")
    if compile_level == "auto":
        from dflash2.kernels.dispatch import triton_available

        if device.type != "cuda" or not triton_available() or (exact and exact_kind == "rows"):
            return None
        return "light"
    if compile_level is not None and exact:
        if exact_kind == "rows":
            _fail("compile_level", f"is {compile_level!r} with exact_impl='rows' (that exact mode runs the stock "
                  "kernels eagerly, row by row)", "pass compile_level='auto' or None, or exact_impl='invariant'")
        if compile_level == "full":
            _fail("compile_level", "is 'full' with exact=True (exact mode compiles the norms and MLPs only; "
                  "'full' also compiles each attention module)", "pass compile_level='light' or 'auto'")
    return compile_level


def resolve_linear(linear_impl, device: torch.device, exact: bool) -> str:
    """The resolved `linear_impl` of a call: `"auto"` (the default) = the small-M kernel
    (`"triton"`) on CUDA with Triton, `"torch"` elsewhere; in exact mode always `"torch"` here,
    since exact mode picks its own linear (the invariant small-M kernel for every row count, or
    the stock one row by row), and an explicit `"triton"` is refused there."""
    if linear_impl not in IMPLS:
        _fail("linear_impl", f"is {linear_impl!r}", f"use one of {IMPLS}")
    if exact:
        if linear_impl == "triton":
            _fail("linear_impl", "is 'triton' with exact=True (exact mode picks its own kernels: exact_impl)",
                  "drop one of the two")
        return "torch"
    return resolve_impl(linear_impl, device)


def resolve_exact_impl(exact_impl, exact: bool, tgt: TargetModel, width: int, compile_level=None) -> str:
    """`resolve_exact` for `tgt`'s device and attention shapes at `width`."""
    from dflash2.engine.cache import attention_heads

    return resolve_exact(exact, exact_impl, tgt.device, compile_level=compile_level,
                         shape=attention_heads(tgt.config), width=width)


def _fail(what: str, problem: str, fix: str) -> None:
    raise GenerateInputError(f"{what}: {problem}. Fix: {fix}.")


def _is_int(x) -> bool:
    """A Python/numpy integer or a 0-d integer tensor; never a bool, float or string."""
    if isinstance(x, torch.Tensor):  # a one-element 1-D tensor also has __index__: not an int here
        return x.dim() == 0 and not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _int_arg(name: str, value, low: int, high: int | None = None, hint: str = "") -> int:
    """`value` as an int in `[low, high]` (inclusive), or an error naming `name`."""
    span = f"[{low}, {high}]" if high is not None else f">= {low}"
    if not _is_int(value):
        _fail(name, f"{value!r} ({type(value).__name__}) is not an integer", f"pass an int {span}{hint}")
    v = operator.index(value)
    if v < low or (high is not None and v > high):
        _fail(name, f"{v} is outside {span}", f"pass an int {span}{hint}")
    return v


def _real_arg(name: str, value, ok, span: str, hint: str = "") -> float:
    """`value` as a finite float satisfying `ok`, or an error naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(name, f"{value!r} ({type(value).__name__}) is not a real number", f"pass a float in {span}{hint}")
    v = float(value)
    if not (math.isfinite(v) and ok(v)):
        what = f"outside {span}" if math.isfinite(v) else "not finite"
        _fail(name, f"{v} is {what}", f"pass a float in {span}{hint}")
    return v


def _prompt_rows(input_ids) -> list[torch.Tensor]:
    """`[B, P]` tensor, or a list of 1-D tensors / int lists -> 1-D int64 CPU rows."""
    if isinstance(input_ids, (str, bytes)):
        _fail("input_ids", "is text", "tokenize it first: tokenizer(text).input_ids, wrapped as [ids]")
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() not in (1, 2):
            _fail("input_ids", f"has shape {tuple(input_ids.shape)}",
                  "pass [B, P] (one prompt per row), a 1-D prompt, or a list of 1-D prompts")
        raw = [input_ids] if input_ids.dim() == 1 else list(input_ids.unbind(0))
    else:
        try:
            raw = list(input_ids)
        except TypeError:
            _fail("input_ids", f"is a {type(input_ids).__name__}",
                  "pass a [B, P] integer tensor or a list of 1-D prompts")
        if raw and all(_is_int(x) for x in raw):
            _fail("input_ids", f"is a flat list of {len(raw)} ints, read as {len(raw)} one-token prompts",
                  "wrap one prompt as [ids]; a list holds one prompt per row")
    if not raw:
        _fail("input_ids", "is empty (no prompts)", "pass at least one prompt")
    rows = []
    for b, r in enumerate(raw):
        name = f"input_ids row {b}"
        if isinstance(r, (str, bytes)):
            _fail(name, "is text", "tokenize it first")
        if not isinstance(r, torch.Tensor):
            try:
                r = torch.as_tensor(r)
            except (TypeError, ValueError, RuntimeError) as e:
                _fail(name, f"is not a sequence of token ids ({e})", "pass a list of ints or a 1-D integer tensor")
        if r.dim() != 1:
            _fail(name, f"has shape {tuple(r.shape)}", "each prompt must be 1-D (a flat list of token ids)")
        r = r.detach().to("cpu")
        if r.numel() == 0:  # before the dtype test: torch.as_tensor([]) is float32
            _fail(name, "is empty; every prompt needs at least one token", "drop the row or give it a prompt")
        if r.is_floating_point() or r.is_complex() or r.dtype == torch.bool:
            _fail(name, f"has dtype {r.dtype} (first value {r[0].item()!r}); token ids must be integers",
                  "pass the tokenizer's ids unchanged as torch.long (a float cast can silently change ids)")
        rows.append(r.long())
    return rows


def _check_ids(name: str, ids: torch.Tensor, vocab: int, hint: str) -> None:
    """Every entry of the 1-D int64 CPU tensor `ids` in `[0, vocab)`; names the first that is not."""
    bad = ((ids < 0) | (ids >= vocab)).nonzero()
    if bad.numel():
        pos = int(bad[0, 0])
        value = int(ids[pos])
        why = "is negative (padding or an ignore index such as -100?)" if value < 0 else "is not in the vocabulary"
        _fail(f"{name}, position {pos}", f"token id {value} {why}; the target's ids lie in [0, {vocab})", hint)


def _check_draft(draft, tgt: TargetModel) -> None:
    """A draft model (or proposer) that can run with this target, or a clear error."""
    if hasattr(draft, "propose"):
        for attr in ("block_size", "target_layer_ids"):
            if not hasattr(draft, attr):
                _fail("draft", f"has `propose` but no `{attr}`",
                      "a proposer needs propose(DraftStep), block_size and target_layer_ids")
        return
    if not hasattr(draft, "config") or not hasattr(draft, "block_size"):
        _fail("draft", f"is a {type(draft).__name__}, not a draft model",
              "load one with DFlash2DraftModel.from_pretrained(path), or pass None for the AR baseline")
    tgt.check_compatible(draft.config)
    # The draft reads the target's embeddings of its block tokens, so both must share a device
    # and dtype; otherwise the first draft matmul fails deep inside the loop.
    emb = tgt.model.get_input_embeddings().weight
    param = next(iter(draft.parameters()), None) if hasattr(draft, "parameters") else None
    if param is not None and (param.device != emb.device or param.dtype != emb.dtype):
        _fail("draft", f"is on {param.device} in {param.dtype}, the target's embeddings on {emb.device} in "
              f"{emb.dtype}", f"move the draft with draft.to(device={str(emb.device)!r}, dtype={emb.dtype})")


def _check_position_limit(rows: list[torch.Tensor], max_new: int, n_spec: int, limit: int) -> None:
    """The longest row's highest position (module docstring) must be below `limit`."""
    overhang = n_spec - 1 if (n_spec > 0 and max_new >= 2) else 0
    b = max(range(len(rows)), key=lambda i: rows[i].numel())
    plen = rows[b].numel()
    last = plen + max_new - 1 + overhang
    if last >= limit:
        room = limit - overhang
        block = f" + {overhang} positions of the last speculative block (N={n_spec})" if overhang else ""
        _fail(f"input_ids row {b}",
              f"a prompt of {plen} tokens + max_new_tokens={max_new}{block} reaches position {last}, but the "
              f"target's max_position_embeddings is {limit} (positions 0..{limit - 1})",
              f"keep prompt + max_new_tokens <= {room}: shorten the prompt to {max(room - max_new, 0)} tokens "
              f"or lower max_new_tokens to {max(room - plen, 0)}")


def _stop_ids(stop_token_ids, vocab: int) -> list[int] | None:
    """An int, a sequence/set, a 1-D tensor or array of ints in `[0, vocab)` -> a list (None if empty)."""
    if stop_token_ids is None:
        return None
    if _is_int(stop_token_ids):
        stop_list = [stop_token_ids]
    elif isinstance(stop_token_ids, torch.Tensor) and stop_token_ids.dim() == 1:
        stop_list = list(stop_token_ids.detach().cpu().unbind(0))
    elif getattr(stop_token_ids, "ndim", None) == 1:  # a numpy array
        stop_list = list(stop_token_ids)
    elif isinstance(stop_token_ids, Sequence | set | frozenset) and not isinstance(stop_token_ids, (str, bytes)):
        stop_list = list(stop_token_ids)
    else:
        _fail("stop_token_ids", f"is {stop_token_ids!r}", "pass an int, a list of ints, or None")
    for i, s in enumerate(stop_list):
        if not _is_int(s):
            _fail(f"stop_token_ids[{i}]", f"{s!r} ({type(s).__name__}) is not an integer token id",
                  "pass the tokenizer's integer ids (e.g. tokenizer.eos_token_id)")
    stops = [operator.index(s) for s in stop_list]
    if not stops:
        return None
    _check_ids("stop_token_ids", torch.tensor(stops, dtype=torch.long), vocab,
               "use ids of the target's own tokenizer (e.g. tokenizer.eos_token_id)")
    return stops


def check_generate_inputs(
    target,
    draft,
    input_ids,
    *,
    max_new_tokens,
    num_speculative_tokens,
    temperature,
    top_p,
    top_k,
    seed,
    stop_token_ids,
    impl,
    timing,
    exact=False,
    exact_block_size=None,
    graphs=None,
    compile_level="auto",
    attention_impl="auto",
    linear_impl="auto",
    exact_impl="auto",
    verify="chain",
    tree_budget=None,
) -> GenerateInputs:
    """Check every argument of `speculative_generate` (same names) on the host.

    Raises:
        GenerateInputError (a `ValueError`): the first bad argument, with its value and the fix.
        DFlash2ConfigError: the draft does not fit the target (`TargetModel.check_compatible`).
    Returns:
        `GenerateInputs` (prompts as 1-D int64 CPU tensors, N resolved, stop ids as a list, the
        call's `EngineSettings`).
    """
    if not isinstance(target, TargetModel) and not (
            isinstance(target, torch.nn.Module) and hasattr(target, "get_output_embeddings")):
        _fail("target", f"is a {type(target).__name__}",
              "pass a TargetModel (TargetModel.from_pretrained(...)) or a transformers causal LM")
    tgt = as_target(target)
    max_new = _int_arg("max_new_tokens", max_new_tokens, 0)
    _real_arg("temperature", temperature, lambda t: t >= 0, "[0, inf)", " (0 = greedy)")
    _real_arg("top_p", top_p, lambda p: 0 < p <= 1, "(0, 1]", " (1.0 = off)")
    _int_arg("top_k", top_k, 0, hint=" (0 = off)")
    per_row_seeds = seed is not None and not _is_int(seed) and isinstance(seed, (list, tuple, torch.Tensor))
    # Seeds leave as plain ints (numpy ints and 0-d tensors included), the types row_seeds takes.
    if per_row_seeds:
        seed = [_int_arg(f"seed[{b}]", s, 0, 2**64 - 1, " (one seed per prompt row)")
                for b, s in enumerate(seed.tolist() if isinstance(seed, torch.Tensor) else seed)]
    elif seed is not None:
        seed = _int_arg("seed", seed, 0, 2**64 - 1, ", a list with one int per prompt row, or None (drawn from "
                        "torch's RNG)")
    if impl not in IMPLS:
        _fail("impl", f"is {impl!r}", f"use one of {IMPLS}")
    if not isinstance(timing, bool):
        _fail("timing", f"is {timing!r}", "pass True or False")
    if not isinstance(exact, bool):  # before the width, whose default depends on it (resolve_exact checks it too)
        _fail("exact", f"is {exact!r}", "pass True or False")
    # Exact mode pads every forward to one width, and only runs of the same width are bit-identical:
    # the AR reference (no draft) must be given the width of the speculative runs it is compared
    # with, so a run without a drafter's block_size has no default in exact mode.
    if exact_block_size is None:
        width = exact_width(getattr(draft, "block_size", None) if draft is not None else None)
        if exact and width is None:
            _fail("exact_block_size", "is not given and there is no draft whose block_size could set it",
                  "pass exact_block_size=W, the padded width of the speculative runs this one is compared "
                  "with (their draft's block_size); runs of different widths are not bit-identical")
        exact_block_size = width if width is not None else DEFAULT_EXACT_BLOCK_SIZE
    exact_block_size = _int_arg("exact_block_size", exact_block_size, 1, hint=" (the padded width of every "
                                "exact-mode target forward; use the speculative runs' block_size)")

    if draft is None or (num_speculative_tokens is not None and _is_int(num_speculative_tokens)
                         and operator.index(num_speculative_tokens) == 0):
        if draft is None and num_speculative_tokens not in (None, 0):
            _fail("num_speculative_tokens", f"is {num_speculative_tokens!r} but draft is None",
                  "pass a draft, or num_speculative_tokens=0 / None for the autoregressive baseline")
        n_spec, draft = 0, None
    else:
        _check_draft(draft, tgt)
        limit = int(draft.block_size) - 1
        n_spec = limit if num_speculative_tokens is None else _int_arg(
            "num_speculative_tokens", num_speculative_tokens, 0, limit,
            f": the draft was trained on blocks of {limit + 1} (anchor + {limit} mask slots), "
            "so 0..block_size-1 are valid")

    vocab = int(tgt.vocab_size)
    rows = _prompt_rows(input_ids)
    if per_row_seeds and len(seed) != len(rows):
        _fail("seed", f"has {len(seed)} entries for {len(rows)} prompt rows", "pass one seed per row, or one int")
    for b, r in enumerate(rows):
        _check_ids(f"input_ids row {b}", r, vocab, "tokenize with the target's own tokenizer, and pass rows of "
                   "different lengths as a list of 1-D prompts instead of padding them")
    if exact and n_spec + 1 > exact_block_size:
        _fail("exact_block_size", f"is {exact_block_size} but the verify block holds N + 1 = {n_spec + 1} tokens",
              f"use exact_block_size >= {n_spec + 1} (the draft's block_size)")
    limit = getattr(tgt.config, "max_position_embeddings", None)
    if limit is not None:
        _check_position_limit(rows, max_new, exact_block_size - 1 if exact else n_spec, int(limit))
    stops = _stop_ids(stop_token_ids, vocab)
    exact_kind = resolve_exact_impl(exact_impl, exact, tgt, exact_block_size, compile_level=compile_level)
    compile_level = resolve_compile(compile_level, tgt.device, exact, exact_kind)
    use_graphs = _graphs_arg(graphs, tgt, draft, exact and exact_kind == "rows")
    if attention_impl not in IMPLS:
        _fail("attention_impl", f"is {attention_impl!r}", f"use one of {IMPLS}")
    if not isinstance(verify, str) or verify not in VERIFY_POLICIES:
        _fail("verify", f"is {verify!r}", "use 'chain' (verify every drafted token, the default), 'adaptive' "
              "(per row, a verify length set by the row's earlier steps) or 'tree' (a token tree of "
              "tree_budget nodes)")
    if verify == "tree" and n_spec > 0:
        if tree_budget is None:
            _fail("tree_budget", "is None with verify='tree'",
                  "pass tree_budget=B, the nodes of each step's tree (root included), e.g. 2 * (N + 1)")
        tree_budget = _int_arg("tree_budget", tree_budget, 1, MAX_TREE_BUDGET,
                               " (nodes of each step's token tree, the root included)")
    elif tree_budget is not None and verify != "tree":
        _fail("tree_budget", f"is {tree_budget!r} but verify is {verify!r}", "pass tree_budget only with verify='tree'")
    else:
        tree_budget = 0
    linear = resolve_linear(linear_impl, tgt.device, exact)
    settings = EngineSettings(kernel_impl=resolve_impl(impl, tgt.device),
                              attention_impl=resolve_impl(attention_impl, tgt.device), linear_impl=linear,
                              exact=exact, exact_block_size=exact_block_size, exact_impl=exact_kind,
                              compile_level=compile_level, graphs=use_graphs,
                              verify="chain" if n_spec == 0 else verify, tree_budget=tree_budget)
    return GenerateInputs(tgt, draft, rows, n_spec, stops, seed, settings)
