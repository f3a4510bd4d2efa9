"""The decoding states kept on a target between `speculative_generate` calls, and their reuse key.

A decoding state (`dflash2.engine.state.DecodeState`), with the CUDA graphs captured on it (one
per K/V bucket), stays on the target model after the call (`model._dflash2_decode_state`, a
`KeptStates`: the `MAX_KEPT_STATES` most recently used, within `kept_bytes_cap` of their buffers'
bytes) and serves a later call whose `state_key` matches (same weights in place, same draft, N,
batch bucket, sampling filters, stop-token count, kernels) and whose rows fit its slots: the call
loads its prompts into the buffers in place, and the graphs of earlier calls replay from its
second step on, with no capture. An evaluation that interleaves arms per prompt (AR, several N,
several drafts) therefore captures each arm's graphs once, not once per call. A state of the same
key and batch that is too short is freed before its longer successor is built; past either cap the
least recently used states not in use are freed (so a new state may briefly sit beside the ones it
displaces), and a new state that does not fit the device's memory beside the kept ones frees the
idle ones and is built again, once. `release_decode_state(model)` frees them all at once (their
K/V buffers and graph pools stay allocated until then). The eager loop and custom proposers (whose
state is their own) build a state per call, at the call's own batch size.

Public: `state_key`, `kept_state`, `keep_state`, `kept_states`, `free_idle_states`,
`release_decode_state`, `state_nbytes`, `KeptStates`.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from typing import TYPE_CHECKING

import torch

from dflash2.target import TargetModel

if TYPE_CHECKING:
    from dflash2.engine.state import DecodeState

_ATTR = "_dflash2_decode_state"
MAX_KEPT_STATES = 8  # decoding states kept on a target between calls (least recently used freed first)
KEPT_MEMORY_FRACTION = 0.25  # of a CUDA device's memory: the kept states' buffers together


def _storage_fingerprint(obj) -> tuple:
    """Addresses, shapes and dtypes of a module's parameters and buffers (or of the tensor
    attributes of a proposer that is no module): a graph reads them by address, so tensors
    replaced (not updated in place) must not meet an old graph."""
    if obj is None:
        return ()
    if isinstance(obj, torch.nn.Module):
        tensors = list(obj.parameters()) + list(obj.buffers())
    else:
        tensors = [v for v in vars(obj).values() if isinstance(v, torch.Tensor)]
    return tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in tensors)


def state_key(tgt: TargetModel, draft, **settings) -> tuple:
    """What a reusable state (and its graphs) depends on besides its row and slot counts."""
    return (id(tgt.model), _storage_fingerprint(tgt.model), id(draft), _storage_fingerprint(draft),
            tuple(sorted(settings.items())))


def kept_bytes_cap(device: torch.device) -> int | None:
    """Bytes the kept states' buffers may take together on `device`: `KEPT_MEMORY_FRACTION` of a
    CUDA device's memory; None (no cap but `MAX_KEPT_STATES`) elsewhere."""
    if device.type != "cuda":
        return None
    return int(KEPT_MEMORY_FRACTION * torch.cuda.get_device_properties(device).total_memory)


# Objects a state may refer to that hold no memory of its own (a module's globals, a function's).
_NOT_STATE = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, type)


def _model_storages(state: DecodeState) -> set[int]:
    """Storage addresses of the parameters and buffers of the models a state refers to (the target,
    a DFlash2 proposer's draft): what the state reads but does not own."""
    models = [state.tgt.model, getattr(state.proposer, "draft", None)]
    return {t.untyped_storage().data_ptr() for m in models if isinstance(m, torch.nn.Module)
            for t in (*m.parameters(), *m.buffers())}


def state_nbytes(state: DecodeState) -> int:
    """Bytes of the tensors a state holds (its buffers, its target cache, its proposer's caches),
    each storage once. The models' weights are not counted, also where the state holds them
    directly (the linear mode's fused groups keep references to them); graph pools are not
    tensors and are not counted."""
    seen, total = _model_storages(state), 0
    stack = [(state, 0)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, torch.Tensor):
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += obj.untyped_storage().nbytes()
        elif isinstance(obj, (torch.nn.Module, TargetModel, *_NOT_STATE)) or depth > 6:
            continue
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += [(x, depth + 1) for x in obj]
        elif isinstance(obj, dict):
            stack += [(x, depth + 1) for x in obj.values()]
        elif hasattr(obj, "__dict__"):
            stack += [(x, depth + 1) for x in vars(obj).values()]
    return total


