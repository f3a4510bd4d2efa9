"""Small-M linear: `F.linear` at decode and verify sizes, streaming the weights once per 32 rows
(once per 128 rows past that).

At decode and verify sizes (M = 1..32 rows of a Qwen3-8B-shaped target) a linear layer is a
read of its weight matrix (`python -m benchmarks.linear` times this kernel and cuBLAS against
the copy bandwidth; docs/PERFORMANCE.md has the figures). The Triton kernel (`triton_kernels.py`)
streams `weight [N, K]` in `[block_n, block_k]` tiles with all rows' partial sums in registers
and an optional split over K whose partials the last split to finish sums in a fixed order
(one launch).

Guarantees of the Triton path:
- **Row invariance.** The tiling (`LinearConfig`) is chosen from `(N, K, dtype, SM count)`,
  never from the number of rows; rows do not interact, and every tile of `MAX_ROWS` rows runs the
  same arithmetic (how many row tiles share a program follows the row count, but no row's
  MMAs or sums change with it), so row i of the output is bit-identical whether `x` holds that
  row alone or with any number of others (a batch-invariant linear, as exact mode needs). Past
  `MAX_ROWS` rows a
  program serves up to `LinearConfig.row_tiles` row tiles (4) from each weight tile it reads,
  each with the same MMA on the same weight tile, and every further group of row tiles reads
  the weights again (through L2 when its neighbours read the same tile), so the kernel is for
  decode and verify sizes; callers cap the rows they route (`max_rows`).
- **Deterministic.** The same inputs give the same bits on every call: with a split, an
  atomic ticket only decides which program adds the partials, never the order they are added in.
- **Accuracy.** fp32 accumulation, one rounding to `x`'s dtype at the end (bias added in
  fp32 first); fp32 inputs use full-precision fp32 products, not tf32.
- **CUDA graphs.** A call makes no host sync and reads no device value on the host: the
  launch grid, the split and the workspace size depend on shapes only. It allocates its output
  and, with a split, a `[split, M, N]` fp32 workspace through PyTorch's caching allocator, so
  under `torch.cuda.graph` both come from the graph's private pool, as any op's output does.
  A split also needs a ticket counter per column tile, zero between calls: pass a long-lived
  `ticket_buffer` (the mode keeps one; each call leaves it at zero, so replays find it so), or
  a zeroed one is allocated per call.
  The first call per (shape, dtype, config, row tiles per program: 1 to 4, from the row count)
  compiles the kernel: make it (a warm-up step at the captured row count) before capture, as
  for every Triton kernel.

`SmallMLinearMode` routes the stock `nn.Linear` modules of a target through the kernel without
touching modeling code (a `torch.overrides.TorchFunctionMode`): inside `with mode:` every
`F.linear` whose input fits (`SmallMLinearMode.routes`) runs the kernel, the rest run
`F.linear` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dflash2.kernels.linear.reference import linear_reference

try:
    from dflash2.kernels.linear import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["small_m_linear", "linear_reference", "kernel_fits", "LinearConfig", "default_config",
           "ticket_buffer", "SmallMLinearMode", "FusedLinears", "fusable_groups", "MAX_ROWS", "MAX_ROW_TILES",
           "DTYPES"]

MAX_ROWS = 32  # decode / verify blocks; the row tile is always this wide (row invariance)
MAX_ROW_TILES = 4  # row tiles one program can serve from each weight tile it reads
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_DEFAULT_SMS = 132  # an H200; the interpreter (CPU) has no SM count of its own
TICKETS = 1 << 14  # split-K counters a mode keeps: column tiles of the widest layer (lm_head / 16)


@dataclass(frozen=True)
class LinearConfig:
    """One tiling of the kernel: `block_n` output columns and `block_k` inputs per step of a
    program, `split_k` programs over K per column tile, `row_tiles` row tiles of `MAX_ROWS`
    rows per program (1 to 4: past `MAX_ROWS` rows, one read of a weight tile serves that many
    row tiles; a call takes as many as it has, up to this), and Triton's `num_warps` /
    `num_stages`. `block_n` and `block_k` are powers of two >= 16. `pdl`: launch with
    programmatic dependent launch where the GPU has it (compute capability 9.0+), so the kernel
    starts while the previous one on the stream drains (it waits for it before touching memory);
    ignored elsewhere (CPU, older GPUs). Off by default: it gains only when linears run back to
    back and loses when another kernel runs before each (`python -m benchmarks.linear` times the
    8B stack both ways, `kernel ms, PDL` / `kernel ms, no PDL`)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    pdl: bool = False
    row_tiles: int = 4

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"split_k, num_warps and num_stages must be >= 1, got {self}")
        if not 1 <= self.row_tiles <= MAX_ROW_TILES:
            raise ValueError(f"row_tiles must be 1..{MAX_ROW_TILES}, got {self.row_tiles}")


