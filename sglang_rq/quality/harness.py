"""``sglang-rq eval``: quality of KV formats measured through the real SGLang server.

For each format (``bf16`` first, the reference) a server is started with that format's
``--rq-*`` flags, held-out documents are scored teacher-forced (prompt log-probabilities with
top-k), a few greedy continuations are generated, and the server is stopped. Prefill is chunked
(``--chunk``, default 32 tokens) and only positions after the first chunk are scored, so every
scored token's context comes from the compressed cache except for the at most ``chunk`` most
recent tokens that are still in BF16 staging (decode reads 0 such tokens: chunking is what makes
teacher forcing exercise the compressed history).

Per format and dataset: perplexity and its change vs BF16, mean KL(BF16 || format) per token
(top-k lower bound, `metrics.topk_kl`), top-1 agreement; per format: greedy tokens until the
first difference from BF16 and the 4-gram repetition rate of the generation; effective bits per
element from `layout.effective_bits` (all metadata included). Writes ``results.json``,
``results.md`` and ``quality.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import requests

from sglang_rq.cli_values import out_dir_error
from sglang_rq.config import RQConfigError
from sglang_rq.layout import ModelKVShape
from sglang_rq.quality import data, ladder, metrics


def parse_args(argv: list[str]) -> argparse.Namespace:
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    p = argparse.ArgumentParser(prog="sglang-rq eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=str(EMBEDDED_MODEL), help="Model directory (default: embedded).")
    p.add_argument("--formats", default="ladder",
                   help=f"Comma-separated names from {{{', '.join(ladder.FORMATS)}}}, 'ladder', 'huginn', 'all', "
                        "or rotation=PATH.safetensors. bf16 is always run first. Default %(default)s.")
    p.add_argument("--datasets", default="pride,wikitext2", help="Comma-separated: pride, wikitext2.")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="Evaluation data (default: $SGLANG_RQ_DATA_DIR, else shared/data next to "
                        "the source checkout).")
    p.add_argument("--docs", type=int, default=4, help="Documents per dataset.")
    p.add_argument("--doc-tokens", type=int, default=512, help="Tokens per document.")
    p.add_argument("--chunk", type=int, default=32, help="--chunked-prefill-size of the servers.")
    p.add_argument("--top-k", type=int, default=20, help="Top-k log-probabilities per position (KL).")
    p.add_argument("--gen-prompts", type=int, default=4, help="Greedy generations per format.")
    p.add_argument("--gen-prompt-tokens", type=int, default=64)
    p.add_argument("--gen-tokens", type=int, default=256, help="Greedy tokens per generation.")
    p.add_argument("--server-args", default="", help="Extra server flags (one shell-quoted string).")
    p.add_argument("--transformers-reference", action="store_true",
                   help="Also score the documents with transformers (same checkpoint, its dtype) "
                        "and report the BF16 server's perplexity against it.")
    p.add_argument("--out", type=Path, default=Path("eval-results"))
    a = p.parse_args(argv)
    for name in ("docs", "doc_tokens", "chunk", "top_k", "gen_prompts", "gen_tokens",
                 "gen_prompt_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.doc_tokens <= a.chunk + 1:
        p.error(f"--doc-tokens={a.doc_tokens} must exceed --chunk={a.chunk} + 1 (positions after "
                "the first chunk are the ones scored)")
    if (err := out_dir_error("--out", a.out)) is not None:
        p.error(err)
    try:  # the servers' argv (a review's "'--foo" failed after 13 s of tokenizing)
        extra = shlex.split(a.server_args)
    except ValueError as exc:
        p.error(f"--server-args={a.server_args!r}: {exc}")
    # flags the harness sets per format or itself: given again they win (the last occurrence),
    # so a review's "--rq-disable" served every format as BF16 and the table reported each
    # format's bits beside BF16's figures
    owned = [f for f in extra if f.split("=", 1)[0].startswith("--rq-")
             or f.split("=", 1)[0] in OWNED_FLAGS]
    if owned:
        p.error(f"--server-args sets {', '.join(owned)}: the KV format comes from --formats, "
                "the model from --model-path and the chunk from --chunk")
    if not any(n.strip() for n in a.formats.split(",")):
        p.error("--formats is empty; name the formats to compare with BF16 (default: ladder)")
    if not (Path(a.model_path) / "config.json").is_file():
        p.error(f"--model-path={a.model_path}: no config.json there (give a local checkpoint "
                "directory)")
    try:
        vocab = json.loads((Path(a.model_path) / "config.json").read_text()).get("vocab_size")
    except (ValueError, AttributeError) as exc:  # not JSON, or not an object
        p.error(f"--model-path={a.model_path}: config.json is not a JSON object ({exc})")
    if isinstance(vocab, int) and a.top_k > vocab:  # the server's 400 came after the BF16 load
        p.error(f"--top-k={a.top_k} exceeds the model's vocabulary ({vocab} tokens)")
    try:
        a.format_names = ladder.resolve(a.formats)
        shape = None  # the model's, read once, where a rotation file is given
        for name in a.format_names:  # a file the server would refuse after the BF16 run
            if not name.startswith("rotation="):
                continue
            path = name.split("=", 1)[1]
            if not Path(path).is_file():
                raise ValueError(f"--formats {name}: no such file")
            from sglang_rq.rotation import check_rotation_file

            shape = shape or ModelKVShape.from_hf_config(a.model_path)
            try:
                check_rotation_file(ladder.rq_config(ladder.flags_for(name)),
                                    num_layers=shape.num_layers,
                                    num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
            except RQConfigError as exc:  # named by the flag this command takes
                raise ValueError(str(exc).replace(f"--rq-rotation={path}",
                                                  f"--formats {name}")) from None
        a.dataset_names = [d.strip() for d in a.datasets.split(",") if d.strip()]
        if not a.dataset_names:
            raise ValueError(f"--datasets={a.datasets!r} names none; choose from "
                             f"{', '.join(data.DATASETS)}")
        for d in a.dataset_names:
            if d not in data.DATASETS:
                raise ValueError(f"--datasets: unknown dataset {d!r}; choose from {', '.join(data.DATASETS)}")
        for name in a.format_names:
            ladder.rq_config(ladder.flags_for(name))
        a.data_dir = data.resolve_data_dir(a.data_dir)
        for d in a.dataset_names:
            if not (path := a.data_dir / data.dataset_file(d)).is_file():
                raise ValueError(f"--data-dir={a.data_dir}: {path} not found (--datasets {d})")
    except (ValueError, FileNotFoundError) as exc:
        p.error(str(exc))
    return a


def _ok(r: requests.Response) -> requests.Response:
    """``r`` if it succeeded; else HTTPError with the server's own reason (``raise_for_status``
    gives only the status and URL: a review's ``--doc-tokens`` past the context read "400 Client
    Error: Bad Request" after 40 s)."""
    if r.status_code >= 400:
        raise requests.HTTPError(f"{r.url} answered {r.status_code}: {r.text[:500]}", response=r)
    return r


