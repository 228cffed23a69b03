"""Held-out evaluation text for ``sglang-rq eval``, tokenized with the served model's tokenizer,
and the one owner of where evaluation/calibration data lives (`resolve_data_dir`).

The data directory is ``--data-dir``, else ``$SGLANG_RQ_DATA_DIR``, else, only when this package
is imported from a source checkout (a ``pyproject.toml`` beside ``sglang_rq/``), ``shared/data``
next to that checkout (``../shared/data`` from the repository root: how CI and the project
machines provide it). No other location is guessed; without one the commands stop with an error
naming the flag and the variable.

Datasets (files under the data directory):

* ``pride``: Jane Austen, *Pride and Prejudice* (held out of the embedded model's training mix;
  see ``training/README.md``), LF line endings, from the first chapter heading.
* ``wikitext2``: WikiText-2 raw test split, lines split on CRLF and joined with blank lines
  (the recipe in ``shared/data/README.md``; numbers compare with each other, not with papers).
"""

from __future__ import annotations

from pathlib import Path

from sglang_rq import env

DATASETS = ("pride", "wikitext2")


def checkout_data_dir() -> Path | None:
    """``shared/data`` next to the source checkout this package is imported from, if both exist."""
    repo = Path(__file__).resolve().parents[2]
    candidate = repo.parent / "shared" / "data"
    if (repo / "pyproject.toml").is_file() and candidate.is_dir():
        return candidate
    return None


def default_data_dir() -> Path | None:
    """``$SGLANG_RQ_DATA_DIR`` if set, else `checkout_data_dir` (None when neither applies).
    Tests skip their data-dependent cases when this is None or lacks the dataset."""
    value = env.RQ_DATA_DIR.get()
    return Path(value) if value else checkout_data_dir()


def data_dir_with(subdir: str) -> Path | None:
    """`default_data_dir` if it holds ``subdir`` (a dataset folder), else None (tests skip)."""
    root = default_data_dir()
    return root if root is not None and (root / subdir).exists() else None


def resolve_data_dir(data_dir: Path | str | None) -> Path:
    """The data directory: ``data_dir`` (the ``--data-dir`` flag) if given, else `default_data_dir`.

    Raises
    ------
    FileNotFoundError
        When no directory is given or found, or the one given does not exist; the message
        names ``--data-dir`` and ``SGLANG_RQ_DATA_DIR``.
    """
    if data_dir is not None:
        where, path = f"--data-dir={data_dir}", Path(data_dir)
    elif env.RQ_DATA_DIR.get():
        where, path = f"{env.RQ_DATA_DIR.name}={env.RQ_DATA_DIR.get()}", Path(env.RQ_DATA_DIR.get())
    else:
        path = checkout_data_dir()
        if path is None:
            raise FileNotFoundError(
                f"no evaluation data directory: pass --data-dir DIR or set {env.RQ_DATA_DIR.name} "
                "(shared/data next to a source checkout is used when present)")
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"{where}: not a directory (pass --data-dir DIR or set "
                                f"{env.RQ_DATA_DIR.name})")
    return path


def load_tokenizer(model_path: str | Path):
    """The model's Hugging Face tokenizer; Ouro's config class is registered first, so
    transformers recognises ``model_type: ouro`` checkpoints."""
    from transformers import AutoTokenizer

    from sglang_rq.models.ouro_config import register_ouro_config

    register_ouro_config()
    return AutoTokenizer.from_pretrained(str(model_path))


def dataset_file(name: str) -> Path:
    """The file holding dataset ``name``'s text, relative to a data directory.

    Raises
    ------
    ValueError
        Unknown dataset name (flag ``--datasets``).
    """
    if name == "pride":
        return Path("literature") / "jane.austen.pride.and.prejudice.txt"
    if name == "wikitext2":
        return Path("wikitext2") / "wiki.test.raw"
    raise ValueError(f"--datasets: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


def load_text(name: str, data_dir: Path) -> str:
    """Raw text of a dataset.

    Raises
    ------
    ValueError
        Unknown dataset name (flag ``--datasets``).
    FileNotFoundError
        The file is not under ``data_dir`` (flag ``--data-dir``).
    """
    path = data_dir / dataset_file(name)
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
