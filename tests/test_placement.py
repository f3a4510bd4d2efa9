"""`dflash2.placement`: the ablation launcher's GPU placement as pure functions (jobs x GPUs ->
assignment), checked directly."""

from __future__ import annotations

import pytest

from dflash2.placement import GpuPool, arm_groups, least_loaded, schedule, visible_devices


@pytest.mark.parametrize(("k", "g", "sizes"), [(3, 1, [3]), (3, 2, [2, 1]), (3, 3, [1, 1, 1]), (3, 4, [1, 1, 1]),
                                               (3, 8, [1, 1, 1]), (5, 2, [3, 2]), (7, 3, [3, 2, 2]), (8, 4, [2] * 4)])
def test_arm_groups_are_contiguous_balanced_and_cover_every_arm_once(k, g, sizes):
    arms = [f"a{i}" for i in range(k)]
    groups = arm_groups(arms, g)
    assert [len(x) for x in groups] == sizes
    assert [a for grp in groups for a in grp] == arms          # order kept, each arm once
    assert arm_groups(["dflash2", "conv_only", "v1"], 4) == [["dflash2"], ["conv_only"], ["v1"]]
    assert arm_groups(["dflash2", "conv_only", "v1"], 2) == [["dflash2", "conv_only"], ["v1"]]


def test_arm_groups_refuses_bad_input():
    with pytest.raises(ValueError, match="gpus=0"):
        arm_groups(["a"], 0)
    with pytest.raises(ValueError, match="no arms"):
        arm_groups([], 2)


def test_visible_devices_maps_logical_gpus_to_the_inherited_list():
    assert visible_devices(4, {}) == ["0", "1", "2", "3"]
    assert visible_devices(2, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["4", "5"]
    assert visible_devices(2, {"CUDA_VISIBLE_DEVICES": " 3 , 1 "}) == ["3", "1"]
    assert visible_devices(1, {"CUDA_VISIBLE_DEVICES": "GPU-uuid-a"}) == ["GPU-uuid-a"]
    with pytest.raises(ValueError, match="names 1 device"):
        visible_devices(2, {"CUDA_VISIBLE_DEVICES": "6"})
    with pytest.raises(ValueError, match="names 0 device"):
        visible_devices(2, {"CUDA_VISIBLE_DEVICES": ""})


def test_least_loaded_and_the_pool():
    assert least_loaded([0, 0, 0], 2) == 0
    assert least_loaded([1, 0, 1], 2) == 1
    assert least_loaded([2, 1, 1], 2) == 1                 # tie: lowest index
    assert least_loaded([2, 2], 2) is None
    pool = GpuPool(2, 2)
    assert [pool.acquire() for _ in range(5)] == [0, 1, 0, 1, None]
    pool.release(1)
    assert pool.acquire(0) is None and pool.acquire(1) == 1   # pinned: that GPU or nothing
    assert pool.load == [2, 2]
    with pytest.raises(ValueError, match="GPUs 0..1"):
        pool.acquire(2)
    fresh = GpuPool(2, 1)
    with pytest.raises(ValueError, match="released more often"):
        fresh.release(0)
    with pytest.raises(ValueError, match="per_gpu=0"):
        GpuPool(2, 0)


def test_schedule_places_jobs_on_the_gpu_that_frees_first():
    # 7 evaluation jobs (the plan's 6 (arm, T) runs + the sweep) on 4 GPUs, 2 per GPU: all start at once.
    assert schedule([10] * 7, 4, 2) == [0, 1, 2, 3, 0, 1, 2]
    # One slot per GPU (the timing runs): each job alone on its GPU, the next one where one ended.
    assert schedule([5, 1, 3, 1], 2, 1) == [0, 1, 1, 1]   # GPU 1 frees at t=1 (job 2), then t=4 (job 3)
    assert schedule([1, 5, 3], 2, 1) == [0, 1, 0]
    # Two GPUs free at the same time: both released, then least-loaded (GPU 0) first.
    assert schedule([2, 2, 1, 1], 2, 1) == [0, 1, 0, 1]
    # Pinned jobs (training groups) go where they are pinned, waiting when it is busy.
    assert schedule([4, 4, 1], 2, 1, pinned=[0, 1, 0]) == [0, 1, 0]
    assert schedule([], 3, 1) == []
