# Tree attention mask, one program per (request b, node i, block of BLOCK key slots):
#   vis[s] = s < ctx[b]  or  (s - ctx[b]) in {i, parent(i), parent(parent(i)), ...}
# The ancestor walk follows the parent pointers from node i (at most B steps, -1 ends it); the
# keys of a block compare their offset from ctx to each node on the way. Stored as uint8 (0/1),
# viewed as bool by the launcher.
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["kv_len"])  # one binary for every K/V length
def _tree_mask_kernel(
    parent_ptr, ctx_ptr, out_ptr,
    n_nodes, kv_len,
    s_pb, s_ob, s_oi,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    slots = blk * BLOCK + tl.arange(0, BLOCK)
    ctx = tl.load(ctx_ptr + b)
    rel = slots - ctx
    vis = slots < ctx
    cur = i + 0 * ctx  # the walk's current node (ctx's type: a loop-carried scalar)
    for _ in range(0, n_nodes):
        vis = vis | ((rel == cur) & (cur >= 0))
        nxt = tl.load(parent_ptr + b * s_pb + tl.maximum(cur, 0))
        cur = tl.where(cur >= 0, nxt, cur)
    tl.store(out_ptr + b * s_ob + i * s_oi + slots, vis.to(tl.uint8), mask=slots < kv_len)
