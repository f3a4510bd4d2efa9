"""The evaluation runner: arms interleaved per prompt, one JSONL record per (arm, sample).

    per phase (turn 1, then MT-Bench turn 2): untimed warm-up calls (`warmup.Warmup`)
    for each chunk of samples (batch_size prompts; MT-Bench turn 2 after every turn 1):
        untimed warm-up of a new prompt class, then
        AR arm first, then the other arms in an order rotated per chunk
        each arm: speculative_generate(...) -> one record per sample, appended and flushed

Records are `dflash2.evaluation.analysis.records.Record`s, built here once per (arm, sample) with every
field known (their fields are documented there) and appended as they come; statistics
and reports are computed afterwards from the records alone (`stats.summarize`,
`report.write_report`). Each sample's seed is a hash of (seed, sample_id), so batching,
ordering and resuming never change a sample's draws. With `resume=true`, finished
(arm, sample) pairs are skipped; a run directory whose `run.json` holds another run identity
is refused. With several processes (`accelerate launch`, see `sharding.py`) each runs its
share of the items and appends to its own shard file; rank 0 merges them (`run.py`).

Per distinct output, one extra target forward gives the mean log-probability of the tokens;
for outputs that depart from the AR arm's, the AR sequence's forward gives the target's
top-1/top-2 logit margin at the first differing position (near-ties vs. bugs).

Each (arm, chunk) generated in this process is also timed end to end, tokenization to the
fsynced record, with the generation call, the scorers and those extra forwards apart
(`timing.ArmTiming`, `EvalRunner.timings`); `finish` puts it into summary.json's `end_to_end`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dflash2.engine.stats import tau_pooled
from dflash2.evaluation.running import datasets as ds
from dflash2.evaluation.arms import Arm, build_arms, draft_for_arm, enabled, kind_of, registered
from dflash2.evaluation.running.config import changed_keys, run_identity, to_container, validate
from dflash2.evaluation.analysis.run_sections import note_engine
from dflash2.evaluation.analysis.records import RECORDS, Record, append_records, as_records, exact_of_records
from dflash2.evaluation.running.sandbox import SandboxLimits, check_humaneval
from dflash2.evaluation.running.scoring import gsm8k_correct, humaneval_completion, load_judge
from dflash2.evaluation.running.sharding import SHARDS_DIR, Shard, existing_records, shard_file, shard_of
from dflash2.evaluation.running.timing import ArmTiming, summarize_end_to_end
from dflash2.evaluation.running.warmup import Warmup

log = logging.getLogger(__name__)

RUN_JSON, SUMMARY = "run.json", "summary.json"


def dataset_limit(data, name: str) -> int | None:
    """Items of dataset `name` to evaluate: its own `<name>_limit` when set, else `limit`."""
    own = getattr(data, f"{name}_limit", None)
    return own if own is not None else data.limit


def sample_seed(base: int, sample_id: str) -> int:
    """Per-sample seed in [0, 2^63): a hash of the base seed and the sample id only."""
    digest = hashlib.sha256(f"{int(base)}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prompt_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(list(map(int, ids))).encode()).hexdigest()[:16]


def draft_training_format_hash(draft_path: str | None) -> str | None:
    """The prompt-format hash a checkpoint was distilled with, if its config records one
    (`dflash2_training.format_hash`, or `dflash2_training.prompt_format.hash`)."""
    if not draft_path:
        return None
    try:
        cfg = json.loads((Path(draft_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    train = cfg.get("dflash2_training") or {}
    if not isinstance(train, dict):
        return None
    fmt = train.get("prompt_format")
    return train.get("format_hash") or (fmt.get("hash") if isinstance(fmt, dict) else None)


def _draft_fingerprint(draft_path: str | None) -> dict | None:
    if not draft_path:
        return None
    p = Path(draft_path)
    files = sorted(f for f in p.iterdir() if f.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes() if f.name.endswith(".json") else str(f.stat().st_size).encode())
    return {"draft_files_sha": h.hexdigest()[:16]}


def exact_width(arms, draft) -> int:
    """The one width of every target forward in an exact run, the same for every arm (AR, each
    N, selector-off, oracle), so their outputs are comparable bit for bit: the engine's rule
    (`dflash2.engine.inputs.exact_width`) over the drafter's `block_size` (when the run has a
    drafter) and the arms' N."""
    from dflash2.engine.inputs import exact_width as engine_exact_width

    return engine_exact_width(draft.block_size if draft is not None else None,
                              [a.num_speculative_tokens for a in arms])


