"""Held-out evaluation text for ``sglang-rq eval``, tokenized with the served model's tokenizer.

Datasets (files under ``--data-dir``, default ``$SGLANG_RQ_DATA_DIR`` or ``../shared/data``
beside the checkout):

* ``pride``: Jane Austen, *Pride and Prejudice* (held out of the embedded model's training mix;
  see ``training/README.md``), LF line endings, from the first chapter heading.
* ``wikitext2``: WikiText-2 raw test split, lines split on CRLF and joined with blank lines
  (the recipe in ``shared/data/README.md``; numbers compare with each other, not with papers).
"""

from __future__ import annotations

from pathlib import Path

from sglang_rq import env

DATASETS = ("pride", "wikitext2")
DEFAULT_DATA_DIR = Path(env.RQ_DATA_DIR.get() or Path(__file__).resolve().parents[3] / "shared" / "data")


def load_tokenizer(model_path: str | Path):
    """The model's Hugging Face tokenizer; Ouro's config class is registered first, so
    transformers recognises ``model_type: ouro`` checkpoints."""
    from transformers import AutoTokenizer

    from sglang_rq.models.ouro_config import register_ouro_config

    register_ouro_config()
    return AutoTokenizer.from_pretrained(str(model_path))


def load_text(name: str, data_dir: Path) -> str:
    """Raw text of a dataset.

    Raises
    ------
    ValueError
        Unknown dataset name (flag ``--datasets``).
    FileNotFoundError
        The file is not under ``data_dir`` (flag ``--data-dir``).
    """
    if name == "pride":
        path = data_dir / "literature" / "jane.austen.pride.and.prejudice.txt"
    elif name == "wikitext2":
        path = data_dir / "wikitext2" / "wiki.test.raw"
    else:
        raise ValueError(f"--datasets: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if not path.exists():
        raise FileNotFoundError(f"--data-dir={data_dir}: {path} not found")
    raw = path.read_bytes().decode("utf-8-sig", "replace")
    if name == "wikitext2":
        return "\n\n".join(line for line in raw.split("\r\n") if line.strip())
    text = raw.replace("\r\n", "\n")
    start = text.find("Chapter 1")
    return text[start if start >= 0 else 0:]


def documents(name: str, data_dir: Path, tokenizer, *, num_docs: int, doc_tokens: int,
              bos_id: int | None) -> list[list[int]]:
    """``num_docs`` consecutive, non-overlapping windows of ``doc_tokens`` token ids each
    (``bos_id`` prepended when given), from the start of the dataset's text.

    Raises
    ------
    ValueError
        If the text is shorter than ``num_docs * doc_tokens`` tokens.
    """
    ids = tokenizer.encode(load_text(name, data_dir), add_special_tokens=False)
    need = num_docs * doc_tokens
    if len(ids) < need:
        raise ValueError(f"{name}: {len(ids)} tokens < --docs x --doc-tokens = {need}")
    head = [] if bos_id is None else [bos_id]
    return [head + ids[i * doc_tokens:(i + 1) * doc_tokens] for i in range(num_docs)]
