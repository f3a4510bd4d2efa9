"""The whole ablation in one command: regenerate -> train -> evaluate -> time -> compare.

    python -m dflash2.ablation --plan qwen05b ROOT                      # configs/ablation/qwen05b.yaml
    python -m dflash2.ablation --plan qwen05b ROOT target.path=/tmp/q.gguf   # overrides for every phase
    python -m dflash2.ablation --plan tiny_cpu ROOT                     # the same at toy scale (CPU, tests)
    python -m dflash2.ablation --plan qwen05b ROOT --phases eval,compare   # some phases only
    python -m dflash2.ablation --plan qwen15b ROOT --gpus 4             # jobs placed on 4 GPUs

Each phase runs the product's own entry points (`train/regenerate.py`, `train/distill.py` with
`arms=[...]`, `eval/run.py`, `eval/report.py --compare`) as subprocesses, with the plan's
overrides; every job logs to `ROOT/logs/<job>.log`. Layout under ROOT: `regen/`, `train/<arm>/`,
`eval/<arm>_T<T>/`, `sweep/<arm>/`, `speed/<name>/`, `compare/`.

Resumable: `ROOT/ablation.json` records each finished phase (and job) with its wall seconds; a
rerun of the same command skips what finished and passes `resume=true` to a job whose directory
exists. The evaluation jobs (every (arm, T) and the N sweep) run `plan.parallel` at a time; the
timing runs (`speed`) run alone, one after another, so their wall clock is not shared. The end
prints a table of wall minutes per phase (also in `ROOT/ablation.json`). A job that fails stops
the phase with one line naming its log; nothing after it runs.

GPUs (`plan.gpus`, or `--gpus G`): with G = 1 (the default) every job inherits the launcher's
environment and the phases run as described above. With G >= 2 each job is pinned to one GPU
through `CUDA_VISIBLE_DEVICES` (`dflash2.placement`): the regeneration on GPU 0; the arms trained
in `min(K, G)` processes, `train/distill.py arms=[<group>]` each on its own GPU (jobs
`train_<arm>` or `train_<a>+<b>`), writing the same `ROOT/train/<arm>/` as the one process of
G = 1 and resumed per group; each evaluation on the least-loaded GPU, at most `parallel` per GPU;
each timing run alone on its GPU (runs on different GPUs overlap); compare without a GPU. Each
job's GPU and device string are recorded in `ROOT/ablation.json` (`jobs.<name>.gpu`,
`cuda_visible_devices`) when it starts, and in its log above the command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash2.placement import GpuPool, arm_groups, visible_devices

REPO = Path(__file__).resolve().parent.parent
PHASES = ("regen", "train", "eval", "speed", "compare")


@dataclass
class SpeedRun:
    """One timing run: `eval/run.py` with the eval overrides plus `overrides`, on `arm`'s checkpoint."""

    name: str = "b1"
    arm: str = "dflash2"
    overrides: list[str] = field(default_factory=list)


@dataclass
class AblationPlan:
    """An ablation as data (`configs/ablation/<name>.yaml`). Override lists are Hydra overrides of
    the entry point each phase runs; `common` goes to every one of them."""

    name: str = "custom"
    common: list[str] = field(default_factory=list)
    regenerate: list[str] = field(default_factory=list)
    train: list[str] = field(default_factory=list)
    arms: list[str] = field(default_factory=lambda: ["dflash2", "conv_only", "v1"])
    evaluate: list[str] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    sweep: list[str] = field(default_factory=list)        # empty: no N sweep
    sweep_arms: list[str] = field(default_factory=lambda: ["dflash2"])
    speed: list[SpeedRun] = field(default_factory=list)
    compare_resamples: int = 2000
    parallel: int = 4                  # eval processes at a time (per GPU when gpus >= 2)
    gpus: int = 1                      # GPUs the jobs are placed on (dflash2.placement); 1: as before


def check_plan(plan: AblationPlan) -> AblationPlan:
    """`plan` unchanged; `ValueError` for parallel < 1 or gpus < 1."""
    if plan.parallel < 1:
        raise ValueError(f"plan {plan.name}: parallel={plan.parallel}: use >= 1")
    if plan.gpus < 1:
        raise ValueError(f"plan {plan.name}: gpus={plan.gpus}: use >= 1")
    return plan