def score_documents(url: str, docs: list[list[int]], *, top_k: int, score_from: int) -> dict:
    """Teacher-forced log-probabilities of ``docs`` (token ids) from a running server.

    Returns ``{"logprobs": [[float]], "top": [[{id: logprob}]]}`` for positions
    ``score_from..len-1`` of every document (natural log; ``top`` holds the ``top_k`` most likely
    next tokens predicted for each scored position).
    """
    r = requests.post(url + "/generate", json={
        "input_ids": docs, "return_logprob": True, "logprob_start_len": 0,
        "top_logprobs_num": top_k,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}, timeout=3600)
    out = {"logprobs": [], "top": []}
    for o in _ok(r).json():
        m = o["meta_info"]
        out["logprobs"].append([lp for lp, _, _ in m["input_token_logprobs"][score_from:]])
        out["top"].append([{int(t): lp for lp, t, _ in pos} for pos in m["input_top_logprobs"][score_from:]])
    return out


def transformers_perplexity(model_path: str, docs: list[list[int]], *, score_from: int) -> float:
    """Perplexity of ``docs`` from a plain transformers forward (checkpoint dtype, CPU, full
    context), over positions ``score_from..len-1``: the independent reference for the server."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto").eval()
    lps: list[float] = []
    with torch.no_grad():
        for doc in docs:
            ids = torch.tensor([doc])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)  # [T, V]
            tgt = ids[0, score_from:]
            lps += logp[score_from - 1:-1].gather(-1, tgt[:, None])[:, 0].tolist()
    return metrics.perplexity(lps)


def greedy(url: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy continuations (``n`` tokens each, EOS ignored) of token-id prompts, one batch."""
    r = requests.post(url + "/generate", json={
        "input_ids": prompts,
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}},
        timeout=3600)
    return [o["output_ids"] for o in _ok(r).json()]


