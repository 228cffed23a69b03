"""Byte accounting and the per-token layout of the compressed KV cache.

This module is the single owner of the bytes-per-token arithmetic and of the model's KV shape.
The pool allocates its buffers from `loop_segments`, SGLang's cell size is `kv_bytes_per_token`,
the CLI (`sglang-rq kv-size`) and the Prometheus gauges print the same numbers. The shape is
read from a config only by `ModelKVShape.from_hf_config` / `from_model_config`; the (loop, layer)
slot mapping is `kv_slot` / `loop_and_layer`; the staging size is `staging_tokens`. No SGLang
import: the plugin passes SGLang's objects and sizes in.

Per (token, physical layer, K-or-V, KV head) and loop ``i`` stored with ``b`` bits in groups of
``g`` along ``head_dim = D`` (DESIGN.md section 1, "Bit accounting"):

* integer codes: ``D * b / 8`` bytes,
* FP8 scale + FP8 offset per group: ``2 * D / g`` bytes,
* BF16 least-squares coefficient ``c_i`` (residual loops with LSQ on): 2 bytes,
* a 16-bit loop stores ``2 * D`` bytes and nothing else; a 0-bit loop stores only ``c_i``.

Ouro-1.4B (24 layers, 4 loops, 16 KV heads, D = 128, g = 32, anchor INT4, residuals INT2):
anchor 64 + 8 = 72 B, residual 32 + 8 + 2 = 42 B, all loops 72 + 3*42 = 198 B,
per token 198 * 2 * 16 * 24 = 152,064 B versus 4 * 2 * 16 * 24 * 128 * 2 = 786,432 B in BF16.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_rq.config import ROTATION_CHOICES, RQConfig, RQConfigError

FP8_BYTES = 1
BF16_BYTES = 2


def recurrences_error(hf: Mapping[str, Any] | None, recurrences: int, model: str) -> str | None:
    """Why ``--rq-recurrences`` ``recurrences`` cannot apply to the model ``model`` whose
    ``config.json`` is ``hf`` (None where not local), or None where it can: a count outside
    1 .. `MAX_LOOPS`, or a model that is not Huginn (`HUGINN_MODEL_TYPE`)."""
    if not 1 <= recurrences <= MAX_LOOPS:
        return f"--rq-recurrences={recurrences} must be in 1 .. {MAX_LOOPS}"
    if hf is not None and hf.get("model_type") != HUGINN_MODEL_TYPE:
        return (f"--rq-recurrences applies to Huginn recurrent-depth models (model_type "
                f"{HUGINN_MODEL_TYPE!r}); {model} is {hf.get('model_type')!r}")
    return None


def _config_file(path: str | Path) -> Path:
    """``path`` itself, or the ``config.json`` in it where it is a directory."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