def resolve_exact(cfg, target, width: int) -> tuple[bool, str | None]:
    """`(exact, exact_impl)` of a run: `cfg.exact` if true or false; null (auto) = on for a greedy
    run on a CUDA target whose exact mode resolves to the batch-invariant kernels (`exact_impl`
    auto or invariant, `compile_level` auto, light or null); `exact_impl` as the engine's resolver
    (`dflash2.engine.inputs.resolve_exact_impl`) resolves it for the run's `width` (None when
    exact mode is off). The run passes these values to every `speculative_generate` call and
    records them in every record; nothing re-resolves them."""
    from dflash2.engine.inputs import resolve_exact_impl

    impl = getattr(cfg, "exact_impl", "auto")
    level = getattr(cfg, "compile_level", "auto")
    if cfg.exact is None:
        cheap = (float(cfg.temperature) == 0.0 and target.device.type == "cuda" and level != "full"
                 and impl != "rows" and resolve_exact_impl("auto", False, target, width) == "invariant")
        return (True, "invariant") if cheap else (False, None)
    if not cfg.exact:
        return False, None
    return True, resolve_exact_impl(impl, True, target, width, compile_level=level)


class EvalRunner:
    """Runs one evaluation (one point of a Hydra grid).

    Args:
        cfg: an `EvalConfig` (OmegaConf node or dataclass).
        out_dir: the prepared output directory.
        shard: this process's `sharding.Shard` (rank, world size, device); None = one process
            on `cfg.hardware`'s device.

    Attributes:
        timings: arm label -> `timing.ArmTiming` of the chunks `run` generated in this process
            (records read back on resume are not in it); `end_to_end()` summarises it.
    """

    def __init__(self, cfg, out_dir: str | Path, shard=None):
        from dflash2.kernels.dispatch import resolve_impl
        from dflash2.runconfig import load_target, prompt_format, resolve_device, stop_token_ids

        validate(cfg)
        self.cfg, self.out = cfg, Path(out_dir)
        self.shard = shard if shard is not None else Shard()
        self.device = self.shard.device if self.shard.device is not None else resolve_device(cfg.hardware)
        self.target, self.tok = load_target(cfg.target, self.device)
        self.stops = stop_token_ids(self.tok)
        self.fmt = prompt_format(self.tok, enable_thinking=cfg.data.enable_thinking,
                                 system_prompt=cfg.data.system_prompt, few_shot=cfg.data.few_shot)
        self.impl = resolve_impl(getattr(cfg, "kernel_impl", "auto"), self.device)
        self.draft = self._load_draft()
        self.arms = build_arms(cfg.arms, has_draft=self.draft is not None,
                               draft_has_selector=bool(self.draft is not None and self.draft.selector_enabled))
        width = exact_width(self.arms, self.draft)
        self.exact, self.exact_impl = resolve_exact(cfg, self.target, width)
        self.exact_width = width if self.exact else None
        self.run_id, self.identity = run_identity(cfg, self.fmt.to_dict(), {
            **(_draft_fingerprint(cfg.draft_path) or {}), "exact": self.exact, "exact_impl": self.exact_impl})
        self.judge = load_judge(cfg.judge)
        self.limits = SandboxLimits(timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb,
                                    max_processes=cfg.sandbox.max_processes)
        self._exec_cache: dict[tuple[str, str], dict] = {}
        self._ar_top: dict[str, tuple[list, list]] = {}  # sample_id -> AR top-2 logits/ids per position
        self.timings = {a.label: ArmTiming() for a in self.arms}
        self.engine: dict[str, dict] = {}  # arm label -> the engine settings its calls resolved to
        self.warmup: Warmup | None = None  # the untimed calls `run` made first (`warmup.Warmup`)

    # ------------------------------------------------------------------ setup
    def _load_draft(self):
        from dflash2.modeling import DFlash2DraftModel
        from dflash2.runconfig import new_draft

        cfg = self.cfg
        if not enabled(cfg.arms, lambda k: k.uses_draft):
            return None
        if cfg.draft_path:
            path = Path(cfg.draft_path)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"draft_path={path} has no config.json; give a draft checkpoint directory")
            draft = DFlash2DraftModel.from_pretrained(path, dtype=self.target.dtype, device=self.device)
            trained = draft_training_format_hash(cfg.draft_path)
            if trained is not None and trained != self.fmt.hash:
                msg = (f"\n{'!' * 88}\nPROMPT FORMAT MISMATCH: draft {path} was distilled on prompt format {trained}, "
                       f"this run uses {self.fmt.hash} ({self.fmt.to_dict()}).\nAcceptance will be lower than "
                       f"the drafter can reach; match data.enable_thinking / data.system_prompt / the chat template.\n"
                       f"{'!' * 88}")
                log.warning(msg)
                print(msg, flush=True)
        else:
            log.warning("draft_path is null: using a fresh, untrained %s draft (smoke runs only)", cfg.draft.name)
            draft = new_draft(cfg.draft, self.target, self.tok, seed=cfg.draft_seed)
            draft = draft.to(device=self.device, dtype=self.target.dtype)
        self.target.check_compatible(draft.config)
        return draft.eval().requires_grad_(False)

    def _samples(self, all_ranks: bool = False) -> tuple[list[tuple[ds.EvalItem, int]],
                                                        list[tuple[ds.EvalItem, int]]]:
        """(first-turn samples, MT-Bench second-turn samples), each as (item, turn): this
        process's shard (item i of the item order goes to rank i % world; both turns of an item
        stay together), or every sample with `all_ranks`."""
        d = self.cfg.data
        first, second = [], []
        i = 0
        for name in d.datasets:
            for item in ds.load_items(name, source=d.source, limit=dataset_limit(d, name), shuffle=d.shuffle,
                                      seed=d.seed):
                mine = all_ranks or shard_of(i, self.shard.world) == self.shard.rank
                i += 1
                if not mine:
                    continue
                first.append((item, 1))
                if len(item.turns) > 1:
                    second.append((item, 2))
        return first, second

    def sample_order(self) -> list[str]:
        """Every sample id of the run (all ranks) in the runner's order: turn 1, then turn 2."""
        first, second = self._samples(all_ranks=True)
        return [it.sample_id(t) for it, t in first + second]

    def _prompt(self, item: ds.EvalItem, turn: int, ar_by_id: dict[str, Record]) -> list[int]:
        from dflash2.runconfig import encode_chat

        prev = []
        if turn > 1:
            # Every arm sees the AR arm's earlier answers: the turn-2 prompt is the same for all arms.
            prev = [ar_by_id[item.sample_id(t)].text for t in range(1, turn)]
        msgs = ds.messages_for(item, turn, prev, few_shot=self.cfg.data.few_shot, source=self.cfg.data.source)
        return encode_chat(self.tok, msgs, self.fmt)

    # ------------------------------------------------------------------ target forwards
    @torch.no_grad()
    def _target_rows(self, prompt: list[int], gen: list[int]) -> torch.Tensor:
        """fp32 target logits `[G+1, V]` predicting gen[0..G-1] and the token after gen."""
        ids = torch.tensor([prompt + gen], dtype=torch.long, device=self.device)
        out = self.target(ids, logits_to_keep=len(gen) + 1)
        return out.logits[0].float()

    def _logprob_mean(self, rows: torch.Tensor, gen: list[int]) -> float | None:
        if not gen:
            return None
        t = float(self.cfg.temperature) or 1.0
        lp = torch.log_softmax(rows[: len(gen)] / t, dim=-1)  # [G, V]
        return float(lp.gather(1, torch.tensor(gen, device=lp.device)[:, None]).mean())

    # ------------------------------------------------------------------ scoring
    def _score(self, item: ds.EvalItem, text: str) -> tuple[bool | None, dict]:
        if item.dataset == "gsm8k":
            return gsm8k_correct(text, item.reference), {}
        if item.dataset == "humaneval":
            completion = humaneval_completion(text, item.problem)
            key = (item.item_id, completion)
            if key not in self._exec_cache:
                self._exec_cache[key] = check_humaneval(item.problem, completion, self.limits)
            res = self._exec_cache[key]
            return bool(res["passed"]), {"exec_result": res["result"], "sandbox": res["isolation"]}
        return None, {}

    # ------------------------------------------------------------------ main loop
    def _check_identity(self, resume: bool) -> None:
        """Refuse (`UserError`, one line) to append to a directory whose `run.json` records another
        run identity, naming the changed keys and the fix; writes nothing."""
        from dflash2.entrypoint import UserError

        path = self.out / RUN_JSON
        if path.exists():
            old = json.loads(path.read_text())
            if old.get("run_id") != self.run_id:
                changed = changed_keys(old.get("identity", {}), self.identity)
                shown = "; ".join(f"{k}: {a} -> {b}" for k, a, b in changed[:4]) or "?"
                more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
                raise UserError(
                    f"output_dir={self.out} holds run {old.get('run_id')}, made with another config than this run "
                    f"{self.run_id} (changed: {shown}{more}); to continue it, rerun with its values and resume=true, "
                    "or choose a new output_dir for this config")
        elif resume and ((self.out / RECORDS).exists() or (self.out / SHARDS_DIR).is_dir()):
            raise UserError(f"output_dir={self.out} has records but no {RUN_JSON}, so their run identity cannot be "
                            "verified; choose a new output_dir")

    def _write_run_json(self) -> None:
        """Record the run identity, once the run's work has begun (after the first warm-up): a run that
        failed before leaves no `run.json`, so a corrected rerun may use the directory."""
        (self.out / RUN_JSON).write_text(json.dumps({"run_id": self.run_id, "experiment": self.cfg.experiment_name,
                                                     "prompt_format": self.fmt.to_dict(), "identity": self.identity},
                                                    indent=2, sort_keys=True, default=str))

    def _existing(self) -> list[Record]:
        """Records already written (resume), after the run identity is checked. One process:
        `records.jsonl` (plus shard files of an earlier sharded run), torn lines cut. Several:
        rank 0 checks the identity (every rank raises its refusal) and cuts torn lines before any
        rank reads, and no rank
        appends before every rank has read (a half-written line must never be read as torn)."""
        from dflash2.entrypoint import UserError

        sh = self.shard
        if sh.world == 1:
            self._check_identity(bool(self.cfg.resume))
            return existing_records(self.out, repair=True)
        refusal = None
        if sh.main:
            try:
                self._check_identity(bool(self.cfg.resume))
            except UserError as e:
                refusal = str(e)
        refusal = sh.broadcast(refusal)   # every rank refuses with rank 0, none waits for it
        if refusal is not None:
            raise UserError(refusal)
        if sh.main:
            existing_records(self.out, repair=True)
        sh.wait()
        records = existing_records(self.out, repair=False)
        sh.wait()
        return records

    def run(self) -> list[Record]:
        """Generate every missing (arm, sample) record of this process's shard. Returns the
        records read from disk plus those generated."""
        sh = self.shard
        records = self._existing()
        rec_path = self.out / RECORDS
        where = {}
        if sh.world > 1:  # each rank appends to its own file; rank 0 merges them at the end
            rec_path = shard_file(self.out, sh.rank)
            rec_path.parent.mkdir(exist_ok=True)
            where = {"rank": sh.rank, "world_size": sh.world}
        done = {(r.arm, r.sample_id) for r in records}
        ar_by_id = {r.sample_id: r for r in records if r.arm == self.arms[0].label}  # the baseline's
        first, second = self._samples()
        mine = {(a.label, it.sample_id(t)) for it, t in first + second for a in self.arms}
        total = len(mine)
        warm = self.warmup = Warmup(self._generate_untimed, self.arms, int(self.cfg.max_new_tokens),
                                    n_stops=len(self.stops or ()), vocab=self.target.vocab_size, clock=self._clock)
        desc = "samples x arms" if sh.world == 1 else f"samples x arms (rank {sh.rank} of {sh.world})"
        bar = tqdm(total=total, initial=len(done & mine), desc=desc, unit="gen", disable=not sh.main)
        for p, phase in enumerate((first, second)):
            bs = int(self.cfg.batch_size)
            pending = [(it, t) for it, t in phase if any((a.label, it.sample_id(t)) not in done for a in self.arms)]
            warm.phase(bs, [self._prompt(it, t, ar_by_id) for it, t in pending])
            if p == 0 and sh.main:
                self._write_run_json()
            for c, start in enumerate(range(0, len(phase), bs)):
                chunk = phase[start: start + bs]
                todo = [(it, t) for it, t in chunk if any((a.label, it.sample_id(t)) not in done for a in self.arms)]
                warm.chunk([self._prompt(it, t, ar_by_id) for it, t in todo], self.stops)
                others = self.arms[1:]
                k = c % len(others) if others else 0
                for arm in [self.arms[0]] + others[k:] + others[:k]:
                    todo = [(it, t) for it, t in chunk if (arm.label, it.sample_id(t)) not in done]
                    if not todo:
                        continue
                    timing = self.timings[arm.label]
                    t0 = self._clock()  # end to end: from before the prompts are built ...
                    # the batch key is the same for every arm of this chunk
                    recs = self._run_arm(arm, todo, ar_by_id, timing, batch=f"{p}/{c}", **where)
                    for rec in recs:
                        append_records(rec_path, [rec])  # fsynced: a kill tears at most this line
                        records.append(rec)
                        done.add((rec.arm, rec.sample_id))
                        if arm.spec.baseline:
                            ar_by_id[rec.sample_id] = rec
                        bar.update(1)
                    timing.add_chunk(self._clock() - t0, recs)  # ... to after its last record is fsynced
        bar.close()
        return records

    def end_to_end(self) -> dict:
        """summary.json's `end_to_end` for this process (`timing.summarize_end_to_end`)."""
        baseline = next((a.label for a in self.arms if a.spec.baseline), None)
        return summarize_end_to_end(self.timings, rank=self.shard.rank, world_size=self.shard.world,
                                    baseline=baseline, warmup=None if self.warmup is None else self.warmup.summary())

    def _generate_untimed(self, arm: Arm, prompts: list[list[int]], max_new_tokens: int,
                          stops: list[int] | None) -> None:
        """One warm-up call of `arm` (`warmup.Warmup`): the run's engine settings, no record."""
        from dflash2.engine import speculative_generate

        d = draft_for_arm(arm, draft=self.draft, target=self.target, impl=self.impl)
        speculative_generate(self.target, d, prompts, max_new_tokens=max_new_tokens,
                             num_speculative_tokens=arm.num_speculative_tokens, temperature=self.cfg.temperature,
                             top_p=self.cfg.top_p, top_k=self.cfg.top_k, seed=0, stop_token_ids=stops,
                             **self._engine_kwargs(arm))

    def _engine_kwargs(self, arm: Arm) -> dict:
        """The `speculative_generate` settings every call of `arm` runs with (timed or warm-up)."""
        cfg = self.cfg
        kw = ({"exact": True, "exact_block_size": self.exact_width, "exact_impl": self.exact_impl}
              if self.exact else {})
        if self.target.device.type == "cuda":  # the CPU runs the stock modules ("auto" resolves so there)
            kw["compile_level"] = getattr(cfg, "compile_level", "auto")
        attention = getattr(cfg, "attention_impl", "auto")
        if attention != "auto":
            kw["attention_impl"] = attention
        if not self.exact:  # exact mode picks its own linear kernel
            kw["linear_impl"] = getattr(cfg, "linear_impl", "auto")
        if getattr(cfg, "graphs", None) is not None:
            kw["graphs"] = bool(cfg.graphs)
        kw["impl"] = self.impl
        kw.update(arm.verify_kwargs)  # its kind's verify policy (and tree budget); {} for the chain
        return kw

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _run_arm(self, arm: Arm, todo: list[tuple[ds.EvalItem, int]], ar_by_id: dict[str, Record],
                 timing: ArmTiming | None = None, **fields) -> list[Record]:
        """One generation call of `arm` over `todo` (one chunk); returns one record per row, with
        `fields` (the chunk's `batch`, a shard's `rank` and `world_size`) set on each.
        With `timing`, adds the call's wall, the scorers' and the extra target forwards' seconds
        to it (the caller adds the end-to-end time and the counts)."""
        from dflash2.engine import speculative_generate

        cfg = self.cfg
        sids = [it.sample_id(t) for it, t in todo]
        prompts = [self._prompt(it, t, ar_by_id) for it, t in todo]
        seeds = [sample_seed(cfg.seed, s) for s in sids]
        refs = None
        if arm.spec.needs_references:
            refs = [p + ar_by_id[s].tokens for p, s in zip(prompts, sids)]
        draft = draft_for_arm(arm, draft=self.draft, target=self.target, impl=self.impl, references=refs,
                              seeds=seeds, arms_cfg=cfg.arms)
        kw = self._engine_kwargs(arm)
        t0 = self._clock()
        try:
            out = speculative_generate(
                self.target, draft, prompts, max_new_tokens=cfg.max_new_tokens,
                num_speculative_tokens=arm.num_speculative_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                top_k=cfg.top_k, seed=seeds, stop_token_ids=self.stops, **kw)
        except TypeError as e:
            if self.exact and "exact" in str(e):
                raise RuntimeError("exact=true but this engine has no exact mode; set exact=false") from e
            raise
        wall = self._clock() - t0
        note_engine(self.engine, arm.label, out.settings, out.times.graph_error)
        score_s = analysis_s = 0.0
        recs = []
        for b, ((item, turn), sid) in enumerate(zip(todo, sids)):
            gen = out.generated[b].tolist()
            text = self.tok.decode(gen, skip_special_tokens=True)
            t_score = time.perf_counter()
            correct, extra = self._score(item, text)
            score_s += time.perf_counter() - t_score
            t_compare = self._clock()
            compared = self._compare(arm.spec.baseline, sid, gen, prompts[b], ar_by_id.get(sid))
            analysis_s += self._clock() - t_compare
            if self.judge is not None and item.dataset == "mt_bench":
                t_score = time.perf_counter()
                answers = [ar_by_id[item.sample_id(t)].text for t in range(1, turn)] + [text]
                extra["judge_score"] = float(self.judge(item.raw, answers))
                score_s += time.perf_counter() - t_score
            recs.append(Record(
                run_id=self.run_id, arm=arm.label, arm_kind=arm.kind, num_speculative_tokens=arm.num_speculative_tokens,
                temperature=float(cfg.temperature), dataset=item.dataset, sample_id=sid, category=item.category,
                seed=seeds[b], prompt_hash=prompt_hash(prompts[b]), prompt_tokens=len(prompts[b]), tokens=gen,
                text=text, wall_s=wall / len(todo), batch_size=len(todo), steps=len(out.accepted[b]),
                accepted=list(map(int, out.accepted[b])), finish_reason=out.finish_reasons[b], correct=correct,
                target=cfg.target.name, draft_path=cfg.draft_path,
                num_draft_layers=(int(self.draft.config.num_hidden_layers)
                                  if self.draft is not None and arm.spec.uses_draft else None),
                exact_block_size=self.exact_width, exact_impl=self.exact_impl, verify_policy=arm.verify,
                tree_budget=arm.tree_budget, verify_lengths=list(map(int, out.verify_lengths[b])),
                verify_rows=arm.verify_rows(out.verify_lengths[b]), **compared, **extra, **fields))
        if timing is not None:
            timing.add_call(wall, out.times)
            timing.score_s += score_s
            timing.analysis_s += analysis_s
        return recs

    def _compare(self, baseline: bool, sample_id: str, gen: list[int], prompt: list[int], ar: Record | None) -> dict:
        """A record's `logprob_mean`, `identical_to_ar` and `departure` (None where not computed):
        the generation `gen` of sample `sample_id` after `prompt`, against the AR arm's record `ar`
        (the baseline arm's own rows cached for the departures of the other arms)."""
        out = {"logprob_mean": None, "identical_to_ar": None, "departure": None}
        need_lp = self.cfg.compute_logprob
        if baseline:
            rows = self._target_rows(prompt, gen) if (need_lp or self.cfg.compute_departure) else None
            if rows is not None:
                top = torch.topk(rows, 2, dim=-1)  # [G+1, 2] for departures of the other arms
                self._ar_top[sample_id] = (top.values.tolist(), top.indices.tolist())
            out["logprob_mean"] = self._logprob_mean(rows, gen) if need_lp else None
            return out
        if ar is None:
            return out
        ar_gen = ar.tokens
        out["identical_to_ar"] = gen == ar_gen
        if out["identical_to_ar"]:
            out["logprob_mean"] = ar.logprob_mean if need_lp else None
            return out
        if need_lp:
            out["logprob_mean"] = self._logprob_mean(self._target_rows(prompt, gen), gen)
        if self.cfg.compute_departure:
            i = next((j for j, (a, b) in enumerate(zip(gen, ar_gen)) if a != b), min(len(gen), len(ar_gen)))
            cached = self._ar_top.get(sample_id)
            if cached is None:  # resumed run: the AR record came from disk
                top = torch.topk(self._target_rows(prompt, ar_gen), 2, dim=-1)
                cached = (top.values.tolist(), top.indices.tolist())
                self._ar_top[sample_id] = cached
            vals, ids = cached
            out["departure"] = {"position": int(i), "margin": float(vals[i][0] - vals[i][1]),
                                "top1": int(ids[i][0]), "top2": int(ids[i][1])}
        return out


