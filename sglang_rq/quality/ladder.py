"""Named KV formats for ablations: the ResidualQuant ladder and the baselines it is compared with.

Every entry is a list of ``--rq-*`` flags of the *same* code path (pool, codec, attention
backend); only ``bf16`` selects SGLang's own BF16 pool. The ladder follows the ablation of the
ResidualQuant design (DESIGN.md section 1): direct INT2 for every loop, then a last-loop anchor
with residuals, + least-squares scaling, + rotation, + mixed precision (INT4 anchor) = default.
"Direct" formats store every loop on its own (``--rq-loop-group-size 1``: each loop is its own
anchor).
"""

from __future__ import annotations

import argparse

from sglang_rq.config import RQConfig, add_cli_args

#: name -> (--rq-* flags, one-line description). Order = table order.
FORMATS: dict[str, tuple[list[str], str]] = {
    "bf16": (["--rq-disable"], "SGLang BF16 pool (reference)"),
    # ---- the ladder
    "direct-int2": (["--rq-loop-group-size", "1", "--rq-anchor-bits", "2", "--rq-rotation", "none"],
                    "ladder 1: every loop INT2 on its own"),
    "residual-int2": (["--rq-loop-bits", "2,2,2,2", "--rq-no-lsq", "--rq-rotation", "none"],
                      "ladder 2: last-loop anchor INT2, residuals INT2 (c = 1)"),
    "residual-int2-lsq": (["--rq-loop-bits", "2,2,2,2", "--rq-rotation", "none"],
                          "ladder 3: + least-squares scale c"),
    "residual-int2-lsq-rot": (["--rq-loop-bits", "2,2,2,2"],
                              "ladder 4: + Hadamard rotation"),
    "default": ([], "ladder 5 = ResidualQuant default: + INT4 anchor"),
    # ---- baselines and variants
    "direct-int4": (["--rq-loop-group-size", "1", "--rq-anchor-bits", "4", "--rq-rotation", "none"],
                    "every loop INT4 on its own"),
    "quarot-int2": (["--rq-loop-group-size", "1", "--rq-anchor-bits", "2"],
                    "every loop INT2, Hadamard-rotated (QuaRot-style)"),
    "quarot-int4": (["--rq-loop-group-size", "1", "--rq-anchor-bits", "4"],
                    "every loop INT4, Hadamard-rotated (QuaRot-style)"),
    "chained": (["--rq-anchor", "chained"],
                "first loop INT4 base, loop i residual vs loop i-1 (FlashLoop-style)"),
    "first-anchor": (["--rq-anchor", "first"], "first loop INT4 anchor, residuals INT2"),
    "signed-hadamard": (["--rq-rotation", "signed-hadamard"], "default with a seeded ±1 diagonal"),
    "share-lsq": (["--rq-residual-bits", "0"],
                  "KV sharing: earlier loops read c·anchor (0-bit residuals, MELT/PLT-style + c)"),
    "share": (["--rq-residual-bits", "0", "--rq-no-lsq"],
              "KV sharing: every loop reads the INT4 anchor (c = 1)"),
    # ---- Huginn (recurrent depth; R = 32 recurrences of the core, issue 15 item 6)
    "huginn-sharing": (["--rq-anchor-bits", "16", "--rq-residual-bits", "0", "--rq-no-lsq",
                        "--rq-rotation", "none", "--rq-loop-group-size", "32"],
                       "Huginn authors' cache: one BF16 slot per core layer, the newest "
                       "recurrence's K/V read by every recurrence"),
    "share-int4-g32": (["--rq-residual-bits", "0", "--rq-loop-group-size", "32"],
                       "KV sharing over all 32 recurrences: INT4 anchor, LSQ c"),
    "share-int8-g32": (["--rq-anchor-bits", "8", "--rq-residual-bits", "0",
                        "--rq-loop-group-size", "32"],
                       "KV sharing over all 32 recurrences: INT8 anchor, LSQ c"),
    "share-int4-g8-u4": (["--rq-residual-bits", "0", "--rq-loop-group-size", "8",
                          "--rq-unlooped-bits", "4"],
                         "KV sharing in groups of 8: INT4 anchors, LSQ c; INT4 prelude/coda"),
    "g2": (["--rq-loop-group-size", "2"], "default bits, loop groups of 2 recurrences"),
    "g4": (["--rq-loop-group-size", "4"], "default bits, loop groups of 4 (Huginn's default)"),
    "g8": (["--rq-loop-group-size", "8"], "default bits, loop groups of 8"),
    "g32": (["--rq-loop-group-size", "32"], "default bits, one group of 32 recurrences"),
}

#: The ablation ladder in order (ResidualQuant's own steps).
LADDER = ("direct-int2", "residual-int2", "residual-int2-lsq", "residual-int2-lsq-rot", "default")
#: Huginn's head-to-head at R = 32: the authors' sharing, sharing with an anchor format and
#: ``c``, and ResidualQuant's loop groups (``--formats huginn``).
HUGINN = ("huginn-sharing", "share-int4-g32", "share-int8-g32", "share-int4-g8-u4", "g2", "g4",
          "g8", "g32")


def rq_config(flags: list[str]) -> RQConfig:
    """The `RQConfig` that ``flags`` select (raises `RQConfigError` like the server would)."""
    p = argparse.ArgumentParser(add_help=False)
    add_cli_args(p)
    return RQConfig.from_args(p.parse_args(flags))


def resolve(names: str) -> list[str]:
    """Comma-separated format names (or ``all`` / ``ladder`` / ``huginn``) -> names, ``bf16``
    first.

    Raises
    ------
    ValueError
        Naming an unknown format and listing the known ones (flag ``--formats``).
    """
    if names == "all":  # every format of a 4-loop model (Ouro)
        out = [n for n in FORMATS if n not in HUGINN]
    elif names == "ladder":
        out = ["bf16", *LADDER]
    elif names == "huginn":
        out = ["bf16", *HUGINN]
    else:
        out = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in out if n not in FORMATS and not n.startswith("rotation=")]
    if unknown:
        raise ValueError(f"--formats: unknown format(s) {unknown}; known: {', '.join(FORMATS)}, "
                         "all, ladder, huginn, or rotation=PATH.safetensors")
    return ["bf16"] + [n for n in out if n != "bf16"]


def flags_for(name: str) -> list[str]:
    """``--rq-*`` flags of a format name (``rotation=PATH`` = default format with that rotation file)."""
    if name.startswith("rotation="):
        return ["--rq-rotation", name.split("=", 1)[1]]
    return list(FORMATS[name][0])