@dataclass(frozen=True)
class ModelKVShape:
    """The KV shape of a (looped) model.

    Attributes: ``num_layers`` looped physical layers (Ouro: all of them; Huginn: the core
    blocks), ``num_loops`` loops (recurrences) of that stack (1 for a plain model),
    ``num_kv_heads`` KV heads (on this rank), ``head_dim`` elements per head,
    ``prelude_layers`` / ``coda_layers`` un-looped layers run once per token before / after the
    looped stack (Huginn's prelude and coda; 0 for Ouro), ``default_loop_group`` loops per
    anchor group when ``--rq-loop-group-size`` is unset (None: one group of every loop).

    SGLang's KV layers ("slots", one ``RadixAttention`` each) are laid out prelude first, then
    the looped stack loop-major, then the coda (`slot_places`); ``num_slots`` counts them.
    """

    num_layers: int
    num_loops: int
    num_kv_heads: int
    head_dim: int
    prelude_layers: int = 0
    coda_layers: int = 0
    default_loop_group: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_loops", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelKVShape.{name} must be >= 1, got {getattr(self, name)}")
        if self.prelude_layers < 0 or self.coda_layers < 0:
            raise ValueError(f"ModelKVShape prelude/coda layers must be >= 0, got "
                             f"{self.prelude_layers}/{self.coda_layers}")

    @property
    def unlooped_layers(self) -> int:
        """Layers run once per token (prelude + coda)."""
        return self.prelude_layers + self.coda_layers

    @property
    def num_slots(self) -> int:
        """SGLang's KV layer count: ``prelude + num_layers * num_loops + coda``."""
        return self.num_layers * self.num_loops + self.unlooped_layers

    @property
    def elements_per_token(self) -> int:
        """K and V elements per token over all slots (layers x loops, and un-looped layers)."""
        return 2 * self.num_slots * self.num_kv_heads * self.head_dim

    @property
    def looped(self) -> ModelKVShape:
        """The looped stack alone (no prelude/coda)."""
        return ModelKVShape(self.num_layers, self.num_loops, self.num_kv_heads, self.head_dim,
                            default_loop_group=self.default_loop_group)

    def slot_places(self) -> tuple[SlotPlace, ...]:
        """Where every SGLang KV slot ``0..num_slots-1`` is stored, in slot order (`kv_slot`)."""
        pre = [SlotPlace("unlooped", 0, p, p) for p in range(self.prelude_layers)]
        core = [SlotPlace("looped", loop, layer, self.prelude_layers + layer)
                for loop in range(self.num_loops) for layer in range(self.num_layers)]
        coda = [SlotPlace("unlooped", 0, self.prelude_layers + c,
                          self.prelude_layers + self.num_layers + c)
                for c in range(self.coda_layers)]
        return tuple(pre + core + coda)

    @staticmethod
    def read_hf_config(path: str | Path) -> Mapping[str, Any]:
        """The JSON object of a ``config.json`` file, or of the one in directory ``path``.

        Raises
        ------
        RQConfigError
            If the file cannot be read, is not JSON, or is not a JSON object (names the file).
        """
        where = f"--model-config={_config_file(path)}"
        try:
            hf = json.loads(_config_file(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RQConfigError(f"{where}: cannot read a JSON config ({exc})") from exc
        if not isinstance(hf, Mapping):
            raise RQConfigError(f"{where}: the config is a JSON {type(hf).__name__}, not an "
                                "object")
        return hf

    @classmethod
    def from_hf_config(cls, path_or_dict: str | Path | Mapping[str, Any], *,
                       tp_size: int = 1) -> ModelKVShape:
        """The shape from a Hugging Face ``config.json`` (Ouro, Llama-family, Nanbeige/LoopCoder
        loops, Huginn ``huginn_raven``), with the KV heads of one of ``tp_size`` ranks.

        Parameters
        ----------
        path_or_dict
            A ``config.json`` file, the model directory holding it, or the parsed dict.
        tp_size
            Attention tensor-parallel ranks the KV heads are split over.

        Raises
        ------
        RQConfigError
            If the file is missing, is not a JSON object, lacks a field, or a count field
            (`COUNT_FIELDS`) is not a positive integer (names the file and field), a loop
            count is above `MAX_LOOPS`, the KV
            heads do not divide the query heads, or ``tp_size`` does not divide the KV heads.
        """
        where = "config"
        if isinstance(path_or_dict, Mapping):
            hf = path_or_dict
        else:
            where = f"--model-config={_config_file(path_or_dict)}"
            hf = cls.read_hf_config(path_or_dict)
        for key in (*COUNT_FIELDS, *HUGINN_UNLOOPED_FIELDS):
            value, least = hf.get(key), 0 if key in HUGINN_UNLOOPED_FIELDS else 1
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, numbers.Integral)
                                      or value < least):
                kind = "a positive" if least else "a non-negative"
                raise RQConfigError(f"{where}: field '{key}' must be {kind} integer, got "
                                    f"{value!r}")
            if key in (*LOOP_COUNT_FIELDS, "mean_recurrence") and value is not None \
                    and value > MAX_LOOPS:
                raise RQConfigError(f"{where}: field '{key}' ({value}) is above {MAX_LOOPS} "
                                    "loops per token (config.json, --json-model-override-args "
                                    "or --rq-recurrences)")
        try:
            if hf.get("model_type") == HUGINN_MODEL_TYPE:
                return _huginn_shape(hf.get, tp_size)
            heads = hf["num_attention_heads"]
            total_kv = hf.get("num_key_value_heads") or heads
            if heads % total_kv:  # SGLang refuses such a model at load
                raise RQConfigError(f"{where}: field 'num_key_value_heads' ({total_kv}) must "
                                    f"divide 'num_attention_heads' ({heads}): each KV head "
                                    "serves a whole group of query heads")
            return cls(num_layers=hf["num_hidden_layers"], num_loops=_num_loops(hf.get),
                       num_kv_heads=_heads_per_rank(total_kv, tp_size),
                       head_dim=hf.get("head_dim") or hf["hidden_size"] // heads)
        except KeyError as exc:
            raise RQConfigError(f"{where}: missing field {exc}") from exc
        except ValueError as exc:  # ModelKVShape's own checks (e.g. hidden_size < heads)
            raise RQConfigError(f"{where}: {exc}") from exc

    @classmethod
    def from_model_config(cls, model_config: Any, *, tp_size: int) -> ModelKVShape:
        """The shape on one rank from SGLang's ``ModelConfig`` (no SGLang import here: the
        plugin passes the attention tensor-parallel size ``tp_size``).

        Raises
        ------
        RQConfigError
            When ``tp_size`` does not divide the model's KV heads (SGLang would replicate
            heads, which the per-rank rotation and byte accounting do not model).
        """
        hf = model_config.hf_config
        _heads_per_rank(model_config.get_total_num_kv_heads(), tp_size)
        if getattr(hf, "model_type", None) == HUGINN_MODEL_TYPE:
            return _huginn_shape(lambda key: getattr(hf, key, None), tp_size)
        return cls(num_layers=hf.num_hidden_layers,
                   num_loops=_num_loops(lambda key: getattr(hf, key, None)),
                   num_kv_heads=model_config.get_num_kv_heads(tp_size),
                   head_dim=model_config.head_dim)


HUGINN_MODEL_TYPE = "huginn_raven"
HUGINN_LOOP_GROUP = 4
"""Recurrences per anchor group for Huginn by default (DESIGN.md section 2: 32 recurrences in 8
groups of 4), so staging holds at most 3 earlier recurrences of a core layer."""


def _huginn_shape(lookup: Callable[[str], Any], tp_size: int) -> ModelKVShape:
    """Huginn (arXiv 2502.05171): prelude / core x ``mean_recurrence`` / coda, MHA."""
    def need(key: str) -> Any:
        if lookup(key) is None:
            raise KeyError(key)
        return lookup(key)

    heads, r = int(need("n_heads")), int(need("mean_recurrence"))
    return ModelKVShape(
        num_layers=int(need("n_layers_in_recurrent_block")), num_loops=r,
        num_kv_heads=_heads_per_rank(heads, tp_size), head_dim=int(need("n_embd")) // heads,
        prelude_layers=int(need("n_layers_in_prelude")), coda_layers=int(need("n_layers_in_coda")),
        default_loop_group=HUGINN_LOOP_GROUP if r % HUGINN_LOOP_GROUP == 0 else None)


@dataclass(frozen=True)
class SlotPlace:
    """Where one SGLang KV slot is stored: ``stack`` (``looped`` or ``unlooped``), ``loop`` in
    that stack (0 for un-looped), ``layer`` index in that stack, ``block`` the physical layer
    (prelude, looped stack, coda in order; the ``layer`` label of per-layer metrics)."""

    stack: str
    loop: int
    layer: int
    block: int


LOOP_COUNT_FIELDS = ("total_ut_steps", "num_loops", "loop_num")
"""Config fields that count loops: Ouro, Nanbeige (and SGLang's alias), IQuest LoopCoder."""

COUNT_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "hidden_size", *LOOP_COUNT_FIELDS, "n_heads", "n_embd", "mean_recurrence",
                "n_layers_in_recurrent_block")
