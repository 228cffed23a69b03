#!/usr/bin/env python3
"""Build the mini-Ouro training mix and tokenize it into uint16 ``.npy`` files.

Training mix (see ``training/README.md``):

* ``literature/**/*.txt`` except ``jane.austen.pride.and.prejudice.txt`` (held out for
  evaluation) and ``literature/shakespeare/shakespeare.sonnets.txt`` (duplicate of
  ``shakespeare/sonnets_gut.txt``);
* ``shakespeare/*_gut.txt``;
* ``gsm8k/train.jsonl`` formatted as ChatML conversations (user = question, assistant =
  answer with the ``<<calc>>`` annotations removed, ending in ``#### <number>``).

Never used for training: tinyshakespeare, wikitext2, any test split, Pride and Prejudice.

A small validation split is cut *from the training mix* (the last ~1% of every text, every
100th GSM8K example): it is used to monitor training only.  Evaluation-only token files
(Pride and Prejudice, WikiText-2 raw test) are written beside it for the perplexity report;
the training script never trains on them.

Outputs (in ``--out``, default ``.mini_ouro_data/`` at the repository root, git-ignored):

* ``train.npy`` / ``val.npy``: uint16 token streams; documents are separated by
  ``<|endoftext|>`` (id 0), document order shuffled with ``--seed``;
* ``eval_pride.npy``: the first ``--pride-tokens`` tokens of Pride and Prejudice;
* ``eval_wikitext2.npy``: WikiText-2 raw test (UTF-8, split on CRLF, joined with ``\\n\\n``);
* ``meta.json``: counts, bytes per split (for bits-per-byte) and the file list;
* a copy of the tokenizer files from ``--tokenizer``.

Usage::

    python training/build_tokenizer.py            # writes sglang_rq/assets/mini-ouro/tokenizer*
    python training/prepare_data.py               # writes .mini_ouro_data/*.npy
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_TOKENIZER_DIR = REPO_ROOT / "sglang_rq" / "assets" / "mini-ouro"
DEFAULT_OUT = REPO_ROOT / ".mini_ouro_data"

EOT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
HELD_OUT_LITERATURE = {"jane.austen.pride.and.prejudice.txt"}
DUPLICATE_LITERATURE = {"literature/shakespeare/shakespeare.sonnets.txt"}
_CALC_RE = re.compile(r"<<[^<>]*>>")


def load_text(path: Path) -> str:
    """Read a text file: UTF-8 (BOM stripped), falling back to cp1252 then latin-1; LF endings."""
    raw = path.read_bytes()
    for enc in ("utf-8-sig", "cp1252", "latin-1"):
        try:
            text = raw.decode(enc)
            break
        except UnicodeDecodeError:
            continue
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip("\n") + "\n"


def literature_files(data_dir: Path) -> list[Path]:
    """All training literature files, sorted, with the held-out novel and the duplicate removed."""
    out = []
    for p in sorted((data_dir / "literature").rglob("*.txt")):
        rel = p.relative_to(data_dir).as_posix()
        if p.name in HELD_OUT_LITERATURE or rel in DUPLICATE_LITERATURE:
            continue
        out.append(p)
    return out


def shakespeare_files(data_dir: Path) -> list[Path]:
    """The 42 modern-spelling Shakespeare texts ``shakespeare/*_gut.txt``, sorted."""
    return sorted((data_dir / "shakespeare").glob("*_gut.txt"))


def clean_gsm8k_answer(answer: str) -> str:
    """Remove GSM8K calculator annotations ``<<48/2=24>>``; keep the ``#### N`` final line."""
    return _CALC_RE.sub("", answer).strip()


def chatml(messages: list[dict]) -> str:
    """Render messages exactly as the tokenizer's ChatML chat template does."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def gsm8k_documents(path: Path) -> list[str]:
    """GSM8K train examples as ChatML conversations (user question, assistant answer)."""
    docs = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            ex = json.loads(line)
            docs.append(chatml([
                {"role": "user", "content": ex["question"].strip()},
                {"role": "assistant", "content": clean_gsm8k_answer(ex["answer"])},
            ]))
    return docs


def split_tail(text: str, frac: float) -> tuple[str, str]:
    """Split ``text`` at a line boundary so that roughly the last ``frac`` goes to validation."""
    cut = int(len(text) * (1.0 - frac))
    nl = text.rfind("\n", 0, cut)
    cut = nl + 1 if nl > 0 else cut
    return text[:cut], text[cut:]


def training_documents(data_dir: Path, val_frac: float = 0.01, val_every: int = 100):
    """Return ``(train_docs, val_docs, sources)``: lists of strings and the files used.

    Each text file is one document (its last ``val_frac`` goes to validation); each GSM8K
    example is one document (every ``val_every``-th goes to validation).
    """
    train, val, sources = [], [], []
    for p in literature_files(data_dir) + shakespeare_files(data_dir):
        head, tail = split_tail(load_text(p), val_frac)
        train.append(head)
        if tail.strip():
            val.append(tail)
        sources.append(p.relative_to(data_dir).as_posix())
    gsm = gsm8k_documents(data_dir / "gsm8k" / "train.jsonl")
    for i, d in enumerate(gsm):
        (val if i % val_every == val_every - 1 else train).append(d)
    sources.append("gsm8k/train.jsonl")
    return train, val, sources


def wikitext2_test_text(data_dir: Path) -> str:
    """WikiText-2 raw test with the project-wide recipe: UTF-8, split on CRLF, join with \\n\\n."""
    raw = (data_dir / "wikitext2" / "wiki.test.raw").read_bytes().decode("utf-8")
    return "\n\n".join(raw.split("\r\n"))


def pride_text(data_dir: Path) -> str:
    """The held-out evaluation novel (Pride and Prejudice), LF line endings."""
    return load_text(data_dir / "literature" / "jane.austen.pride.and.prejudice.txt")


def _encode_docs(tok, docs: list[str], eot_id: int):
    import numpy as np

    ids: list[int] = []
    nbytes = 0
    for enc, d in zip(tok.encode_batch(docs), docs):
        ids.extend(enc.ids)
        ids.append(eot_id)
        nbytes += len(d.encode("utf-8"))
    arr = np.asarray(ids, dtype=np.uint16)
    return arr, nbytes


def main() -> None:
    import numpy as np
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER_DIR)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pride-tokens", type=int, default=200_000)
    args = ap.parse_args()

    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    eot_id = tok.token_to_id(EOT)
    assert eot_id == 0 and tok.token_to_id(IM_START) == 1 and tok.token_to_id(IM_END) == 2
    assert tok.get_vocab_size() <= 65535

    train_docs, val_docs, sources = training_documents(args.data_dir)
    random.Random(args.seed).shuffle(train_docs)
    args.out.mkdir(parents=True, exist_ok=True)

    meta: dict = {"sources": sources, "seed": args.seed, "vocab_size": tok.get_vocab_size()}
    for name, docs in (("train", train_docs), ("val", val_docs)):
        arr, nbytes = _encode_docs(tok, docs, eot_id)
        np.save(args.out / f"{name}.npy", arr)
        meta[name] = {"tokens": int(arr.size), "bytes": nbytes, "documents": len(docs)}
        print(f"{name}: {len(docs)} documents, {nbytes:,} bytes, {arr.size:,} tokens")

    pride_ids = tok.encode(pride_text(args.data_dir)).ids[: args.pride_tokens]
    np.save(args.out / "eval_pride.npy", np.asarray(pride_ids, dtype=np.uint16))
    pride_bytes = len(tok.decode(pride_ids).encode("utf-8"))
    meta["eval_pride"] = {"tokens": len(pride_ids), "bytes": pride_bytes}
    wt = wikitext2_test_text(args.data_dir)
    wt_ids = tok.encode(wt).ids
    np.save(args.out / "eval_wikitext2.npy", np.asarray(wt_ids, dtype=np.uint16))
    meta["eval_wikitext2"] = {"tokens": len(wt_ids), "bytes": len(wt.encode("utf-8"))}
    print(f"eval_pride: {len(pride_ids):,} tokens; eval_wikitext2: {len(wt_ids):,} tokens")

    for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = args.tokenizer / fn
        if src.exists():
            shutil.copy(src, args.out / fn)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