def run_checks(records: list[Record | dict], checks, exact: bool = False) -> dict:
    """Post-run assertions (see `ChecksSpec`); returns their values and pass flags.

    The checks are T = 0 properties (sampled outputs legitimately leave the AR path), so at
    T > 0 their values are recorded and the checks are marked skipped."""
    records = as_records(records)
    out: dict = {}
    greedy = all(float(r.temperature) == 0.0 for r in records)
    by_arm: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_arm[r.arm].append(r)

    def mean_accepted(check: str) -> dict[str, float]:  # mean accepted drafts per step, per arm under `check`
        kinds = {k.name for k in registered() if k.accept_check == check}
        return {a: tau_pooled([r.accepted for r in rs]) - 1.0 for a, rs in by_arm.items()
                if rs[0].arm_kind in kinds}

    def at_least(values: dict[str, float], threshold: float) -> dict:
        # an arm drafting N <= threshold tokens could pass only by accepting every draft, so it is
        # listed as not checked rather than failed; a run with no arm left to check fails
        n_of = {a: int(by_arm[a][0].num_speculative_tokens or 0) for a in values}
        checked = {a: v for a, v in values.items() if n_of[a] > threshold}
        ok = bool(checked) and all(v >= threshold for v in checked.values())
        return {"threshold": threshold, "passed": ok if greedy else None, "skipped": None if greedy else "T > 0",
                "not_checked": sorted(a for a in values if a not in checked)}

    oracle = mean_accepted("oracle")
    if oracle:
        out["oracle_mean_accepted_per_step"] = oracle
    if checks.oracle_min_accepted is not None:
        out["oracle_min_accepted"] = {**at_least(oracle, checks.oracle_min_accepted), "measured": oracle}
    drafted = mean_accepted("draft")
    if drafted:
        out["draft_mean_accepted_per_step"] = drafted
    if getattr(checks, "draft_min_accepted", None) is not None:
        out["draft_min_accepted"] = {**at_least(drafted, checks.draft_min_accepted), "measured": drafted}
    spec = [r for r in records if not kind_of(r.arm_kind).baseline]
    differing = sorted({f"{r.arm}:{r.sample_id}" for r in spec if r.identical_to_ar is False})
    out["identical_to_ar"] = {"records": len(spec), "differing": differing[:50], "n_differing": len(differing)}
    if checks.require_identical or exact:
        ok = not differing and all(r.identical_to_ar for r in spec)
        out["identical_to_ar"].update(passed=ok if greedy else None, skipped=None if greedy else "T > 0")
    return out