"""Fields of a ``config.json`` that must be positive integers where present (a 0, 2.5,
``true`` or "4" is refused, not read as another model)."""

MAX_LOOPS = 1024
"""The most loops (Huginn: recurrences) a model may run per token: 32x Huginn-3.5B's published
``mean_recurrence`` of 32. Each loop is a KV slot per token, and the pool's slot tables are built
per loop before the model loads: a review's 10^8 recurrences grew memory for minutes at start-up
(10^6 took 2.7 s and 236 MiB)."""

HUGINN_UNLOOPED_FIELDS = ("n_layers_in_prelude", "n_layers_in_coda")
"""Huginn's un-looped layer counts: integers, 0 allowed."""


def _num_loops(lookup: Callable[[str], Any]) -> int:
    for key in LOOP_COUNT_FIELDS:
        if lookup(key):
            return int(lookup(key))
    return 1


def _heads_per_rank(total_kv_heads: int, tp_size: int) -> int:
    if tp_size < 1 or total_kv_heads % tp_size:
        raise RQConfigError(f"--tp-size {tp_size} does not divide the model's {total_kv_heads} KV "
                            "heads; the ResidualQuant pool shards KV heads across ranks (or pass "
                            "--rq-disable)")
    return total_kv_heads // tp_size


def kv_slot(loop_id: int, layer_id: int, num_layers: int) -> int:
    """SGLang's ``layer_id`` of KV slot ``(loop_id, layer_id)``: loops outer, layers inner."""
    return loop_id * num_layers + layer_id