class KeptStates:
    """The decoding states kept on one target between calls, least recently used first.

    A state in use by a call holds its `lock`; `take` and eviction never touch it. Every state
    here has a `key`; a call of another key, batch or length builds its own and `keep`s it.
    """

    def __init__(self):
        self.states: OrderedDict[int, DecodeState] = OrderedDict()  # id(state) -> state, LRU first

    def take(self, key: tuple, batch: int, max_len: int) -> DecodeState | None:
        """The most recent state for `key` with `batch` rows and at least `max_len` slots that no
        other call is using, locked and marked most recently used; None if there is none. A state of
        that key and batch with fewer slots is freed first (a longer one replaces it)."""
        for sid, held in reversed(list(self.states.items())):
            if held.key != key or held.batch != batch:
                continue
            if held.max_len >= max_len:
                if held.lock.acquire(blocking=False):  # in use by another thread: look further, else build
                    self.states.move_to_end(sid)
                    return held
            elif held.lock.acquire(blocking=False):
                self._free(sid)
        return None

    def keep(self, state: DecodeState, cap_bytes: int | None) -> None:
        """Add `state` (most recently used), then free the least recently used states not in use
        while more than `MAX_KEPT_STATES` are kept or, with `cap_bytes`, their bytes exceed it."""
        self.states[id(state)] = state
        sizes = {sid: state_nbytes(s) for sid, s in self.states.items()}
        for sid in list(self.states):
            over_count = len(self.states) > MAX_KEPT_STATES
            over_bytes = cap_bytes is not None and sum(sizes[k] for k in self.states) > cap_bytes
            if not (over_count or over_bytes):
                break
            if sid != id(state) and self.states[sid].lock.acquire(blocking=False):
                self._free(sid)

    def _free(self, sid: int) -> None:
        """Close and forget a state whose lock the caller holds."""
        held = self.states.pop(sid)
        held.close()
        held.lock.release()

    def free_idle(self) -> int:
        """Close and forget every state no call is using; how many."""
        idle = [sid for sid, held in self.states.items() if held.lock.acquire(blocking=False)]
        for sid in idle:
            self._free(sid)
        return len(idle)

    def release_all(self) -> int:
        """Close and forget every state (in use or not: the caller is done with the target); how many."""
        n = len(self.states)
        for held in self.states.values():
            held.close()
        self.states.clear()
        return n

    def latest(self) -> DecodeState | None:
        """The most recently used state, None if none is kept."""
        return next(reversed(self.states.values()), None)


def release_decode_state(model) -> bool:
    """Drop the decoding states (K/V buffers, CUDA graphs) kept on `model` (an HF model or a
    `TargetModel`) for later calls; True if there was one."""
    hf = model.model if isinstance(model, TargetModel) else model
    held = hf.__dict__.pop(_ATTR, None)
    return held is not None and held.release_all() > 0


def kept_states(model) -> KeptStates | None:
    """The `KeptStates` of `model` (an HF model or a `TargetModel`), None before any was kept."""
    hf = model.model if isinstance(model, TargetModel) else model
    return hf.__dict__.get(_ATTR)


def free_idle_states(tgt: TargetModel) -> int:
    """Free the states kept on the target that no call is using (a new state that did not fit the
    device's memory beside them retries once); how many were freed."""
    held = kept_states(tgt)
    return 0 if held is None else held.free_idle()


def kept_state(tgt: TargetModel, key: tuple, batch: int, max_len: int) -> DecodeState | None:
    """A kept state for `key` with `batch` rows and at least `max_len` slots that no other call is
    using, locked; None if the call must build one (`KeptStates.take`)."""
    held = kept_states(tgt)
    return None if held is None else held.take(key, batch, max_len)


def keep_state(tgt: TargetModel, state: DecodeState) -> None:
    """Keep `state` on the target for later calls (`KeptStates.keep`, capped on its device)."""
    held = tgt.model.__dict__.setdefault(_ATTR, KeptStates())
    held.keep(state, kept_bytes_cap(tgt.device))
