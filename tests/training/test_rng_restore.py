"""A checkpoint's CUDA RNG states restore on a process that sees fewer GPUs than the writer did
(a 2-GPU DDP checkpoint resumed on 1 GPU); found on the H200 pair, checked here with a fake CUDA."""

from __future__ import annotations

import torch

from dflash2.training import state as st


def test_cuda_rng_states_restore_on_fewer_devices(monkeypatch):
    saved = st.rng_state()
    fake_states = [torch.tensor([1], dtype=torch.uint8), torch.tensor([2], dtype=torch.uint8)]  # written on 2 GPUs
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # resumed where one GPU is visible
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: restored.append((int(s[0]), i)))
    st.set_rng_state({**saved, "cuda": fake_states})
    assert restored == [(1, 0)]  # device 0 gets the writer's device-0 state; nothing indexes a missing GPU
