"""Arms of an evaluation run, as plug-ins: what `speculative_generate` gets as its `draft` for each.

Every module of this package declares one kind of arm, an `ArmKind`, with `register(...)`; the
package imports them all (in file-name order; the registry orders them by `ArmKind.order`). The
evaluation never names a kind: the runner (`build_arms`, `draft_for_arm`, which arms need the
drafter, the AR tokens or a warm-up), the records (`Record.arm_kind` is one of `kind_names()`),
the statistics (the order of arms, the baseline every arm is paired with), the post-run checks
(`ArmKind.accept_check`), the cost model and the cross-run comparison (`ArmKind.compare_suffix`)
read what the kind declares. A new arm is one module here plus its switch in `ArmsSpec`
(`dflash2/evaluation/running/config.py`, the `flag` it declares) and, where a preset turns it on,
`configs/eval/`. The kinds today:

    ar                 draft=None (the AR baseline through the same engine loop)
    dflash2@N=n        the checkpoint itself (selector walk for DFlash2, argmax for v1); kind "spec"
    selector_off@N=n   the same checkpoint, per-slot argmax instead of the selector walk
                       (the engine's v1 path on a v2 model): isolates the selector's effect
    adaptive@N=n       the checkpoint with `verify="adaptive"`: each row's verify length in 1..N
                       set by its own earlier steps (`dflash2.engine.verify`)
    tree<B>@N=n        the checkpoint with `verify="tree", tree_budget=B`: one arm per budget B
                       (`arms.tree_budgets`, default 16, 32, 64), e.g. `tree32@N=15`
    oracle@N=n         `OracleProposer` over the AR arm's tokens (controlled acceptance)

Label grammar: `f"{family}@N={n}"`, or `f"{family}{B}@N={n}"` for a kind with tree budgets; the
baseline is `family` alone. `records.arm_family` strips the `@N=n` ("tree32@N=15" -> "tree32"),
so each budget is its own family in the plots over N; the plot over verify rows groups by kind.

Verify policy (`ArmKind.verify`): what the runner passes to `speculative_generate` as `verify=`
(and, for "tree", `tree_budget=` from the `Arm`); `Arm.verify_kwargs` is that argument set, empty
for "chain" (the engine's default), so chain arms call the engine exactly as before. The rows a
step's target forwards score (`forward_rows`) and the rows a ragged verify of the step's own
length would score (`verify_rows`) are this package's rules, read by the records and the cost
model: chain N + 1 and N + 1; adaptive N + 1 (today's forward keeps the block) and L + 1; tree
B and B (in exact mode the tree's accepted path is confirmed by a second, chain forward, and
`exact_impl="rows"` pads every chain forward to `exact_block_size`: `forward_rows` counts both).

Public: `ArmKind`, `Arm`, `DraftContext`, `register`, `registered`, `kind_of`, `kind_names`,
`baseline`, `drafter_kinds`, `primary_kind`, `build_arms`, `draft_for_arm`, `SelectorOffProposer`,
`VERIFY_POLICIES`, `MAX_TREE_BUDGET`, `forward_rows`, `verify_rows`, `configured_ns`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DraftContext:
    """What an arm's `make_draft` may use: the loaded drafter (None without one), the target, the
    resolved kernel implementation, the run's `ArmsSpec`, and, for kinds that declare
    `needs_references`, per row the prompt + the AR arm's tokens and the sample's seed."""

    draft: Any
    target: Any
    impl: str
    arms_cfg: Any = None
    references: Sequence[Sequence[int]] | None = None
    seeds: Sequence[int] | None = None


def configured_ns(arms_cfg, own: list[int] | None = None) -> list[int]:
    """A kind's N values, sorted and unique: its own list (e.g. `arms.tree_num_speculative_tokens`),
    or `arms.num_speculative_tokens` when that is null or absent."""
    return sorted(set(int(n) for n in (own or arms_cfg.num_speculative_tokens)))


# The engine's verify policies and tree-budget cap (`dflash2.engine.verify.VERIFY_POLICIES`,
# `dflash2.engine.inputs.MAX_TREE_BUDGET`), restated so that the records layer stays free of
# torch; tests/evaluation/test_verify_policies.py checks they agree.
VERIFY_POLICIES = ("chain", "adaptive", "tree")
MAX_TREE_BUDGET = 64


def forward_rows(policy: str, n: int, tree_budget: int | None = None, *, exact_impl: str | None = None,
                 exact_block_size: int | None = None) -> int:
    """Rows one step's target forwards score, as the engine runs them (`dflash2.engine.state`).

    The chain block is N + 1 rows for "chain" and "adaptive" (the block keeps its N + 1 slots
    whatever the step's length; AR: 1), padded to `exact_block_size` in exact mode with
    `exact_impl="rows"` (AR included). "tree" scores its `tree_budget` nodes (root included), and
    in exact mode (`exact_impl` set) also the chain block that confirms the accepted path: a
    second forward, counted here as its rows.
    """
    if policy not in VERIFY_POLICIES:
        raise ValueError(f"verify policy {policy!r} is not one of {VERIFY_POLICIES}")
    if exact_impl == "rows" and exact_block_size is None:
        raise ValueError("exact_impl 'rows' pads every forward to exact_block_size: pass it")
    block = int(exact_block_size) if exact_impl == "rows" else int(n) + 1
    if n == 0 or policy != "tree":
        return block
    if tree_budget is None:
        raise ValueError("verify policy 'tree' needs its tree_budget")
    return int(tree_budget) + (block if exact_impl is not None else 0)


def verify_rows(policy: str, lengths: Sequence[int], tree_budget: int | None = None) -> list[int]:
    """Per step, the rows a verify of the step's own length scores, from the engine's per-step
    verify lengths (`SpeculativeOutput.verify_lengths[b]`): `L + 1` for "chain" and "adaptive"
    (for adaptive the ragged count: today's forward still scores N + 1, `forward_rows`),
    `tree_budget` for "tree" (its lengths are N; 1 at N = 0)."""
    if policy not in VERIFY_POLICIES:
        raise ValueError(f"verify policy {policy!r} is not one of {VERIFY_POLICIES}")
    if policy == "tree":
        return [int(tree_budget) if int(n) > 0 else 1 for n in lengths]
    return [int(n) + 1 for n in lengths]


@dataclass(frozen=True)
class ArmKind:
    """One kind of arm: everything the evaluation needs to know of it.

    Attributes:
        name: the records' `arm_kind` ("ar", "spec", "selector_off", "oracle").
        family: the label prefix: arms are labelled `f"{family}@N={n}"`, the baseline `family`
            alone; `records.arm_family` maps a label back to it.
        flag: the `ArmsSpec` switch (`arms.<flag>`) that turns it on.
        order: its place among the arms in summaries, tables and plots (ascending).
        make_draft: `(arm, DraftContext) -> draft` for `speculative_generate` (None = AR).
        baseline: the AR reference: exactly one kind; always run, first, at N = 0; every other
            arm is paired with it (speedup, identity, paired tests, the cost model's N = 0 cost).
        uses_draft: runs the drafter checkpoint (the runner loads one; its records carry
            `num_draft_layers`); skipped when the run has no drafter.
        requires_selector: skipped for drafters without a selector (v1 checkpoints).
        needs_references: `make_draft` reads the AR arm's tokens of each row (`DraftContext`);
            such arms run after the AR arm of a chunk and get no warm-up.
        accept_check: the `ChecksSpec` threshold on its mean accepted drafts per step:
            "oracle" (`oracle_min_accepted`), "draft" (`draft_min_accepted`) or None.
        compare_suffix: in a cross-run comparison (`compare.py`), None = left out; "" = the
            drafter's own arm (the primary kind: sweeps, ratios between runs, solid lines);
            else the text appended to the drafter's name for this ablation of the same weights
            (ratios against the primary arm, dashed lines).
        num_speculative_tokens: `ArmsSpec -> N values` (sorted, unique); default
            `arms.num_speculative_tokens`.
        verify: the engine's verify policy its arms run (`VERIFY_POLICIES`; `speculative_generate`'s
            `verify=`): "chain" (default), "adaptive" or "tree".
        tree_budgets: "tree" kinds only: `ArmsSpec -> budgets` (sorted, unique, each in
            2..`MAX_TREE_BUDGET`); one arm per (N, budget), labelled `f"{family}{B}@N={n}"`.
    """

    name: str
    family: str
    flag: str
    order: int
    make_draft: Callable[[Arm, DraftContext], Any]
    baseline: bool = False
    uses_draft: bool = False
    requires_selector: bool = False
    needs_references: bool = False
    accept_check: str | None = None
    compare_suffix: str | None = None
    num_speculative_tokens: Callable[[Any], list[int]] = configured_ns
    verify: str = "chain"
    tree_budgets: Callable[[Any], list[int]] | None = None

    def __post_init__(self):
        if self.accept_check not in (None, "oracle", "draft"):
            raise ValueError(f"arm kind {self.name!r}: accept_check must be None, 'oracle' or 'draft'")
        if self.verify not in VERIFY_POLICIES:
            raise ValueError(f"arm kind {self.name!r}: verify must be one of {VERIFY_POLICIES}")
        if (self.verify == "tree") != (self.tree_budgets is not None):
            raise ValueError(f"arm kind {self.name!r}: tree_budgets goes with verify='tree', and only with it")
        if self.baseline and self.verify != "chain":
            raise ValueError(f"arm kind {self.name!r}: the baseline runs AR (N = 0), whose policy is 'chain'")


@dataclass(frozen=True)
class Arm:
    """`label` is unique ("ar", "dflash2@N=7", "tree32@N=15", ...); `kind` is a registered
    `ArmKind.name`; `tree_budget` is set exactly for the arms of a "tree" kind."""

    label: str
    kind: str
    num_speculative_tokens: int
    tree_budget: int | None = None

    @property
    def spec(self) -> ArmKind:
        """Its registered `ArmKind`."""
        return kind_of(self.kind)

    @property
    def verify(self) -> str:
        """Its verify policy (its kind's `verify`; "chain" for the AR arm)."""
        return self.spec.verify

    @property
    def verify_kwargs(self) -> dict[str, Any]:
        """What `speculative_generate` gets for its policy: {} for "chain" (the engine's default),
        {"verify": "adaptive"}, or {"verify": "tree", "tree_budget": B}."""
        if self.verify == "chain":
            return {}
        if self.verify == "tree":
            return {"verify": "tree", "tree_budget": self.tree_budget}
        return {"verify": self.verify}

    def verify_rows(self, lengths: Sequence[int]) -> list[int]:
        """Per step, the rows a verify of the step's own length scores (module `verify_rows`)."""
        return verify_rows(self.verify, lengths, self.tree_budget)


_REGISTRY: dict[str, ArmKind] = {}


def register(kind: ArmKind) -> ArmKind:
    """Add `kind` to the registry (each module of this package calls it once). Refuses a second
    kind of the same name, family or flag, and a second baseline."""
    for other in _REGISTRY.values():
        same = [a for a in ("name", "family", "flag") if getattr(other, a) == getattr(kind, a)]
        if same or (kind.baseline and other.baseline):
            raise ValueError(f"arm kind {kind.name!r} clashes with {other.name!r} ({', '.join(same) or 'baseline'})")
    _REGISTRY[kind.name] = kind
    return kind


def registered() -> tuple[ArmKind, ...]:
    """Every registered kind, by `order`."""
    return tuple(sorted(_REGISTRY.values(), key=lambda k: (k.order, k.name)))


def kind_names() -> tuple[str, ...]:
    """The valid `arm_kind`s of a record, by `order`."""
    return tuple(k.name for k in registered())


def kind_of(name: str) -> ArmKind:
    """The registered kind `name`; ValueError naming the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown arm kind {name!r}; registered: {kind_names()}") from None


def baseline() -> ArmKind:
    """The one baseline kind (the AR arm)."""
    return next(k for k in registered() if k.baseline)


def drafter_kinds() -> tuple[str, ...]:
    """The kinds that run the drafter checkpoint, by `order`."""
    return tuple(k.name for k in registered() if k.uses_draft)


def primary_kind() -> str:
    """The drafter's own arm in a cross-run comparison (`compare_suffix == ""`)."""
    return next(k.name for k in registered() if k.compare_suffix == "")


def enabled(arms_cfg, predicate: Callable[[ArmKind], bool] = lambda k: True) -> list[ArmKind]:
    """The non-baseline kinds switched on in `arms_cfg` (by their `flag`) that satisfy `predicate`."""
    return [k for k in registered() if not k.baseline and bool(getattr(arms_cfg, k.flag)) and predicate(k)]


def build_arms(arms_cfg, *, has_draft: bool, draft_has_selector: bool) -> list[Arm]:
    """The run's arms, the baseline (AR) first (the others are compared to it and may read it),
    then each enabled kind in `order` at each of its N.

    Args:
        arms_cfg: `ArmsSpec`.
        has_draft: a draft is available (kinds that `uses_draft` need one).
        draft_has_selector: False for v1 checkpoints (kinds that `requires_selector` are skipped).
    Returns:
        list of `Arm`, labels unique (a tree kind: one per N and budget, budgets ascending).
    """
    base = baseline()
    arms = [Arm(base.family, base.name, 0)]
    for k in enabled(arms_cfg):
        if (k.uses_draft and not has_draft) or (k.requires_selector and not draft_has_selector):
            continue
        ns = k.num_speculative_tokens(arms_cfg)
        if k.tree_budgets is None:
            arms += [Arm(f"{k.family}@N={n}", k.name, n) for n in ns]
        else:
            arms += [Arm(f"{k.family}{b}@N={n}", k.name, n, b) for n in ns for b in k.tree_budgets(arms_cfg)]
    return arms


def draft_for_arm(arm: Arm, *, draft, target, impl: str, arms_cfg=None,
                  references: Sequence[Sequence[int]] | None = None, seeds: Sequence[int] | None = None):
    """The `draft` argument of `speculative_generate` for `arm` (its kind's `make_draft`).

    Args:
        draft, target, impl: the loaded drafter (or None), the target, the resolved kernels.
        arms_cfg: the run's `ArmsSpec` (kind options such as `oracle_accept_prob`).
        references, seeds: kinds that `needs_references` only: per row, prompt + AR tokens and the
            sample seed.
    """
    return arm.spec.make_draft(arm, DraftContext(draft, target, impl, arms_cfg, references, seeds))


def _discover(names: Iterable[str]) -> None:
    for name in names:
        importlib.import_module(f"{__name__}.{name}")


# Modules of this folder that are not kinds: the oracle's proposers (torch), loaded by its kind on use.
_NOT_KINDS = frozenset({"oracle_proposers"})
_discover(sorted(m.name for m in pkgutil.iter_modules(__path__)
                 if not m.name.startswith("_") and m.name not in _NOT_KINDS))

from dflash2.evaluation.arms.selector_off import SelectorOffProposer  # noqa: E402  (re-exported)

__all__ = ["MAX_TREE_BUDGET", "VERIFY_POLICIES", "Arm", "ArmKind", "DraftContext", "SelectorOffProposer", "baseline",
           "build_arms", "draft_for_arm", "drafter_kinds", "enabled", "forward_rows", "kind_names", "kind_of",
           "primary_kind", "register", "registered", "verify_rows"]
