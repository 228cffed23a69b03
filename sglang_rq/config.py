"""The KV-cache format: one frozen, validated configuration object.

`RQConfig` describes *how* K/V are stored (bits per loop, group size, anchor choice,
least-squares scaling, rotation). It is independent of the model; `layout.py` combines it
with a model's KV shape (layers, loops, heads, head_dim) into byte sizes.

Conversion from the command line (`--rq-*` flags) and from the JSON that the launcher
hands to SGLang's child processes happens only here.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from dataclasses import dataclass

from sglang_rq.cli_values import seed_error

#: Bit widths a loop may be stored with. 0: the loop shares the anchor (x̂ = c·â),
#: 16: the loop is kept in BF16, 1/2/4/8: asymmetric integer codes in groups.
SUPPORTED_BITS = (0, 1, 2, 4, 8, 16)
SUPPORTED_GROUP_SIZES = (16, 32, 64)
ANCHOR_CHOICES = ("last", "first", "chained")
ROTATION_CHOICES = ("none", "hadamard", "signed-hadamard")
#: Bit widths of un-looped layers (one stored vector per layer: BF16 or a quantized anchor).
UNLOOPED_BITS = (2, 4, 8, 16)


class RQConfigError(ValueError):
    """A KV-format option (or a combination of options) is invalid; the message names the flag."""


@dataclass(frozen=True)
class RQConfig:
    """ResidualQuant KV-cache format (DESIGN.md section 1).

    Attributes
    ----------
    enabled:
        False selects SGLang's plain BF16 pool and attention backend (A/B runs, same binary).
        Flag: ``--rq-disable``.
    anchor_bits:
        Bits of the anchor loop of every loop group (``--rq-anchor-bits``, default 4).
    residual_bits:
        Bits of every non-anchor loop (``--rq-residual-bits``, default 2). 0 means the loop
        shares the anchor (reconstructed as ``c * anchor``), 16 keeps it in BF16.
    loop_bits:
        Optional explicit bits for every loop, overriding the two fields above
        (``--rq-loop-bits 2,2,2,4``). Its length must equal the model's loop count; the
        anchor loop's entry must be 1, 2, 4, 8 or 16.
    group_size:
        Elements per quantization group along head_dim (``--rq-group-size``: 16, 32 or 64;
        must divide head_dim).
    anchor:
        ``last`` (the paper: last loop of each group is the anchor), ``first`` (first loop is
        the anchor) or ``chained`` (FlashLoop-style: first loop is the base, loop i is a
        residual against the reconstruction of loop i-1). Flag ``--rq-anchor``.
    lsq:
        Least-squares scaling ``c_i = <x_i, â> / <â, â>`` (``--rq-no-lsq`` sets c = 1).
    rotation:
        ``none``, ``hadamard`` (normalised Sylvester/Paley Hadamard), ``signed-hadamard``
        (Hadamard with a seeded random ±1 diagonal) or a path to a ``.safetensors`` file with
        a ``rotation`` tensor ``[num_layers, num_kv_heads, head_dim, head_dim]`` (``--rq-rotation``).
    rotation_seed:
        Seed of the ±1 diagonal of ``signed-hadamard`` (``--rq-rotation-seed``).
    rotate_anchor:
        Quantize the anchor in the rotated basis too (``--rq-rotate-anchor`` /
        ``--no-rq-rotate-anchor``, default on).
    loop_group_size:
        Loops per anchor group (``--rq-loop-group-size``); ``None`` means the model's default
        (`layout.ModelKVShape.default_loop_group`): one group holding every loop for Ouro,
        groups of 4 for Huginn's recurrences (8 anchors at R = 32).
    unlooped_bits:
        Bits of the un-looped layers of a model that has them (Huginn's prelude and coda, run
        once per token; ``--rq-unlooped-bits``): 16 keeps them in BF16 (default), 2/4/8 stores
        one quantized anchor per layer (no residuals).
    prescale:
        Store K/V of a layer whose norms exceed the FP8 scale/offset range divided by a
        per-head power of two, calibrated on its first prefill (`sglang_rq.prescale`;
        ``--rq-no-prescale`` turns it off).
    """

    enabled: bool = True
    anchor_bits: int = 4
    residual_bits: int = 2
    loop_bits: tuple[int, ...] | None = None
    group_size: int = 32
    anchor: str = "last"
    lsq: bool = True
    rotation: str = "hadamard"
    rotation_seed: int = 0
    rotate_anchor: bool = True
    loop_group_size: int | None = None
    unlooped_bits: int = 16
    prescale: bool = True

    def __post_init__(self) -> None:
        if self.anchor_bits not in SUPPORTED_BITS or self.anchor_bits == 0:
            raise RQConfigError(
                f"--rq-anchor-bits={self.anchor_bits} is not supported; choose one of 1, 2, 4, 8, 16"
            )
        if self.residual_bits not in SUPPORTED_BITS:
            raise RQConfigError(
                f"--rq-residual-bits={self.residual_bits} is not supported; "
                f"choose one of {', '.join(map(str, SUPPORTED_BITS))}"
            )
        if self.loop_bits is not None:
            bad = [b for b in self.loop_bits if b not in SUPPORTED_BITS]
            if bad or not self.loop_bits:
                raise RQConfigError(
                    f"--rq-loop-bits={','.join(map(str, self.loop_bits))} has unsupported widths "
                    f"{bad}; each must be one of {', '.join(map(str, SUPPORTED_BITS))}"
                )
        if self.group_size not in SUPPORTED_GROUP_SIZES:
            raise RQConfigError(
                f"--rq-group-size={self.group_size} is not supported; choose one of "
                f"{', '.join(map(str, SUPPORTED_GROUP_SIZES))}"
            )
        if self.anchor not in ANCHOR_CHOICES:
            raise RQConfigError(
                f"--rq-anchor={self.anchor!r} is not supported; choose one of {', '.join(ANCHOR_CHOICES)}"
            )
        if self.rotation not in ROTATION_CHOICES and not self.rotation.endswith(".safetensors"):
            raise RQConfigError(
                f"--rq-rotation={self.rotation!r} is neither one of {', '.join(ROTATION_CHOICES)} "
                "nor a path to a .safetensors rotation file"
            )
        if self.loop_group_size is not None and self.loop_group_size < 1:
            raise RQConfigError(f"--rq-loop-group-size={self.loop_group_size} must be >= 1")
        if self.unlooped_bits not in UNLOOPED_BITS:
            raise RQConfigError(f"--rq-unlooped-bits={self.unlooped_bits} is not supported; choose "
                                f"one of {', '.join(map(str, UNLOOPED_BITS))}")
        if (err := seed_error("--rq-rotation-seed", self.rotation_seed)) is not None:
            raise RQConfigError(err)

    # ------------------------------------------------------------------ derived
    def bits_for_loops(self, num_loops: int) -> tuple[int, ...]:
        """Bits of each loop ``0..num_loops-1`` for a model with ``num_loops`` loops.

        Raises
        ------
        RQConfigError
            If ``--rq-loop-bits`` has the wrong length, an anchor loop gets 0 bits, or the loop
            group size does not divide the loop count.
        """
        group = self.group_len(num_loops)
        if self.loop_bits is not None:
            if len(self.loop_bits) != num_loops:
                raise RQConfigError(
                    f"--rq-loop-bits gives {len(self.loop_bits)} widths but the model runs "
                    f"{num_loops} loops"
                )
            bits = tuple(self.loop_bits)
        else:
            bits = tuple(
                self.anchor_bits if self.is_anchor(loop_id, num_loops) else self.residual_bits
                for loop_id in range(num_loops)
            )
        for loop_id, b in enumerate(bits):
            if self.is_anchor(loop_id, num_loops) and b == 0:
                raise RQConfigError(
                    f"loop {loop_id} is an anchor (group of {group}) and cannot have 0 bits "
                    "(--rq-loop-bits / --rq-anchor-bits)"
                )
        return bits

    def group_len(self, num_loops: int) -> int:
        """Loops per anchor group for a model with ``num_loops`` loops."""
        g = self.loop_group_size or num_loops
        if num_loops % g != 0:
            raise RQConfigError(
                f"--rq-loop-group-size={g} does not divide the model's {num_loops} loops"
            )
        return g

    def anchor_of(self, loop_id: int, num_loops: int) -> int:
        """The loop whose stored vector loop ``loop_id`` is reconstructed against.

        For ``last``/``first`` this is the group's anchor; for ``chained`` it is the previous
        loop (the group's first loop is its own base). An anchor returns itself.
        """
        g = self.group_len(num_loops)
        start = (loop_id // g) * g
        if self.anchor == "last":
            return start + g - 1
        if self.anchor == "first":
            return start
        return max(start, loop_id - 1)  # chained

    def is_anchor(self, loop_id: int, num_loops: int) -> bool:
        """True if ``loop_id`` is stored on its own (not as a residual)."""
        return self.anchor_of(loop_id, num_loops) == loop_id

    # ------------------------------------------------------------------ conversion
    def to_json(self) -> str:
        """Serialise for the launcher -> SGLang child process hand-off."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RQConfig:
        """Inverse of `to_json`. The one channel into SGLang's processes is ``SGLANG_RQ_CONFIG``
        (`sglang_rq.env`, set by the launcher); each process parses a given text once (the
        object is frozen, so callers share it)."""
        return _parse_json(text) if cls is RQConfig else _from_dict(cls, json.loads(text))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RQConfig:
        """Build from a namespace parsed with `add_cli_args`."""
        loop_bits = None
        if args.rq_loop_bits:
            try:
                loop_bits = tuple(int(b) for b in args.rq_loop_bits.split(","))
            except ValueError as exc:
                raise RQConfigError(
                    f"--rq-loop-bits={args.rq_loop_bits!r} must be comma-separated integers"
                ) from exc
        return cls(
            enabled=not args.rq_disable,
            anchor_bits=args.rq_anchor_bits,
            residual_bits=args.rq_residual_bits,
            loop_bits=loop_bits,
            group_size=args.rq_group_size,
            anchor=args.rq_anchor,
            lsq=not args.rq_no_lsq,
            rotation=args.rq_rotation,
            rotation_seed=args.rq_rotation_seed,
            rotate_anchor=args.rq_rotate_anchor,
            loop_group_size=args.rq_loop_group_size,
            unlooped_bits=args.rq_unlooped_bits,
            prescale=not args.rq_no_prescale,
        )

    def describe(self) -> str:
        """One-line human summary, used in logs and the metrics info gauge."""
        if not self.enabled:
            return "bf16 (ResidualQuant disabled)"
        bits = ",".join(map(str, self.loop_bits)) if self.loop_bits else (
            f"anchor={self.anchor_bits} residual={self.residual_bits}"
        )
        return (
            f"residualquant bits[{bits}] g={self.group_size} anchor={self.anchor} "
            f"lsq={'on' if self.lsq else 'off'} rotation={self.rotation}"
            f"{'' if self.rotate_anchor else ' (residuals only)'}"
            f"{'' if self.loop_group_size is None else f' loop_group={self.loop_group_size}'}"
            f"{'' if self.unlooped_bits == 16 else f' unlooped={self.unlooped_bits}'}"
        )


def _from_dict(cls: type[RQConfig], data: dict) -> RQConfig:
    if data.get("loop_bits") is not None:
        data["loop_bits"] = tuple(data["loop_bits"])
    return cls(**data)


@functools.lru_cache(maxsize=8)
def _parse_json(text: str) -> RQConfig:
    return _from_dict(RQConfig, json.loads(text))


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``--rq-*`` flags (defaults = the paper's configuration) to ``parser``."""
    d = RQConfig()
    g = parser.add_argument_group("ResidualQuant KV cache (sglang-rq)")
    g.add_argument("--rq-disable", action="store_true",
                   help="Use SGLang's plain BF16 KV pool and attention (A/B baseline).")
    g.add_argument("--rq-anchor-bits", type=int, default=d.anchor_bits,
                   help="Bits of each anchor loop (1/2/4/8/16). Default %(default)s.")
    g.add_argument("--rq-residual-bits", type=int, default=d.residual_bits,
                   help="Bits of each non-anchor loop (0 = share the anchor, 1/2/4/8, 16 = BF16). "
                        "Default %(default)s.")
    g.add_argument("--rq-loop-bits", type=str, default=None,
                   help="Explicit comma-separated bits per loop, e.g. 2,2,2,4 (overrides the two above).")
    g.add_argument("--rq-group-size", type=int, default=d.group_size,
                   help="Quantization group size along head_dim (16/32/64). Default %(default)s.")
    g.add_argument("--rq-anchor", choices=ANCHOR_CHOICES, default=d.anchor,
                   help="Anchor choice: last loop (paper), first loop, or chained residuals.")
    g.add_argument("--rq-no-lsq", action="store_true",
                   help="Disable least-squares scaling of residuals (c = 1).")
    g.add_argument("--rq-rotation", type=str, default=d.rotation,
                   help="none | hadamard | signed-hadamard | PATH.safetensors. Default %(default)s.")
    g.add_argument("--rq-rotation-seed", type=int, default=d.rotation_seed,
                   help="Seed of the random sign diagonal of signed-hadamard.")
    g.add_argument("--rq-rotate-anchor", action=argparse.BooleanOptionalAction,
                   default=d.rotate_anchor,
                   help="Quantize the anchor in the rotated basis too. Default on.")
    g.add_argument("--rq-loop-group-size", type=int, default=None,
                   help="Loops per anchor group (default: the model's; Ouro: all loops share one "
                        "anchor, Huginn: 4 recurrences per anchor).")
    g.add_argument("--rq-unlooped-bits", type=int, default=d.unlooped_bits,
                   help="Bits of un-looped layers (Huginn's prelude/coda): 16 = BF16, 2/4/8 = "
                        "one quantized anchor. Default %(default)s.")
    g.add_argument("--rq-no-prescale", action="store_true",
                   help="Do not prescale K/V whose norms exceed the FP8 scale/offset range "
                        "(calibrated per layer on the first prefill; see docs/robustness.md).")