# server flags `run_format` decides besides the format's --rq-* flags: the model and chunk it
# passes, and the port and host its `Server` picks and reaches (127.0.0.1)
OWNED_FLAGS = ("--model-path", "--chunked-prefill-size", "--port", "--host")


def run_format(name: str, args, docs: dict, prompts, log_dir: Path) -> dict:
    """Serve one format, score every dataset, generate; returns the raw measurements."""
    from sglang_rq.server_process import Server

    flags = ladder.flags_for(name) + ["--model-path", args.model_path, "--chunked-prefill-size",
                                      str(args.chunk), "--rq-no-canary",
                                      *shlex.split(args.server_args)]
    t0 = time.time()
    server = Server(flags, log_dir / f"{name.replace('/', '_')}.log")
    try:
        raw = {ds: score_documents(server.url, d, top_k=args.top_k, score_from=args.chunk + 1)
               for ds, d in docs.items()}
        gen = greedy(server.url, prompts, args.gen_tokens)
    finally:
        server.stop()
    print(f"[eval] {name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"scores": raw, "greedy": gen}


def summarize(name: str, raw: dict, ref: dict, shape) -> dict:
    """Metrics of one format against the BF16 reference measurements."""
    from sglang_rq import layout

    flags = ladder.flags_for(name)
    cfg = ladder.rq_config(flags)
    out = {"flags": flags, "description": ladder.FORMATS.get(name, ("", "calibrated rotation file"))[1],
           "effective_bits": 16.0 if not cfg.enabled else layout.effective_bits(shape, cfg),
           "bytes_per_token": (layout.bf16_bytes_per_token(shape) if not cfg.enabled
                               else layout.kv_bytes_per_token(shape, cfg)),
           "datasets": {}}
    for ds, s in raw["scores"].items():
        r = ref["scores"][ds]
        lp = [x for doc in s["logprobs"] for x in doc]
        lp_ref = [x for doc in r["logprobs"] for x in doc]
        top = [x for doc in s["top"] for x in doc]
        top_ref = [x for doc in r["top"] for x in doc]
        ppl, ppl_ref = metrics.perplexity(lp), metrics.perplexity(lp_ref)
        out["datasets"][ds] = {
            "tokens": len(lp), "ppl": ppl, "delta_ppl_pct": 100.0 * (ppl / ppl_ref - 1.0),
            "kl": statistics.fmean(metrics.topk_kl(p, q) for p, q in zip(top_ref, top)),
            "top1": metrics.top1_agreement(top_ref, top),
            "bf16_topk_mass": statistics.fmean(sum(math.exp(v) for v in p.values())
                                               for p in top_ref)}
    firsts = [metrics.first_difference(a, b) for a, b in zip(raw["greedy"], ref["greedy"])]
    out["greedy"] = {
        "tokens": len(raw["greedy"][0]), "first_difference": firsts,
        "mean_first_difference": statistics.fmean(firsts),
        "repetition_rate_4gram": statistics.fmean(metrics.repetition_rate(g) for g in raw["greedy"])}
    return out


def markdown(results: dict) -> str:
    """The results table (one row per format) as Markdown."""
    dss = results["settings"]["datasets"]
    head = ["format", "eff. bits", "B/token"]
    for ds in dss:
        head += [f"{ds} PPL", f"{ds} ΔPPL %", f"{ds} KL", f"{ds} top-1"]
    head += ["greedy first diff", "4-gram rep."]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, f in results["formats"].items():
        cells = [f"`{name}`", f"{f['effective_bits']:.2f}", f"{f['bytes_per_token']:,}"]
        for ds in dss:
            d = f["datasets"][ds]
            cells += [f"{d['ppl']:.2f}", f"{d['delta_ppl_pct']:+.2f}", f"{d['kl']:.4f}", f"{d['top1']:.3f}"]
        g = f["greedy"]
        cells += [f"{g['mean_first_difference']:.1f}/{g['tokens']}", f"{g['repetition_rate_4gram']:.3f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def plot(results: dict, path: Path) -> None:
    """KL and top-1 disagreement vs effective bits, one point per format (first dataset)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = results["settings"]["datasets"][0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, f in results["formats"].items():
        if name == "bf16":
            continue
        x = f["effective_bits"]
        d = f["datasets"][ds]
        for ax, y in zip(axes, (d["kl"], 1.0 - d["top1"])):
            ax.scatter(x, y, color="C3" if name in ladder.LADDER else "C0")
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes[0].set_ylabel(f"mean KL(BF16 || format), nats/token ({ds})")
    axes[1].set_ylabel(f"top-1 disagreement with BF16 ({ds})")
    for ax in axes:
        ax.set_xlabel("effective bits per K/V element (metadata included)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"KV formats on {Path(results['settings']['model_path']).name} "
                 "(red: ResidualQuant ladder, blue: baselines)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-rq eval``."""
    from sglang_rq.layout import ModelKVShape

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tok = data.load_tokenizer(args.model_path)
    shape = ModelKVShape.from_hf_config(Path(args.model_path) / "config.json")
    # documents start like training documents: after <|endoftext|> when the vocabulary has it
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    bos = eot if isinstance(eot, int) and eot != tok.unk_token_id else tok.bos_token_id
    try:
        docs = {ds: data.documents(ds, args.data_dir, tok, num_docs=args.docs,
                                   doc_tokens=args.doc_tokens, bos_id=bos)
                for ds in args.dataset_names}
    except ValueError as exc:  # too few tokens for --docs x --doc-tokens (a review: a traceback)
        print(f"sglang-rq eval: error: {exc}", file=sys.stderr)
        return 2
    first = docs[args.dataset_names[0]]
    prompts = [d[:args.gen_prompt_tokens] for d in (first * args.gen_prompts)[:args.gen_prompts]]
    raw, failed = {}, {}
    for name in args.format_names:
        try:
            raw[name] = run_format(name, args, docs, prompts, args.out)
        except (RuntimeError, TimeoutError, requests.RequestException) as exc:
            if name == "bf16":  # the reference is needed by every comparison
                print(f"error: the bf16 reference server failed: {exc}", file=sys.stderr)
                return 1
            failed[name] = str(exc)[-2000:]
            print(f"[eval] {name} FAILED (continuing): {str(exc)[-400:]}", file=sys.stderr, flush=True)
    results = {"settings": {"model_path": args.model_path, "datasets": args.dataset_names,
                            "docs": args.docs, "doc_tokens": args.doc_tokens, "chunk": args.chunk,
                            "top_k": args.top_k, "gen_prompts": len(prompts),
                            "gen_tokens": args.gen_tokens, "server_args": args.server_args,
                            "date": time.strftime("%Y-%m-%d")},
               "formats": {n: summarize(n, raw[n], raw["bf16"], shape) for n in raw},
               "failed": failed}
    if args.transformers_reference:
        ref = results["formats"]["bf16"]["datasets"]
        results["transformers_reference"] = {}
        for ds, d in docs.items():
            ppl = transformers_perplexity(args.model_path, d, score_from=args.chunk + 1)
            results["transformers_reference"][ds] = {
                "ppl": ppl, "server_bf16_ppl": ref[ds]["ppl"],
                "relative_difference_pct": 100.0 * (ref[ds]["ppl"] / ppl - 1.0)}
            print(f"[eval] {ds}: transformers PPL {ppl:.3f}, server BF16 pool {ref[ds]['ppl']:.3f} "
                  f"({results['transformers_reference'][ds]['relative_difference_pct']:+.2f}%)",
                  file=sys.stderr)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out / "results.md").write_text(table)
    try:
        plot(results, args.out / "quality.png")
    except ImportError:
        print("[eval] matplotlib not installed: no plot (pip install 'sglang-rq[eval]')", file=sys.stderr)
    print(table)
    return 1 if failed else 0