def loop_and_layer(slot: int, num_layers: int) -> tuple[int, int]:
    """Inverse of `kv_slot`: ``(loop_id, layer_id)`` of SGLang's ``layer_id`` ``slot``."""
    return divmod(slot, num_layers)


DEFAULT_MAX_RUNNING_REQUESTS = 4096
"""Decode batch assumed for staging when ``--max-running-requests`` is unset (SGLang derives it
from the pool later, after the staging buffer is sized)."""


def staging_tokens(*, chunked_prefill_size: int | None, max_prefill_tokens: int,
                   max_running_requests: int | None, enable_mixed_chunk: bool) -> int:
    """Tokens one forward can carry, the size of the BF16 staging buffer: the largest prefill
    chunk or decode batch, plus the decode batch when chunks are mixed with decodes.

    Parameters are SGLang's server flags of the same names; ``chunked_prefill_size`` unset or
    ``<= 0`` means chunks of ``max_prefill_tokens``, ``max_running_requests`` unset means
    `DEFAULT_MAX_RUNNING_REQUESTS`.
    """
    chunk = chunked_prefill_size or 0
    if chunk <= 0:
        chunk = max_prefill_tokens
    running = max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS
    return max(chunk, running) + (running if enable_mixed_chunk else 0)


@dataclass(frozen=True)
class LoopSegment:
    """How one loop is stored, per (token, physical layer, K-or-V, KV head).

    ``role`` is ``anchor`` (stored on its own, ``bits`` in 1..16), ``residual`` (stored as
    ``c * base + R^T deq(r')`` against loop ``base``), ``shared`` (0 bits: ``c * base``).
    ``code_bytes``, ``scale_offset_bytes`` (FP8 scale+offset), ``coef_bytes`` (BF16 c) are bytes.
    """

    loop_id: int
    role: str
    bits: int
    base: int
    code_bytes: int
    scale_offset_bytes: int
    coef_bytes: int

    @property
    def nbytes(self) -> int:
        """Bytes of this loop per (token, layer, K-or-V, head)."""
        return self.code_bytes + self.scale_offset_bytes + self.coef_bytes

    @property
    def is_quantized(self) -> bool:
        """True if the loop has integer codes with FP8 scale/offset (1..8 bits)."""
        return 0 < self.bits < 16


def loop_segments(shape: ModelKVShape, cfg: RQConfig) -> tuple[LoopSegment, ...]:
    """Storage of every loop of ``shape`` under ``cfg``, ordered by loop id.

    Raises
    ------
    RQConfigError
        If the group size does not divide head_dim, or the loop bits / loop groups do not fit
        the model (messages name the ``--rq-*`` flag).
    """
    d, g = shape.head_dim, cfg.group_size
    if d % g != 0:
        fits = [s for s in (16, 32, 64) if d % s == 0]
        raise RQConfigError(
            f"--rq-group-size={g} does not divide the model's head_dim={d}; "
            + (f"choose a group size in {fits}" if fits else
               "no supported group size (16, 32, 64) does; serve it with --rq-disable")
        )
    bits = cfg.bits_for_loops(shape.num_loops)
    segs = []
    for loop_id, b in enumerate(bits):
        base = cfg.anchor_of(loop_id, shape.num_loops)
        role = "anchor" if base == loop_id else ("shared" if b == 0 else "residual")
        if b == 16:
            code, scale_offset = BF16_BYTES * d, 0
        else:
            if (d * b) % 8 != 0:
                raise RQConfigError(f"head_dim={d} x {b} bits is not a whole number of bytes")
            code, scale_offset = d * b // 8, (2 * FP8_BYTES * d // g if b > 0 else 0)
        coef = BF16_BYTES if (role != "anchor" and cfg.lsq) else 0
        segs.append(LoopSegment(loop_id, role, b, base, code, scale_offset, coef))
    return tuple(segs)


