"""Huginn recurrent-depth models (arXiv 2502.05171, ``RavenForCausalLM``) for SGLang 0.5.23.

P prelude blocks run once, a core of C blocks runs R times (``config.mean_recurrence``), K coda
blocks run once; every (block, recurrence) has its own `RadixAttention`, so SGLang's pool holds
``P + C * R + K`` KV slots (``config.num_hidden_layers``). Slot layout (`HuginnConfig.kv_slot`)::

    prelude block p            -> layer_id p
    core block b, recurrence r -> layer_id P + r * C + b
    coda block c               -> layer_id P + R * C + c

Forward (the same as `sglang_rq.models.huginn_reference`, which documents the upstream facts)::

    e = prelude(wte(ids) * sqrt(H));  s = 0
    R times: s = core(adapter(cat[s, e]))
    logits = lm_head(ln_f(coda(ln_f(s))))       # tied to wte

The initial state is zeros (deterministic; upstream draws it at random), so a cached prefix's
K/V equals a recompute. Parameter names are upstream's; ``attn.Wqkv`` and ``mlp.fc`` are split
into SGLang's fused-linear shards by `RavenForCausalLM.load_weights`.

With the ResidualQuant pool the slots are stored per `sglang_rq.layout.ModelKVShape.slot_places`
(the same layout, read from the config by `ModelKVShape.from_model_config`): the core's
recurrences as a looped stack in loop groups of 4 with their own anchors, the prelude and coda as
un-looped layers (``--rq-unlooped-bits``, BF16 by default).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.runtime_context import get_parallel
from sglang.srt.utils import add_prefix


class HuginnMLP(nn.Module):
    """Gated MLP ``proj(silu(a) * g)``, ``[a, g] = fc(x)``; ``[num_tokens, hidden]``."""

    def __init__(self, config, quant_config: QuantizationConfig | None, prefix: str) -> None:
        super().__init__()
        self.fc = MergedColumnParallelLinear(
            config.n_embd, [config.intermediate_size] * 2, bias=False,
            quant_config=quant_config, prefix=add_prefix("fc", prefix))
        self.proj = RowParallelLinear(
            config.intermediate_size, config.n_embd, bias=False,
            quant_config=quant_config, prefix=add_prefix("proj", prefix))
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ag, _ = self.fc(x)
        out, _ = self.proj(self.act_fn(ag))
        return out


class HuginnAttention(nn.Module):
    """MHA with ``qk_bias`` (added before RoPE) and GPT-J RoPE; one `RadixAttention` per slot.

    ``slots`` lists the KV slots (SGLang ``layer_id``) of this block, indexed by recurrence
    (a single slot for prelude and coda blocks).
    """

    def __init__(self, config, slots: list[int], quant_config: QuantizationConfig | None,
                 prefix: str) -> None:
        super().__init__()
        tp_size, tp_rank = get_parallel().tp_size, get_parallel().tp_rank
        if config.n_heads % tp_size:
            raise ValueError(f"n_heads={config.n_heads} does not split over tp_size={tp_size}")
        self.head_dim = config.head_dim
        self.num_heads = config.n_heads // tp_size
        self.q_size = self.num_heads * self.head_dim
        self.Wqkv = QKVParallelLinear(
            config.n_embd, self.head_dim, config.n_heads, config.n_heads, bias=False,
            quant_config=quant_config, prefix=add_prefix("Wqkv", prefix))
        self.proj = RowParallelLinear(
            config.n_embd, config.n_embd, bias=False,
            quant_config=quant_config, prefix=add_prefix("proj", prefix))
        if config.qk_bias:
            # upstream [2, 1, n_heads, head_dim] -> this rank's heads, flat: [2, q_size]
            self.qk_bias = nn.Parameter(torch.zeros(2, self.q_size), requires_grad=False)
            lo = tp_rank * self.q_size
            self.qk_bias.weight_loader = lambda p, w: p.data.copy_(
                w.reshape(2, -1)[:, lo:lo + self.q_size])
        else:
            self.qk_bias = None
        self.rotary_emb = get_rope(self.head_dim, rotary_dim=self.head_dim,
                                   max_position=config.block_size, base=config.rope_base,
                                   is_neox_style=False)
        self.attn = nn.ModuleList(
            RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5,
                           num_kv_heads=self.num_heads, layer_id=slot, quant_config=quant_config,
                           prefix=add_prefix(f"attn.{i}", prefix))
            for i, slot in enumerate(slots))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                forward_batch: ForwardBatch, step: int) -> torch.Tensor:
        qkv, _ = self.Wqkv(hidden)  # [num_tokens, 3 * q_size]
        q, k, v = qkv.split([self.q_size] * 3, dim=-1)
        if self.qk_bias is not None:
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        q, k = self.rotary_emb(positions, q, k)
        out, _ = self.proj(self.attn[step](q, k, v, forward_batch))
        return out


class HuginnBlock(nn.Module):
    """Upstream ``SandwichBlock``: ``x = norm_2(attn(norm_1(x)) + x)``,
    ``x = norm_4(mlp(norm_3(x)) + x)``."""

    def __init__(self, config, slots: list[int], quant_config: QuantizationConfig | None,
                 prefix: str) -> None:
        super().__init__()
        self.attn = HuginnAttention(config, slots, quant_config, add_prefix("attn", prefix))
        self.mlp = HuginnMLP(config, quant_config, add_prefix("mlp", prefix))
        h, eps = config.n_embd, config.norm_eps
        self.norm_1, self.norm_2 = RMSNorm(h, eps=eps), RMSNorm(h, eps=eps)
        self.norm_3, self.norm_4 = RMSNorm(h, eps=eps), RMSNorm(h, eps=eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, forward_batch: ForwardBatch,
                step: int = 0) -> torch.Tensor:
        x = self.norm_2(self.attn(positions, self.norm_1(x), forward_batch, step) + x)
        return self.norm_4(self.mlp(self.norm_3(x)) + x)


class HuginnModel(nn.Module):
    """The upstream ``transformer`` module: ``wte``, ``prelude``, ``adapter``, ``core_block``,
    ``coda``, ``ln_f``."""

    def __init__(self, config, quant_config: QuantizationConfig | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        self.config = c = config
        self.wte = VocabParallelEmbedding(c.vocab_size, c.n_embd, prefix=add_prefix("wte", prefix))
        self.prelude = nn.ModuleList(
            HuginnBlock(c, [c.kv_slot("prelude", i)], quant_config, add_prefix(f"prelude.{i}", prefix))
            for i in range(c.n_layers_in_prelude))
        self.adapter = ReplicatedLinear(2 * c.n_embd, c.n_embd, bias=c.bias,
                                        prefix=add_prefix("adapter", prefix))
        self.core_block = nn.ModuleList(
            HuginnBlock(c, [c.kv_slot("core", b, r) for r in range(c.num_recurrences)],
                        quant_config, add_prefix(f"core_block.{b}", prefix))
            for b in range(c.n_layers_in_recurrent_block))
        self.coda = nn.ModuleList(
            HuginnBlock(c, [c.kv_slot("coda", i)], quant_config, add_prefix(f"coda.{i}", prefix))
            for i in range(c.n_layers_in_coda))
        self.ln_f = RMSNorm(c.n_embd, eps=c.norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Final normed hidden states ``[num_tokens, hidden]``."""
        e = self.wte(input_ids) if input_embeds is None else input_embeds
        e = e * self.config.embed_scale
        for block in self.prelude:
            e = block(positions, e, forward_batch)
        s = torch.zeros_like(e)  # deterministic initial state (upstream: random)
        for r in range(self.config.num_recurrences):
            s, _ = self.adapter(torch.cat([s, e], dim=-1))
            for block in self.core_block:
                s = block(positions, s, forward_batch, r)
        x = self.ln_f(s)
        for block in self.coda:
            x = block(positions, x, forward_batch)
        return self.ln_f(x)


