"""A decode step as ``rq_triton`` runs it under CUDA graphs: static plan buffers, padded rows.

The step is what `sglang_rq.backend_triton` does per layer for one decode forward: the plan
(`sglang_rq.kv_plan.plan_history` from a ``req_to_token`` table into buffers sized for the
largest batch and context), decode attention for every loop, then the commit of the new
token's loops. Padded rows are SGLang's: request-table row 0, ``seq_len`` 1, slot 0.

Checked against an independent plan (per-request slot lists concatenated by hand) through
`decode_attention_reference`, with the flash-attn tolerance of tests/kernels/test_decode.py. On
CPU (interpreter) the static-plan step runs eagerly; with CUDA it is captured once and replayed
on two different batches, the second of which reads the token committed by the first replay.
"""

from __future__ import annotations

import pytest
import torch
from views import make_view

from rq_kernels.commit import commit
from rq_kernels import decode_attention
from rq_kernels.testing import attention_errors, loop_kv, sdpa_bf16, within_policy
from sglang_rq.config import RQConfig
from sglang_rq.kv_plan import kv_indices_capacity, plan_history
from sglang_rq.reference import (
    commit_reference, decode_attention_reference, dequantize_rows_reference,
)

LOOPS, HKV, DIM = 4, 2, 64
SCALE = DIM ** -0.5


class Step:
    """Static buffers and the step body for ``max_bs`` requests over a ``[num_reqs, width]``
    request table (row 0 is the padding row, as in SGLang)."""

    def __init__(self, view, table, max_bs, device):
        self.view, self.table = view, table
        self.req = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.q = torch.zeros(LOOPS, max_bs, HKV, DIM, dtype=torch.bfloat16, device=device)
        self.k = torch.zeros_like(self.q)
        self.v = torch.zeros_like(self.q)
        self.out = torch.zeros_like(self.q)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(kv_indices_capacity(max_bs, table.shape[1]),
                                      dtype=torch.int64, device=device)

    def __call__(self):
        plan_history(self.table, self.req, self.seq_lens - 1, self.kv_indptr, self.kv_indices)
        for loop in range(LOOPS):
            decode_attention(self.q[loop], self.k[loop], self.v[loop], self.view, loop,
                             self.kv_indptr, self.kv_indices, sm_scale=SCALE,
                             out=self.out[loop])
        commit(self.k, self.v, self.loc, self.view)

    def load(self, req, seq_lens, loc, seed):
        """Fill the first ``len(req)`` rows; the rest stay SGLang-style padding."""
        n = len(req)
        self.req.zero_()
        self.seq_lens.fill_(1)
        self.loc.zero_()
        self.req[:n] = torch.tensor(req)
        self.seq_lens[:n] = torch.tensor(seq_lens)
        self.loc[:n] = torch.tensor(loc)
        gen = torch.Generator().manual_seed(seed)
        self.q.copy_(torch.randn(self.q.shape, generator=gen).to(torch.bfloat16))
        for t in (self.k, self.v):  # a looped model's K/V: one per-token base, small loop drift
            base = torch.randn(t.shape[1:], generator=gen)
            t.copy_((base + 0.1 * torch.randn(t.shape, generator=gen)).to(torch.bfloat16))


def _world(device, lens, *, seed, rows, width):
    """A view with ``rows`` slots, requests at table rows ``lens`` (row -> history length) whose
    histories are committed at scattered slots (slot 0, the padding slot, never used), and the
    table ``[5, width]`` int32, holding two further slots per request for the next decodes."""
    cfg = RQConfig()
    view = make_view(cfg, num_loops=LOOPS, num_kv_heads=HKV, head_dim=DIM, rows=rows,
                     rotation="cfg", device=device, fill=True, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(rows - 1, generator=gen) + 1
    table = torch.zeros(5, width, dtype=torch.int32)
    used = 0
    for r, n in lens.items():
        table[r, :n + 2] = perm[used:used + n + 2].to(torch.int32)
        used += n + 2
    hist = torch.cat([table[r, :n] for r, n in lens.items()]).to(torch.int64)
    k, v = loop_kv(LOOPS, hist.numel(), HKV, DIM, seed=seed, group_size=cfg.group_size)
    commit_reference(k.to(device), v.to(device), hist.to(device), view)
    return view, table.to(device)


def _check(step, n, lens_of_rows):
    """Real rows of ``step.out`` vs the reference over a hand-built plan."""
    slots = [step.table[r, :lens_of_rows[r]].to(torch.int64) for r in step.req[:n].tolist()]
    ptr = [0]
    for s in slots:
        ptr.append(ptr[-1] + s.numel())
    dev = step.q.device
    ind = torch.tensor(ptr, dtype=torch.int32, device=dev)
    idx = torch.cat(slots)

    for loop in range(LOOPS):
        q, kc, vc = step.q[loop, :n], step.k[loop, :n], step.v[loop, :n]
        ref = decode_attention_reference(q.float(), kc, vc, step.view, loop, ind, idx,
                                         sm_scale=SCALE)
        kh, vh = zip(*(dequantize_rows_reference(step.view, s, loop) for s in slots))
        yard = sdpa_bf16(q, list(kh), list(vh), kc, vc, list(range(n + 1)), sm_scale=SCALE)
        out = step.out[loop, :n]
        assert torch.isfinite(out).all()
        e = attention_errors(out, ref, yard)
        assert within_policy(e), f"loop {loop}: {e}"


def _check_committed(step, n):
    """The new tokens' rows hold their K (all loops) to within the 4-bit anchor's error."""
    for i in range(n):
        slot = step.loc[i:i + 1]
        for loop in range(LOOPS):
            k_rec, _ = dequantize_rows_reference(step.view, slot, loop)
            k_in = step.k[loop, i:i + 1].float()
            rel = (k_rec.to(k_in.device) - k_in).norm() / k_in.norm()
            assert rel < 0.15, f"row {i} loop {loop}: committed K off by {rel:.3f}"


def _decode_and_check(step, run, table, lens, order, seed):
    """Load requests ``order`` (table rows) with histories ``lens``, run the step, check it."""
    step.load(req=order, seq_lens=[lens[r] + 1 for r in order],
              loc=[int(table[r, lens[r]]) for r in order], seed=seed)
    run()
    if step.q.is_cuda:
        torch.cuda.synchronize()
    _check(step, len(order), lens)
    _check_committed(step, len(order))


def test_static_plan_matches_hand_plan_with_padding(device):
    """Eager step on oversized static buffers, two padded rows (CPU: interpreter)."""
    lens = {1: 37, 2: 1, 3: 70}  # awkward: not multiples of the tile, group or page
    view, table = _world(device, lens, seed=5, rows=400, width=160)
    step = Step(view, table, max_bs=5, device=device)
    _decode_and_check(step, step, table, lens, (3, 1, 2), seed=1)


@pytest.mark.gpu
def test_decode_step_cuda_graph_replays(device):
    """Capture once, replay two different batches; the second reads what the first committed."""
    lens = {1: 1001, 2: 1, 3: 517}
    view, table = _world(device, lens, seed=9, rows=3000, width=1200)
    step = Step(view, table, max_bs=4, device=device)
    step.load(req=[4], seq_lens=[1], loc=[0], seed=0)  # a padding-like batch for the warm-up
    step()  # warm-up: compiles, caches the rotation terms
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    _decode_and_check(step, graph.replay, table, lens, (2, 3, 1), seed=1)
    lens = {r: n + 1 for r, n in lens.items()}  # the token committed by replay 1 is history now
    _decode_and_check(step, graph.replay, table, lens, (1, 3), seed=2)