STACK_NAMES = ("looped", "unlooped")


def stack_label_prefix(name: str) -> str:
    """Prefix of a stack's path labels in logs and metrics: "" for ``looped``, ``unlooped_``
    for Huginn's prelude/coda (``sglang_rq_fallbacks_total{path="unlooped_decode"}``)."""
    return "" if name == "looped" else f"{name}_"


@dataclass(frozen=True)
class KVStack:
    """A part of the model stored with one format: ``name`` ``looped`` (the looped layers, in
    loop groups) or ``unlooped`` (prelude and coda: one loop, one anchor each), its ``shape``
    (no prelude/coda of its own) and ``cfg`` (loop group size resolved)."""

    name: str
    shape: ModelKVShape
    cfg: RQConfig

    @property
    def label_prefix(self) -> str:
        """`stack_label_prefix` of this stack."""
        return stack_label_prefix(self.name)

    @property
    def segments(self) -> tuple[LoopSegment, ...]:
        """`loop_segments` of this stack."""
        return loop_segments(self.shape, self.cfg)

    @property
    def bytes_per_token(self) -> int:
        """Compressed bytes of this stack per token (all its layers, loops, heads, K and V)."""
        per_head = sum(s.nbytes for s in self.segments)
        return per_head * 2 * self.shape.num_kv_heads * self.shape.num_layers


def kv_stacks(shape: ModelKVShape, cfg: RQConfig) -> tuple[KVStack, ...]:
    """The stacks of ``shape`` under an enabled ``cfg``: the looped layers, then (if the model
    has any) the un-looped prelude and coda layers.

    The looped stack takes ``cfg`` with ``loop_group_size`` resolved (``None`` becomes
    ``shape.default_loop_group``). The un-looped stack stores one loop of
    ``cfg.unlooped_bits``: BF16 without rotation at 16 bits, else a quantized anchor with the
    looped stack's group size and rotation kind (a rotation *file* covers the looped layers
    only, so the un-looped layers take ``hadamard``).

    Raises
    ------
    RQConfigError
        From `loop_segments` (group size, loop bits, loop groups that do not fit the model).
    """
    group = cfg.loop_group_size or shape.default_loop_group
    looped = KVStack("looped", shape.looped, dataclasses.replace(cfg, loop_group_size=group))
    looped.segments  # noqa: B018 (validates the format against the model)
    if not shape.unlooped_layers:
        return (looped,)
    ub = cfg.unlooped_bits
    rotation = "none" if ub == 16 else (cfg.rotation if cfg.rotation in ROTATION_CHOICES
                                        else "hadamard")
    ucfg = dataclasses.replace(cfg, anchor_bits=ub, loop_bits=None, loop_group_size=None,
                               anchor="last", rotation=rotation, rotate_anchor=True)
    unlooped = KVStack("unlooped", ModelKVShape(shape.unlooped_layers, 1, shape.num_kv_heads,
                                                shape.head_dim), ucfg)
    unlooped.segments  # noqa: B018
    return (looped, unlooped)


def looped_format(shape: ModelKVShape, cfg: RQConfig) -> RQConfig:
    """The looped layers' format under an enabled ``cfg``: ``cfg`` with the loop group size
    resolved (`kv_stacks`; raises as it does)."""
    return kv_stacks(shape, cfg)[0].cfg


def kv_bytes_per_token(shape: ModelKVShape, cfg: RQConfig) -> int:
    """Bytes of KV cache per token for the whole model (all slots, heads, K and V).

    This is SGLang's ``cell_size`` with the RQ pool; with ``cfg.enabled == False`` it is the
    BF16 figure. Ouro-1.4B at the default format: 152,064. Huginn-3.5B (R = 32, groups of 4,
    BF16 prelude/coda): 528,000 + 84,480 = 612,480 (BF16: 2,787,840).
    """
    if not cfg.enabled:
        return bf16_bytes_per_token(shape)
    return sum(st.bytes_per_token for st in kv_stacks(shape, cfg))