class RavenForCausalLM(nn.Module):
    """SGLang entry class for ``architectures: ["RavenForCausalLM"]`` (Huginn)."""

    # Upstream fused tensors -> the shard ids of SGLang's fused linears, in checkpoint order.
    _SPLIT = {"attn.Wqkv.weight": ("q", "k", "v"), "mlp.fc.weight": (0, 1)}
    # Checkpoint tensors with no parameter: the persistent RoPE table (recomputed by get_rope).
    _IGNORED = ("freqs_cis",)

    def __init__(self, config, quant_config: QuantizationConfig | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.transformer = HuginnModel(config, quant_config, add_prefix("transformer", prefix))
        if config.tie_embeddings:
            self.lm_head = self.transformer.wte
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.n_embd,
                                          prefix=add_prefix("lm_head", prefix))
        self.logits_processor = LogitsProcessor(config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None,
                get_embedding: bool = False):
        hidden = self.transformer(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load upstream names (``transformer.core_block.0.attn.Wqkv.weight`` ...).

        Raises
        ------
        ValueError
            On an unknown tensor name or a parameter left unloaded.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, w in weights:
            if name in self._IGNORED or (self.config.tie_embeddings and name == "lm_head.weight"):
                continue
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter in RavenForCausalLM")
            p = params[name]
            split = next((s for suffix, s in self._SPLIT.items() if name.endswith(suffix)), None)
            if split is None:
                getattr(p, "weight_loader", default_weight_loader)(p, w)
            else:
                for shard, part in zip(split, w.chunk(len(split), dim=0)):
                    p.weight_loader(p, part, shard)
            loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint is missing {sorted(missing)[:5]} ({len(missing)} in all)")


EntryClass = [RavenForCausalLM]
