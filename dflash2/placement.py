"""Where the ablation launcher's jobs run on a machine of G GPUs (`dflash2.ablation`, `plan.gpus`).

Pure functions and one small bookkeeping class: nothing here starts a process, probes the machine
or imports torch. A "GPU" is a logical index 0..G-1; `visible_devices` maps it to the string a
child process gets as `CUDA_VISIBLE_DEVICES` (so each child sees exactly one device, `cuda:0`).

Policy (what `Ablation.run_phase` does with G >= 2; G = 1 never reaches this module):
- regen: one job on GPU 0 (`train/regenerate.py` has no sharding).
- train: `arm_groups(arms, G)`: one `train/distill.py arms=[...]` process per group, group i
  pinned to GPU i (K arms on G >= K GPUs: one arm per GPU; K > G: groups of ceil/floor(K/G)).
- eval: each job on the least-loaded GPU with a free slot when it starts (`GpuPool` with
  `per_gpu = plan.parallel`): at most `parallel` evaluations share a GPU.
- speed: `GpuPool` with `per_gpu = 1`: each timing run alone on its GPU (runs on different GPUs
  overlap; they share only the host).
- compare: no GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def arm_groups(arms: Sequence[str], gpus: int) -> list[list[str]]:
    """Split `arms` (K names) into min(K, gpus) training processes: contiguous groups in the
    given order, sizes differing by at most one, the larger groups first. Every arm appears in
    exactly one group. `ValueError` for gpus < 1 or no arms.

    >>> arm_groups(["a", "b", "c"], 4)
    [['a'], ['b'], ['c']]
    >>> arm_groups(["a", "b", "c", "d", "e"], 2)
    [['a', 'b', 'c'], ['d', 'e']]
    """
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: use >= 1")
    if not arms:
        raise ValueError("arm_groups: no arms")
    n = min(len(arms), gpus)
    size, extra = divmod(len(arms), n)
    groups, i = [], 0
    for g in range(n):
        k = size + (g < extra)
        groups.append(list(arms[i:i + k]))
        i += k
    return groups


def visible_devices(gpus: int, env: Mapping[str, str]) -> list[str]:
    """The `CUDA_VISIBLE_DEVICES` value for logical GPU 0..gpus-1: the first `gpus` entries of
    `env["CUDA_VISIBLE_DEVICES"]` when the launcher itself was restricted to some devices (so
    `CUDA_VISIBLE_DEVICES=4,5,6,7 python -m dflash2.ablation --gpus 4` uses devices 4-7), else
    "0".."gpus-1". `ValueError` when the inherited list names fewer than `gpus` devices. The
    machine is not probed: asking for more GPUs than it has fails in the children."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: use >= 1")
    inherited = env.get("CUDA_VISIBLE_DEVICES")
    if inherited is None:
        return [str(i) for i in range(gpus)]
    ids = [d.strip() for d in inherited.split(",") if d.strip()]
    if len(ids) < gpus:
        raise ValueError(f"gpus={gpus}, but CUDA_VISIBLE_DEVICES={inherited!r} names {len(ids)} device(s)")
    return ids[:gpus]


def least_loaded(load: Sequence[int], per_gpu: int) -> int | None:
    """The GPU with the fewest running jobs among those below `per_gpu` (the lowest index on a
    tie), or None when every GPU is full. Starting n jobs on idle GPUs therefore places them
    round-robin: 0, 1, ..., G-1, 0, 1, ..."""
    free = [(n, g) for g, n in enumerate(load) if n < per_gpu]
    return min(free)[1] if free else None


class GpuPool:
    """Running jobs per GPU, at most `per_gpu` each. `acquire(gpu)` takes a slot on `gpu` (a
    pinned job) or, with `gpu=None`, on `least_loaded`; it returns the GPU, or None (nothing
    taken) when no slot is free there. `release(gpu)` gives a slot back."""

    def __init__(self, gpus: int, per_gpu: int):
        if gpus < 1 or per_gpu < 1:
            raise ValueError(f"GpuPool(gpus={gpus}, per_gpu={per_gpu}): use >= 1 for both")
        self.per_gpu = per_gpu
        self.load = [0] * gpus

    def acquire(self, gpu: int | None = None) -> int | None:
        if gpu is None:
            gpu = least_loaded(self.load, self.per_gpu)
            if gpu is None:
                return None
        elif not 0 <= gpu < len(self.load):
            raise ValueError(f"GPU {gpu}: the pool has GPUs 0..{len(self.load) - 1}")
        elif self.load[gpu] >= self.per_gpu:
            return None
        self.load[gpu] += 1
        return gpu

    def release(self, gpu: int) -> None:
        if self.load[gpu] <= 0:
            raise ValueError(f"GPU {gpu}: released more often than acquired")
        self.load[gpu] -= 1


def schedule(durations: Sequence[float], gpus: int, per_gpu: int,
             pinned: Sequence[int | None] | None = None) -> list[int]:
    """The GPU each job gets when `len(durations)` jobs are started in order through a
    `GpuPool(gpus, per_gpu)`, each holding its slot for its duration (a simulation of the
    launcher's loop: jobs start in order, a job waits until the one before it started, and the
    jobs that end at the same time free their slots together before the next start).
    `pinned[i]`, when given and not None, is job i's fixed GPU. Deterministic: what the launcher
    records in `ROOT/ablation.json` when the jobs take these times."""
    pool = GpuPool(gpus, per_gpu)
    pinned = list(pinned) if pinned is not None else [None] * len(durations)
    out: list[int] = []
    running: list[tuple[float, int, int]] = []   # (end time, job index, gpu)
    now = 0.0
    for i, dur in enumerate(durations):
        while (gpu := pool.acquire(pinned[i])) is None:
            now = min(end for end, _, _ in running)
            for job in [r for r in running if r[0] == now]:
                running.remove(job)
                pool.release(job[2])
        running.append((now + dur, i, gpu))
        out.append(gpu)
    return out