def bf16_bytes_per_token(shape: ModelKVShape) -> int:
    """Bytes per token of a plain BF16 cache with one slot per (loop, layer)."""
    return shape.elements_per_token * BF16_BYTES


def effective_bits(shape: ModelKVShape, cfg: RQConfig) -> float:
    """Average stored bits per K/V element, all metadata included (3.094 for Ouro default)."""
    return kv_bytes_per_token(shape, cfg) * 8 / shape.elements_per_token


def staged_loops(shape: ModelKVShape, cfg: RQConfig) -> int:
    """Loops of a looped layer held in BF16 staging until the last loop of their group commits
    them (the un-looped layers commit at once)."""
    if not cfg.enabled:
        return 0
    return looped_format(shape, cfg).group_len(shape.num_loops) - 1


def staging_bytes(shape: ModelKVShape, cfg: RQConfig, *, staging_tokens: int,
                  dtype_bytes: int = BF16_BYTES) -> int:
    """Fixed bytes of the staging buffer for ``staging_tokens`` in-flight tokens per forward.

    Layout ``[staged_loops, num_layers, staging_tokens, 2, num_kv_heads, head_dim]`` (looped
    layers only).
    """
    return (staged_loops(shape, cfg) * shape.num_layers * staging_tokens * 2
            * shape.num_kv_heads * shape.head_dim * dtype_bytes)


def rotation_bytes(shape: ModelKVShape, cfg: RQConfig) -> int:
    """Fixed bytes of the fp32 rotation matrices ``[layers, num_kv_heads, D, D]`` of every
    stack that rotates."""
    if not cfg.enabled:
        return 0
    return sum(st.shape.num_layers * st.shape.num_kv_heads * st.shape.head_dim ** 2 * 4
               for st in kv_stacks(shape, cfg) if st.cfg.rotation != "none")


def fixed_bytes(shape: ModelKVShape, cfg: RQConfig, *, staging_tokens: int,
                dtype_bytes: int = BF16_BYTES) -> int:
    """The pool's bytes that do not grow with its tokens: `staging_bytes` (staging in
    ``dtype_bytes``) plus `rotation_bytes`."""
    return (staging_bytes(shape, cfg, staging_tokens=staging_tokens, dtype_bytes=dtype_bytes)
            + rotation_bytes(shape, cfg))


def tokens_in_budget(shape: ModelKVShape, cfg: RQConfig, *, budget_bytes: int,
                     staging_tokens: int = 0) -> int:
    """Token slots that fit in ``budget_bytes`` after the fixed staging and rotation bytes."""
    fixed = fixed_bytes(shape, cfg, staging_tokens=staging_tokens)
    return max(0, (budget_bytes - fixed) // kv_bytes_per_token(shape, cfg))


def decode_read_bytes_per_token(shape: ModelKVShape, cfg: RQConfig) -> int:
    """Bytes one decode step reads per history token (all slots, heads, K and V).

    Loop i reads its own segment plus, transitively, its base's (414 B per token-head-K/V
    for the Ouro default versus 1024 in BF16).
    """
    if not cfg.enabled:
        return bf16_bytes_per_token(shape)
    total = 0
    for st in kv_stacks(shape, cfg):
        segs = st.segments
        per_head = sum(loop_read_nbytes(segs, s.loop_id) for s in segs)
        total += per_head * 2 * st.shape.num_kv_heads * st.shape.num_layers
    return total


def loop_read_nbytes(segments: tuple[LoopSegment, ...], loop_id: int) -> int:
    """Bytes the decode attention of loop ``loop_id`` reads per (token, layer, K-or-V, KV head)
    from ``segments`` (`loop_segments`): its own segment plus, transitively, its base's (Ouro
    default: a residual loop 42 + 72 = 114 B, the anchor loop 72 B)."""
    loop = segments[loop_id]
    n = loop.nbytes
    while loop.base != loop.loop_id:
        loop = segments[loop.base]
        n += loop.nbytes
    return n
