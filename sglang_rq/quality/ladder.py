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
}

#: The ablation ladder in order (ResidualQuant's own steps).
LADDER = ("direct-int2", "residual-int2", "residual-int2-lsq", "residual-int2-lsq-rot", "default")


def rq_config(flags: list[str]) -> RQConfig:
    """The `RQConfig` that ``flags`` select (raises `RQConfigError` like the server would)."""
    p = argparse.ArgumentParser(add_help=False)
    add_cli_args(p)
    return RQConfig.from_args(p.parse_args(flags))


def resolve(names: str) -> list[str]:
    """Comma-separated format names (or ``all`` / ``ladder``) -> names, ``bf16`` first.

    Raises
    ------
    ValueError
        Naming an unknown format and listing the known ones (flag ``--formats``).
    """
    if names == "all":
        out = list(FORMATS)
    elif names == "ladder":
        out = ["bf16", *LADDER]
    else:
        out = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in out if n not in FORMATS and not n.startswith("rotation=")]
    if unknown:
        raise ValueError(f"--formats: unknown format(s) {unknown}; known: {', '.join(FORMATS)}, "
                         "all, ladder, or rotation=PATH.safetensors")
    return ["bf16"] + [n for n in out if n != "bf16"]


def flags_for(name: str) -> list[str]:
    """``--rq-*`` flags of a format name (``rotation=PATH`` = default format with that rotation file)."""
    if name.startswith("rotation="):
        return ["--rq-rotation", name.split("=", 1)[1]]
    return list(FORMATS[name][0])