def plan_path(name: str) -> Path:
    """`configs/ablation/<name>.yaml`, or `name` itself when it is a YAML file's path."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    return REPO / "configs" / "ablation" / f"{name}.yaml"


def load_plan(name: str) -> AblationPlan:
    """The plan `name` (`plan_path`), typed (unknown keys refused); `ValueError` lists the plans
    when there is no such file."""
    from omegaconf import OmegaConf

    path = plan_path(name)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ValueError(f"--plan {name}: no configs/ablation/{name}.yaml (plans: {known})")
    plan = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AblationPlan), OmegaConf.load(path)))
    return check_plan(plan)


def temp_tag(t: float) -> str:
    return f"T{float(t):g}"


@dataclass
class Job:
    name: str                     # unique; its log is ROOT/logs/<name>.log
    argv: list[str]
    out_dir: Path                 # exists after a start: the job is resumed with resume=true
    also_dirs: tuple[Path, ...] = ()   # any of these existing means started too (a group of arms)
    gpu: int | None = None        # pinned GPU (gpus >= 2); None: the phase's pool chooses

    def started(self) -> bool:
        return self.out_dir.exists() or any(d.exists() for d in self.also_dirs)


class Ablation:
    """The phases of `plan` under `root`, with `extra` overrides appended to every job."""

    def __init__(self, plan: AblationPlan, root: str | os.PathLike, extra: list[str] = ()):
        self.plan, self.root, self.extra = check_plan(plan), Path(root).resolve(), list(extra)
        self.devices = visible_devices(plan.gpus, os.environ) if plan.gpus > 1 else None
        self.state_path = self.root / "ablation.json"
        fresh = {"phases": {}, "jobs": {}}
        self.state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else fresh

    # ------------------------------------------------------------------ jobs of each phase
    def _script(self, script: str, *overrides: str) -> list[str]:
        # hydra.run.dir=.: a preset's run dir (made for -m sweeps) must not create a folder in
        # the job's output_dir, which the entry point then finds not empty.
        return [sys.executable, str(REPO / script), *self.plan.common, *overrides, *self.extra, "hydra.run.dir=."]

    def jobs(self, phase: str) -> list[Job]:
        p, r = self.plan, self.root
        if phase == "regen":
            return [Job("regen", self._script("train/regenerate.py", *p.regenerate, f"output_dir={r / 'regen'}"),
                        r / "regen", gpu=0 if p.gpus > 1 else None)]
        if phase == "train":
            if p.gpus == 1:
                return [self._train_job("train", p.arms, r / "train")]
            return [self._train_job("train_" + "+".join(group), group, r / "train" / group[0],
                                    tuple(r / "train" / a for a in group[1:]), gpu=i)
                    for i, group in enumerate(arm_groups(p.arms, p.gpus))]
        if phase == "eval":
            jobs = [Job(f"eval_{a}_{temp_tag(t)}",
                        self._script("eval/run.py", *p.evaluate, f"ablation_arm={a}", f"temperature={t}",
                                     f"draft_path={r / 'train' / a / 'final'}",
                                     f"output_dir={r / 'eval' / f'{a}_{temp_tag(t)}'}"),
                        r / "eval" / f"{a}_{temp_tag(t)}")
                    for a in p.arms for t in p.temperatures]
            if p.sweep:
                jobs += [Job(f"sweep_{a}", self._script("eval/run.py", *p.sweep, f"ablation_arm={a}",
                                                        f"draft_path={r / 'train' / a / 'final'}",
                                                        f"output_dir={r / 'sweep' / a}"), r / "sweep" / a)
                         for a in p.sweep_arms]
            return jobs
        if phase == "speed":
            return [Job(f"speed_{s.name}", self._script("eval/run.py", *p.evaluate, f"ablation_arm={s.arm}",
                                                        *s.overrides, f"draft_path={r / 'train' / s.arm / 'final'}",
                                                        f"output_dir={r / 'speed' / s.name}"), r / "speed" / s.name)
                    for s in p.speed]
        if phase == "compare":
            runs = [f"{a}={r / 'eval' / f'{a}_{temp_tag(t)}'}" for a in p.arms for t in p.temperatures]
            sweeps = [f"{a}={r / 'sweep' / a}" for a in p.sweep_arms] if p.sweep else []
            argv = [sys.executable, str(REPO / "eval" / "report.py"), "--compare", *runs,
                    *(["--sweep", *sweeps] if sweeps else []), "--out", str(r / "compare"),
                    "--n-resamples", str(p.compare_resamples)]
            return [Job("compare", argv, r / "compare")]
        raise ValueError(f"unknown phase {phase!r}: use {', '.join(PHASES)}")

    def _train_job(self, name: str, arms: list[str], out_dir: Path, also: tuple[Path, ...] = (),
                   gpu: int | None = None) -> Job:
        # Every group writes ROOT/train/<arm>/ (output_dir/<arm> of `arms=[...]`), whatever its size.
        argv = self._script("train/distill.py", *self.plan.train, "arms=[" + ",".join(arms) + "]",
                            f"data.regenerated={self.root / 'regen' / 'regenerated.jsonl'}",
                            f"output_dir={self.root / 'train'}")
        return Job(name, argv, out_dir, also, gpu)

    # ------------------------------------------------------------------ running
    def _save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_path)

    def _start(self, job: Job, gpu: int | None = None) -> tuple[subprocess.Popen, object]:
        argv = list(job.argv)
        if job.started() and job.name != "compare":   # started before: continue it
            argv.append("resume=true")
        log = open(self.root / "logs" / f"{job.name}.log", "a")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices[gpu]
            log.write(f"\n# gpu {gpu} (CUDA_VISIBLE_DEVICES={self.devices[gpu]})")
            self.state["jobs"][job.name] = {"done": False, "gpu": gpu, "cuda_visible_devices": self.devices[gpu]}
            self._save()
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env), log

    def _pool(self, phase: str) -> GpuPool | None:
        """None with gpus = 1 and for compare (no GPU); else the phase's slots (`dflash2.placement`)."""
        if self.plan.gpus == 1 or phase == "compare":
            return None
        return GpuPool(self.plan.gpus, self.plan.parallel if phase == "eval" else 1)

    def run_phase(self, phase: str, *, progress: bool = True) -> float:
        """Run `phase`'s unfinished jobs (`plan.parallel` at a time for eval, per GPU when
        gpus >= 2; module docstring); returns its wall seconds. Raises `RuntimeError` naming the
        first failed job and its log."""
        from tqdm.auto import tqdm

        jobs = [j for j in self.jobs(phase) if not self.state["jobs"].get(j.name, {}).get("done")]
        width = self.plan.parallel if phase == "eval" else 1
        pool = self._pool(phase)
        t0 = time.perf_counter()
        pending, running, failed = list(jobs), {}, []
        bar = tqdm(total=len(jobs), desc=f"ablation {phase}", disable=not progress, dynamic_ncols=True)
        try:
            while pending or running:
                while pending and not failed:
                    if pool is None:
                        if len(running) >= width:
                            break
                        gpu = None
                    elif (gpu := pool.acquire(pending[0].gpu)) is None:
                        break
                    job = pending.pop(0)
                    running[job.name] = (job, *self._start(job, gpu), time.perf_counter(), gpu)
                time.sleep(0.2)
                for name, (job, proc, log, started, gpu) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    log.close()
                    del running[name]
                    if gpu is not None:
                        pool.release(gpu)
                    bar.update(1)
                    if proc.returncode != 0:
                        failed.append(job)
                        continue
                    rec = {"done": True, "seconds": round(time.perf_counter() - started, 1)}
                    if gpu is not None:
                        rec.update(gpu=gpu, cuda_visible_devices=self.devices[gpu])
                    self.state["jobs"][name] = rec
                    self._save()
                if failed and not running:
                    break
        finally:
            bar.close()
            for _job, proc, log, *_ in running.values():   # interrupted: stop the children too
                proc.terminate()
                log.close()
        if failed:
            job = failed[0]
            log_path = self.root / "logs" / f"{job.name}.log"
            raise RuntimeError(f"ablation {phase}: job {job.name} failed; see {log_path} "
                               "(rerun the same command to continue)")
        seconds = time.perf_counter() - t0
        if jobs:   # a phase with nothing left to do keeps the time it took when it ran
            self.state["phases"][phase] = {"done": True, "seconds": round(seconds, 1),
                                           "jobs": [j.name for j in self.jobs(phase)]}
            if pool is not None:
                self.state["phases"][phase]["gpus"] = self.plan.gpus
            self._save()
        return seconds

    def run(self, phases: list[str], *, progress: bool = True) -> str:
        """Run `phases` in order (finished ones are skipped); returns the summary table."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.state.setdefault("plan", self.plan.name)
        self._save()
        for phase in phases:
            self.run_phase(phase, progress=progress)
        return self.summary()

    def summary(self) -> str:
        lines = [f"ablation {self.plan.name} in {self.root}", "| phase | wall min | jobs |", "|---|---|---|"]
        total = 0.0
        for phase in PHASES:
            rec = self.state["phases"].get(phase)
            if rec:
                total += rec["seconds"]
                lines.append(f"| {phase} | {rec['seconds'] / 60:.2f} | {len(rec['jobs'])} |")
        lines.append(f"| all | {total / 60:.2f} | |")
        if (self.root / "compare" / "compare.md").is_file():
            lines.append(f"tables: {self.root / 'compare' / 'compare.md'}")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash2.ablation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="the experiment's directory (created; a rerun continues it)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides added to every job (e.g. target.path=FILE)")
    ap.add_argument("--plan", default="qwen05b", help="configs/ablation/<plan>.yaml, or a plan file's path")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs to place the jobs on (overrides the plan's gpus; 1: everything as one GPU)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    try:
        if bad:
            raise ValueError(f"--phases: unknown {', '.join(bad)}; use {','.join(PHASES)}")
        plan = load_plan(args.plan)
        if args.gpus is not None:
            plan.gpus = args.gpus
        root = Path(args.root)
        if root.exists() and not root.is_dir():
            raise ValueError(f"{root} exists and is a file; choose a directory")
        summary = Ablation(plan, root, args.overrides).run(phases, progress=not args.no_progress)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