def default_config(n: int, k: int, dtype: torch.dtype, sm_count: int = _DEFAULT_SMS) -> LinearConfig:
    """The tiling used for `weight [n, k]` of `dtype` on a GPU with `sm_count` SMs.

    A pure function of its arguments (never of the number of rows: that is what makes the kernel
    row-invariant). Column tiles of 64 and K steps of 128 (64 in fp32), the tiling chosen by
    `python -m benchmarks.linear --sweep` at the 8B shapes (`docs/PERFORMANCE.md`, "Linear
    stack"); K is split in powers of two while the programs number fewer than about one per SM
    (0.9 x, so 128 programs on 132 SMs is enough) and every split keeps at least four K steps.
    """
    block_k = 64 if dtype == torch.float32 else 128
    block_n = 64
    tiles = -(-n // block_n)
    split = 1
    while tiles * split < 0.9 * sm_count and k >= 2 * split * 4 * block_k:
        split *= 2
    return LinearConfig(block_n=block_n, block_k=block_k, split_k=split)


def kernel_fits(rows: int, n: int, k: int, dtype: torch.dtype, max_rows: int | None = MAX_ROWS) -> bool:
    """Whether the Triton kernel takes `rows` rows of `x [rows, k]` against `weight [n, k]` of
    `dtype`: 1..`max_rows` rows (None: any number), non-empty `n` and `k`, a dtype in `DTYPES`."""
    return 1 <= rows and (max_rows is None or rows <= max_rows) and n >= 1 and k >= 1 and dtype in DTYPES


def _split_chunk(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """`(k_chunk, splits)`: each split covers a multiple of `block_k` inputs; fewer splits than
    asked when K is too short for them (no empty split)."""
    chunk = -(-k // split_k)
    chunk = -(-chunk // block_k) * block_k
    return chunk, -(-k // chunk)


def ticket_buffer(device: torch.device | str, size: int = TICKETS) -> torch.Tensor:
    """A zeroed int32 buffer of split-K tickets for `small_m_linear(..., tickets=...)`: one counter
    per column tile, left at zero by every call. Calls that share one must be stream-ordered."""
    return torch.zeros(size, dtype=torch.int32, device=device)


def _small_m_linear_triton(x: torch.Tensor, weight: torch.Tensor | tuple[torch.Tensor, ...],
                           bias: torch.Tensor | None, config: LinearConfig,
                           tickets: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton path on `x [M, K]` (any M >= 1, unit stride along K), `weight [N, K]`
    (unit stride along K) or a tuple of up to three such matrices with one row stride (a fused
    group: the weight is their row-wise concatenation, read where each lies), `bias [N] | None`;
    returns a new `[M, N]` tensor of `x.dtype`. `tickets` (split K only): a `ticket_buffer`
    with at least one counter per (row group, column tile); None (or a smaller one) zeroes a
    fresh one."""
    ws = weight if isinstance(weight, tuple) else (weight,)
    m, k = x.shape
    n1 = ws[0].shape[0]
    n2 = n1 + (ws[1].shape[0] if len(ws) > 1 else 0)
    n = sum(w.shape[0] for w in ws)
    chunk, splits = _split_chunk(k, config.block_k, config.split_k)
    tiles = -(-n // config.block_n)
    group = min(config.row_tiles, -(-m // MAX_ROWS))  # row tiles per program
    groups = -(-m // (MAX_ROWS * group))
    pdl = config.pdl and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if splits > 1:
        part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)  # [split, M, N]
        if tickets is None or tickets.numel() < tiles * groups:
            tickets = ticket_buffer(x.device, tiles * groups)
    else:
        part = tickets = out  # never read with one split
    widen = x.device.type == "cpu" and x.dtype != torch.float32
    w1, w2, w3 = ws[0], ws[min(1, len(ws) - 1)], ws[-1]
    _tk._small_m_linear_kernel[(groups, tiles, splits)](
        x, w1, w2, w3, bias if bias is not None else w1, out, part, tickets, m, n, k, chunk, n1, n2,
        x.stride(0), w1.stride(0), out.stride(0),
        BLOCK_M=MAX_ROWS, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLITS=splits, ROW_TILES=group,
        EVEN_K=k % config.block_k == 0,  # then every split's range is whole blocks
        HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32 or widen, WIDEN=widen, PDL=pdl, NUM_W=len(ws),
        num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl)
    return out


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """`x [..., K]` as `[rows, K]` with unit stride along K (a view where one exists), as the
    kernel takes it."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(1) == 1 else x2.contiguous()


def _check_operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not make a linear "
                         "(weight must be [N, K] with K = x.shape[-1])")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"bias {tuple(bias.shape)} does not match weight {tuple(weight.shape)}")


def small_m_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   impl: str = "torch", config: LinearConfig | None = None,
                   tickets: torch.Tensor | None = None, max_rows: int | None = MAX_ROWS) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for `x [..., K]` with at most `max_rows` rows in all.

    Args:
        x: `[..., K]`, any leading shape (`[M, K]`, `[B, T, K]`); bf16, fp16 or fp32.
        weight: `[N, K]` of `x`'s dtype, unit stride along K (the `nn.Linear` layout).
        bias: `[N]` of `x`'s dtype, or None.
        impl: `"torch"` (the reference) or `"triton"` (already resolved,
            `dflash2.kernels.dispatch.resolve_impl`).
        config: the Triton tiling; None takes `default_config` for the weight's shape (with the
            device's SM count on CUDA). Pass the same config for every row count to keep the
            row invariance.
        tickets: for tilings that split K, a `ticket_buffer` on `x`'s device (reused, stream-
            ordered calls only); None zeroes a fresh one per call (one memset more).
        max_rows: the most rows taken (default `MAX_ROWS`, one row tile); None takes any number
            (exact mode: the row invariance holds across row tiles).
    Returns:
        `[..., N]` in `x`'s dtype.
    Raises:
        ValueError: shapes that do not make a linear, or (triton) operands the kernel does not
            take (`kernel_fits`, mixed dtypes, a weight strided along K, tensors needing grad).
    """
    _check_operands(x, weight, bias)
    if impl == "torch":
        return linear_reference(x, weight, bias)
    if impl != "triton":
        raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
    if _tk is None:
        raise RuntimeError("impl='triton' needs the triton package; use impl='torch'")
    k, n = x.shape[-1], weight.shape[0]
    rows = x.numel() // k if k else 0
    if not kernel_fits(rows, n, k, x.dtype, max_rows):
        raise ValueError(f"the small-M kernel takes 1..{max_rows or 'any'} rows of a {DTYPES} input, "
                         f"got {rows} rows of {x.dtype} (K={k}, N={n}); use impl='torch'")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"x, weight and bias must share a dtype, got {x.dtype}, {weight.dtype}, "
                         f"{None if bias is None else bias.dtype}")
    if weight.stride(1) != 1:
        raise ValueError("weight must have unit stride along K (the nn.Linear layout); the kernel does not copy it")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        raise ValueError("the small-M kernel is inference-only (no autograd); use impl='torch' or torch.no_grad()")
    if config is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else _DEFAULT_SMS
        config = default_config(n, k, x.dtype, sms)
    x2 = _as_rows(x)
    bias = None if bias is None else bias.contiguous()
    return _small_m_linear_triton(x2, weight, bias, config, tickets).reshape(*x.shape[:-1], n)


@torch.library.custom_op("dflash2::small_m_linear", mutates_args=())
def _small_m_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tickets: torch.Tensor,
                       block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
                       pdl: bool, row_tiles: int) -> torch.Tensor:
    """The Triton path as one opaque operator, so `torch.compile` keeps it whole (dynamo traces
    `SmallMLinearMode.__torch_function__` and emits this op; Inductor calls it as an extern
    kernel). Declared pure: `tickets` is scratch that every call returns to zero before it ends,
    and calls on one stream run in order, so no call observes another's use of it."""
    config = LinearConfig(block_n, block_k, split_k, num_warps, num_stages, pdl, row_tiles)
    return _small_m_linear_triton(x, weight, bias, config, tickets)


@_small_m_linear_op.register_fake
def _small_m_linear_fake(x, weight, bias, tickets, block_n, block_k, split_k, num_warps, num_stages, pdl,
                         row_tiles):
    return x.new_empty(x.shape[0], weight.shape[0])


class FusedLinears:
    """Linears that read the same input (an attention's q/k/v, an MLP's gate and up), run as one
    kernel launch that streams their weights where they are: one launch reads the two or three
    matrices, where separate launches would each pay the kernel's fixed cost
    (docs/PERFORMANCE.md: the small k/v matrices read at about a third of copy bandwidth alone).

    Args:
        linears: 2 or 3 `nn.Linear` modules (or objects with `weight` and `bias`), in the order
            the model calls them; same `in_features`, dtype and device, contiguous weights, all
            with a bias or none.
    Attributes:
        weights: the members' own weight tensors (no copy: in-place updates reach the launch).
        bias: the members' biases concatenated (a copy; `refresh` copies them again) or None.
        sizes: each member's `N_i`; n, k: the fused `[sum N_i, K]` shape. keys: each member's
            weight identity (`id`): a replaced weight no longer matches, and its calls run unfused.
    """

    def __init__(self, linears) -> None:
        linears = list(linears)
        if not 2 <= len(linears) <= 3:
            raise ValueError(f"a fused group needs two or three linears, got {len(linears)}")
        w0 = linears[0].weight
        if any(lin.weight.dim() != 2 or lin.weight.shape[1] != w0.shape[1] or lin.weight.dtype != w0.dtype
               or lin.weight.device != w0.device for lin in linears):
            raise ValueError("fused linears must share in_features, dtype and device")
        if any(not lin.weight.is_contiguous() for lin in linears):
            raise ValueError("fused linears need contiguous weights (one row stride)")
        if len({lin.bias is None for lin in linears}) != 1:
            raise ValueError("fused linears must all have a bias or none")
        self.weights = tuple(lin.weight for lin in linears)
        with torch.no_grad():
            self.bias = (None if linears[0].bias is None else
                         torch.cat([lin.bias.detach() for lin in linears]).contiguous())
        self.sizes = [int(lin.weight.shape[0]) for lin in linears]
        self.n, self.k = sum(self.sizes), int(w0.shape[1])
        self.keys = [id(lin.weight) for lin in linears]
        self._linears = linears

    def refresh(self) -> None:
        """Copy the members' current biases into the concatenated one, in place (the same
        storage, so captured graphs keep reading it); the weights are read where they lie."""
        if self.bias is not None:
            with torch.no_grad():
                torch.cat([lin.bias.detach() for lin in self._linears], out=self.bias)


def fusable_groups(model: torch.nn.Module, *, kv_pairs: bool = False, mlp: bool = True) -> list[FusedLinears]:
    """One `FusedLinears` per module of `model` with `q_proj`, `k_proj` and `v_proj` linears, and
    (with `mlp`) one per module with `gate_proj` and `up_proj` linears, that can fuse (stock
    attention and MLP modules: both call their members in that order on one input), in module
    order; with
    `kv_pairs`, also one of each attention's `k_proj` and `v_proj` alone (for an attention that
    projects a second input to keys and values only, as the DFlash2 draft's context: its k/v run
    as one launch when k is called first with an input the q/k/v group did not take). The
    weights are not copied (biases are)."""
    groups = []
    for module in model.modules():
        candidates = []
        lins = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj")]
        if all(isinstance(lin, torch.nn.Linear) for lin in lins):
            candidates += [lins, lins[1:]] if kv_pairs else [lins]
        pair = [getattr(module, name, None) for name in ("gate_proj", "up_proj")]
        if mlp and all(isinstance(lin, torch.nn.Linear) for lin in pair):
            candidates.append(pair)
        for members in candidates:
            try:
                groups.append(FusedLinears(members))
            except ValueError:
                continue  # shapes or dtypes that do not fuse: those linears run one by one
    return groups


class SmallMLinearMode(TorchFunctionMode):
    """Inside `with SmallMLinearMode(impl, device):`, `F.linear` runs the small-M kernel where it
    fits and `F.linear` itself everywhere else, so stock `nn.Linear` modules (the target's
    q/k/v/o, MLP and head) use the kernel without modeling code of ours.

    Routed (`routes`): `impl == "triton"`; input `x` of 2 or 3 dims with 1..`max_rows` rows
    (product of the leading dims) on the device type the impl was resolved for; weight `[N, K]`
    with unit stride along K; one dtype in `DTYPES` for x, weight and bias; nothing that needs
    grad. With `impl == "torch"` the mode routes nothing (a no-op, so callers need no branch).

    Args:
        impl: a resolved `"torch"` or `"triton"` (`dflash2.kernels.dispatch.resolve_impl`).
        device: the device the model runs on; its SM count picks the tilings once.
        configs: optional tilings by `(N, K)` (from `python -m benchmarks.linear --sweep`); other
            shapes take `default_config`.
        max_rows: the most rows routed (default `MAX_ROWS`: decode and verify blocks, where the
            kernel beats cuBLAS); None routes every row count (exact mode, for the row
            invariance across any batch).
        fused: groups of linears that read the same input (`fusable_groups(model)`), each run as
            one launch.

    The mode's state is its split-K `tickets` (zero between calls, so it may be captured in CUDA
    graphs and replayed) and, with `fused` groups (`fusable_groups`: each attention's q/k/v, each
    MLP's gate/up), the outputs waiting for a group's later members; calls through one mode must
    be stream-ordered. A fused group runs one launch over its members' weights when its first
    member is called; the others return their slices of it when called with the same input
    tensor (eager and graph capture; inside `torch.compile`d modules each linear runs on its own:
    a group looked up by its weights would specialize a compiled module per layer). The CUDA-graph
    contract is otherwise `small_m_linear`'s. Around `torch.compile`d modules, dynamo traces the
    routing (the row count becomes a guard) and emits the opaque `dflash2::small_m_linear`
    operator, which runs the same kernel with the same tiling, so compiled and eager calls give
    the same bits.
    """

    def __init__(self, impl: str, device: torch.device | str,
                 configs: dict[tuple[int, int], LinearConfig] | None = None, max_rows: int | None = MAX_ROWS,
                 fused: list[FusedLinears] | None = None) -> None:
        super().__init__()
        if impl not in ("torch", "triton"):
            raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be None or >= 1, got {max_rows}")
        self.impl, self.max_rows = impl, max_rows
        self.device = torch.device(device)
        self.sm_count = (torch.cuda.get_device_properties(self.device).multi_processor_count
                         if self.device.type == "cuda" else _DEFAULT_SMS)
        self.configs = dict(configs or {})
        # Split-K counters, zero between calls (each call leaves them so): calls through one mode
        # must be stream-ordered, as one stream or one graph's replays are.
        self.tickets = ticket_buffer(self.device) if impl == "triton" else None
        # Fused groups by their first member's weight key; later members' outputs wait in
        # `_pending` (by weight key: (the input it was computed for, the output slice)) until the
        # model asks for them with that same input tensor.
        self._fused = {g.keys[0]: g for g in (fused or [])}
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def refresh_fused(self) -> None:
        """`FusedLinears.refresh` for every fused group (the engine calls it at the start of
        each call, so in-place bias updates between calls are seen; weights are read in place)."""
        for group in self._fused.values():
            group.refresh()

    def config_for(self, n: int, k: int, dtype: torch.dtype) -> LinearConfig:
        """The tiling for `weight [n, k]`: an entry of `configs`, else `default_config`."""
        return self.configs.get((n, k)) or default_config(n, k, dtype, self.sm_count)

    def routes(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether `F.linear(x, weight, bias)` goes to the kernel under this mode."""
        if self.impl != "triton" or x.dim() not in (2, 3) or weight.dim() != 2:
            return False
        k = x.shape[-1]
        if k != weight.shape[1] or not kernel_fits(x.numel() // max(k, 1), weight.shape[0], k, x.dtype,
                                                    self.max_rows):
            return False
        if x.device.type != self.device.type or weight.device != x.device or weight.dtype != x.dtype:
            return False
        if weight.stride(1) != 1:
            return False
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0] or bias.dtype != x.dtype
                                 or bias.device != x.device):
            return False
        grads = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        return not (grads and torch.is_grad_enabled())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0] if args else kwargs["input"], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if self.routes(x, weight, bias):
                if torch.compiler.is_compiling():  # traced by dynamo: the opaque operator, same kernel
                    config = self.config_for(weight.shape[0], weight.shape[1], x.dtype)
                    return _compiled_call(x, weight, bias, config, self.tickets)
                fused = self._fused_output(x, weight, bias) if self._fused else None
                if fused is not None:
                    return fused
                config = self.config_for(weight.shape[0], weight.shape[1], x.dtype)
                return small_m_linear(x, weight, bias, impl="triton", config=config, tickets=self.tickets,
                                      max_rows=self.max_rows)
        return func(*args, **kwargs)

    def _fused_output(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """The output of a fused group's member, or None (not a member, or another input).

        The first member runs the group's one launch and leaves the other members' slices
        pending for that same input tensor; a later member called with it gets its slice. A
        member called with another input (or a group whose first member was skipped) runs
        unfused, so the outputs are those of `F.linear` on the concatenated weights whatever
        the call order."""
        key = id(weight)
        waiting = self._pending.pop(key, None)
        if waiting is not None and waiting[0] is x:
            return waiting[1]
        group = self._fused.get(key)
        if group is None or (bias is None) != (group.bias is None):
            return None
        config = self.config_for(group.n, group.k, x.dtype)
        out = _small_m_linear_triton(_as_rows(x), group.weights, group.bias, config, self.tickets)
        out = out.reshape(*x.shape[:-1], group.n)
        parts = out.split(group.sizes, dim=-1)
        for member, part in zip(group.keys[1:], parts[1:]):
            self._pending[member] = (x, part)
        return parts[0]

    def __exit__(self, *exc):
        self._pending.clear()  # no output outlives the block that computed it
        return super().__exit__(*exc)


def _compiled_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: LinearConfig,
                   tickets: torch.Tensor) -> torch.Tensor:
    """`small_m_linear(..., impl="triton")` through `dflash2::small_m_linear` (checks done by
    `SmallMLinearMode.routes`); the same kernel, launch and tiling as the eager call."""
    k, n = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k).contiguous()
    out = _small_m_linear_op(x2, weight, None if bias is None else bias.contiguous(), tickets, config.block_n,
                             config.block_k, config.split_k, config.num_warps, config.num_stages, config.pdl,
                             config.row_tiles)
    return out.reshape(*x.shape[:-1], n)
