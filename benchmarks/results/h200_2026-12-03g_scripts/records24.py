# ruff: noqa  (session 24 script)
"""to_records: a view's codes and (scale, offset) rewritten as one record per (row, KV head)."""
import dataclasses
import torch
def to_records(view):
    codes, sos = [], []
    for c, so in zip(view.codes, view.scale_offset):
        if so is None or c.shape[-1] == 0:
            codes.append(c); sos.append(so); continue
        rows, _, h, cb = c.shape
        ng = so.shape[-2]; sb = 2 * ng; rec = 2 * (cb + sb)
        buf = torch.empty(rows, h, rec, dtype=torch.uint8, device=c.device)
        cv = buf[..., :2 * cb].unflatten(-1, (2, cb)).transpose(1, 2)
        sv = buf[..., 2 * cb:].unflatten(-1, (2, ng, 2)).transpose(1, 2)
        cv.copy_(c); sv.copy_(so)
        assert cv.shape == c.shape and sv.shape == so.shape
        codes.append(cv); sos.append(sv)
    return dataclasses.replace(view, codes=codes, scale_offset=sos)