def finish(cfg, out_dir: Path, records: list[Record | dict], runner: EvalRunner | None = None) -> dict:
    """Summary, report, terminal table, W&B; then fail loudly if a check failed."""
    from dflash2.evaluation.analysis import report, stats

    records = as_records(records)
    summary = stats.summarize(records, n_resamples=cfg.stats.n_resamples, seed=cfg.stats.seed,
                              accuracy_margin=cfg.stats.accuracy_margin)
    exact = exact_of_records(records)  # as the runner resolved and recorded it (`exact: null` per run)
    summary["checks"] = run_checks(records, cfg.checks, exact=exact["exact"])
    summary.update(exact)
    if runner is not None:
        summary["run_id"], summary["prompt_format"] = runner.run_id, runner.fmt.to_dict()
        summary["end_to_end"] = runner.end_to_end()  # this process's timed chunks (rank 0's when sharded)
        summary["engine"] = runner.engine  # per arm, the settings its calls resolved to
    from dflash2.evaluation.analysis.cost import add_to_summary

    predictions = add_to_summary(summary, records)  # summary["cost_model"] (in-sample) + a note
    (out_dir / SUMMARY).write_text(json.dumps(stats.to_jsonable(summary), indent=2, default=str))  # NaN as null
    config = to_container(cfg)
    report.write_report(out_dir, records, summary, config=config, predictions=predictions)
    report.print_summary(summary)
    try:
        from dflash2.evaluation.analysis import wandb_log
    except ImportError:
        log.warning("dflash2.evaluation.analysis.wandb_log is not available; skipping W&B")
    else:
        wandb_dir = wandb_log.log_run(summary, records, cfg.logger, config, out_dir, predictions=predictions)
        if wandb_dir:
            log.info("W&B run directory: %s", wandb_dir)
    failure = failed_checks_line(summary["checks"])
    if failure:
        from dflash2.entrypoint import CheckFailed

        raise CheckFailed(f"evaluation checks failed: {failure}; records, summary.json and the report are in "
                          f"{out_dir}")
    return summary


def failed_checks_line(checks: dict) -> str | None:
    """The failed checks of `run_checks`'s result on one line (each with its threshold and what
    was measured), or None when none failed."""
    parts = []
    for key, value in checks.items():
        if not isinstance(value, dict) or value.get("passed") is not False:
            continue
        if key == "identical_to_ar":
            shown = ", ".join(value["differing"][:3]) + (" ..." if value["n_differing"] > 3 else "")
            parts.append(f"identical_to_ar: {value['n_differing']} of {value['records']} speculative records "
                         f"differ from the AR arm ({shown})" if value["n_differing"] else
                         "identical_to_ar: a speculative record has no AR record to compare with")
        elif "threshold" in value:
            checked = {a: v for a, v in value["measured"].items() if a not in value["not_checked"]}
            got = ", ".join(f"{a} {v:.2f}" for a, v in checked.items()) if checked else \
                f"no arm drafts more than {value['threshold']:g} tokens"
            parts.append(f"{key}: mean accepted drafts per step must be >= {value['threshold']:g}; measured {got}")
        else:
            parts.append(f"{key}: {json.dumps(value)}")
    return "; ".join(parts) or None
