"""``sglang-rq tasks``: accuracy on GSM8K, MATH500, HumanEval, MBPP and ARC-Easy against a running
OpenAI-compatible server (a worker or the router), greedy decoding.

Answer extraction follows the usual harness conventions:

* GSM8K: the number after ``####`` if the model wrote one, else the last number in the text;
  gold = the number after ``####`` in the reference (commas removed, compared as numbers).
* MATH500: the contents of the last ``\\boxed{...}`` (balanced braces), normalised (spaces,
  ``\\left``/``\\right``, ``\\dfrac``/``\\tfrac`` -> ``\\frac``, ``^\\circ``, ``\\$``, text units,
  trailing ``.``); equal strings, or equal numbers when both parse.
* HumanEval: ``/v1/completions`` on the function prompt, cut at the next top-level
  ``def``/``class``/``if``/``print``; pass@1 by running prompt + completion + tests.
* MBPP (task ids 11-510): the original 3-shot prompt (tasks 2, 3, 4) with ``[BEGIN]``/``[DONE]``;
  pass@1 by running the code with the task's asserts.
* ARC-Easy: chat prompt with lettered choices; the first standalone choice label in the reply.

Model-written code runs in a fresh ``python -I`` subprocess in a temporary directory with a
wall-clock limit (``--timeout-s``) and an address-space limit; that is a guard against
accidents, not a sandbox against hostile code (run untrusted models in a container).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import requests

from sglang_rq.cli_values import out_file_error, wait_error

TASKS = ("gsm8k", "math500", "humaneval", "mbpp", "arc_easy")
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


# ----------------------------------------------------------------------------- extraction
def _to_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None


def extract_gsm8k(text: str) -> str | None:
    """The predicted GSM8K answer: after ``####`` if present, else the last number; or None."""
    tail = text.split("####", 1)[1] if "####" in text else text
    nums = _NUM.findall(tail)
    if not nums:
        return None
    return (nums[0] if "####" in text else nums[-1]).replace(",", "").rstrip(".")


def gsm8k_correct(prediction: str | None, reference_answer: str) -> bool:
    """True if the prediction equals the number after ``####`` in the reference solution."""
    gold = _to_number(reference_answer.split("####")[-1].strip())
    pred = None if prediction is None else _to_number(prediction)
    return pred is not None and gold is not None and abs(pred - gold) < 1e-6


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def normalize_math(ans: str) -> str:
    """Canonical string of a MATH answer (see the module docstring)."""
    s = ans.strip()
    s = re.sub(r"\\text\{\s*[a-zA-Z ]*\}$", "", s)  # trailing units
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""),
                 ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^\\circ", ""), ("^{\\circ}", ""),
                 ("\\$", ""), ("$", ""), ("\\%", ""), ("%", "")):
        s = s.replace(a, b)
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = s.replace(" ", "").rstrip(".")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def math_correct(prediction: str | None, answer: str) -> bool:
    """Normalised string match, or numeric match when both sides parse as numbers."""
    if prediction is None:
        return False
    p, g = normalize_math(prediction), normalize_math(answer)
    if p == g:
        return True
    pn, gn = _to_number(p), _to_number(g)
    return pn is not None and gn is not None and abs(pn - gn) < 1e-6


def extract_choice(text: str, labels: list[str]) -> str | None:
    """The choice label ``text`` gives, in this order: after "answer is" / "answer:" ("The answer
    is (B)."), the first standalone label that no lower-case word follows ("C. Carbon dioxide";
    the article in "A plant needs light, so C." is not read as choice A), else the first
    standalone label; None without one."""
    label = "(" + "|".join(map(re.escape, labels)) + ")"
    alone, no_word = r"(?![A-Za-z0-9])", r"(?![A-Za-z0-9]| [a-z])"
    for pattern, flags in ((r"answer\s*(?:is|:)\s*\(?" + label + alone, re.IGNORECASE),
                           (r"(?<![A-Za-z0-9])" + label + no_word, 0),
                           (r"(?<![A-Za-z0-9])" + label + alone, 0)):
        if m := re.search(pattern, text, flags):
            return m.group(1)
    return None


def truncate_humaneval(completion: str) -> str:
    """Cut a completion at the first line that starts a new top-level statement."""
    m = re.search(r"\n(?:def |class |if __name__|print\(|#|assert )", completion)
    return completion[:m.start()] if m else completion


def run_program(code: str, timeout_s: float) -> tuple[bool, str]:
    """Run ``code`` with ``python -I`` in a temp dir; (passed = exit status 0, last stderr)."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prog.py"
        path.write_text(limit + code)
        try:
            r = subprocess.run([sys.executable, "-I", str(path)], cwd=tmp, capture_output=True,
                               text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"timeout after {timeout_s} s"
    return r.returncode == 0, r.stderr[-500:]


# ----------------------------------------------------------------------------- problems
def load_problems(task: str, data_dir: Path, limit: int) -> list[dict]:
    """The first ``limit`` problems of a task as dicts (the files' own fields).

    Raises
    ------
    ValueError
        Unknown task (flag ``--task``), or a data file that is not gzip (HumanEval), UTF-8
        JSON lines, or whose rows lack the fields the grader reads (naming the file and
        ``--data-dir``; a review got BadGzipFile, KeyError and TypeError tracebacks).
    FileNotFoundError
        Missing data file (flag ``--data-dir``).
    """
    files = {"gsm8k": "gsm8k/test.jsonl", "math500": "math500/test.jsonl",
             "humaneval": "humaneval/HumanEval.jsonl.gz", "mbpp": "mbpp/mbpp.jsonl",
             "arc_easy": "arc_easy/test.jsonl"}
    if task not in files:
        raise ValueError(f"--task={task!r}: choose from {', '.join(TASKS)}")
    path = data_dir / files[task]
    if not path.exists():
        raise FileNotFoundError(f"--data-dir={data_dir}: {path} not found")
    rows = _json_rows(path, data_dir, FIELDS[task])
    if task == "mbpp":  # the test split
        rows = [r for r in rows if isinstance(r["task_id"], int) and 11 <= r["task_id"] <= 510]
    if not rows:  # the fix's review: a ZeroDivisionError after contacting the server
        raise ValueError(f"--data-dir={data_dir}: {path} holds no {task} problems"
                         + (" (task ids 11-510)" if task == "mbpp" else ""))
    return rows[:limit]


def _is_str(v) -> bool:
    return isinstance(v, str)


def _is_str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_choice_question(v) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("stem"), str)
            and isinstance(v.get("choices"), list)
            and all(isinstance(c, dict) and isinstance(c.get("label"), str)
                    and isinstance(c.get("text"), str) for c in v["choices"]))


_STR = ("a string", _is_str)
# the fields `grade` and `_mbpp_prompt` read from each task's rows, with what each must hold
FIELDS = {"gsm8k": {"question": _STR, "answer": _STR},
          "math500": {"problem": _STR, "answer": _STR},
          "arc_easy": {"question": ("an object with a string stem and choices of string label "
                                    "and text", _is_choice_question), "answerKey": _STR},
          "humaneval": {"prompt": _STR, "test": _STR, "entry_point": _STR},
          "mbpp": {"task_id": ("an integer", lambda v: type(v) is int), "text": _STR,
                   "code": _STR, "test_list": ("a list of strings", _is_str_list)}}


def _json_rows(path: Path, data_dir: Path, fields: dict) -> list[dict]:
    """The JSON objects of the (gzip'd, for a ``.gz``) JSON-lines file ``path``, each holding
    ``fields`` (name -> (what it must hold, its test)). Raises ValueError naming the file, its
    line and ``--data-dir``."""
    try:
        raw = (gzip.decompress(path.read_bytes()) if path.suffix == ".gz"
               else path.read_bytes()).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # BadGzipFile: OSError
        raise ValueError(f"--data-dir={data_dir}: {path}: cannot read it ({exc})") from exc
    rows = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"--data-dir={data_dir}: {path} line {n}: not JSON ({exc})") from exc
        missing = [f for f in fields if f not in row] if isinstance(row, dict) else list(fields)
        if missing:
            raise ValueError(f"--data-dir={data_dir}: {path} line {n}: a JSON object with "
                             f"{', '.join(fields)} is expected (no {', '.join(missing)})")
        for name, (what, test) in fields.items():  # a review's TypeError tracebacks (12-06)
            if not test(row[name]):
                raise ValueError(f"--data-dir={data_dir}: {path} line {n}: {name} must be "
                                 f"{what} (got {json.dumps(row[name])[:60]})")
        rows.append(row)
    return rows


def _mbpp_prompt(row: dict, shots: list[dict]) -> str:
    def block(r, with_code):
        tests = "\n".join(r["test_list"])
        head = (f"You are an expert Python programmer, and here is your task: {r['text']} "
                f"Your code should pass these tests:\n\n{tests}\n")
        return head + (f"[BEGIN]\n{r['code']}\n[DONE]\n" if with_code else "[BEGIN]\n")
    return "".join(block(s, True) for s in shots) + block(row, False)


class Client:
    """Greedy requests to an OpenAI-compatible server (``/v1/chat/completions``, ``/v1/completions``)."""

    def __init__(self, url: str, model: str | None, max_tokens: int) -> None:
        """``url``: the server's base URL, or its OpenAI base (``.../v1``). Raises ValueError
        naming ``--url`` or ``--model`` where the server lists no such model (SGLang answers
        any model name with its own model, so a typo would grade that one)."""
        self.url = url.rstrip("/").removesuffix("/v1")
        self.max_tokens = max_tokens
        listed = _json(requests.get(self.url + "/v1/models", timeout=30))
        ids = [m.get("id") for m in listed.get("data", [])] if isinstance(listed, dict) else []
        if not ids:
            raise ValueError(f"--url={url}: {self.url}/v1/models lists no model (is it an "
                             "OpenAI-compatible server?)")
        if model is not None and model not in ids:
            raise ValueError(f"--model={model}: the server at {self.url} serves {ids}")
        self.model = model or ids[0]

    def chat(self, content: str) -> str:
        r = requests.post(self.url + "/v1/chat/completions", json={
            "model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": content}]}, timeout=1800)
        return _json(r)["choices"][0]["message"]["content"] or ""

    def complete(self, prompt: str, stop: list[str]) -> str:
        r = requests.post(self.url + "/v1/completions", json={
            "model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
            "prompt": prompt, "stop": stop}, timeout=1800)
        return _json(r)["choices"][0]["text"] or ""


class ServerError(RuntimeError):
    """The server refused a request; the message is the server's own (e.g. a ``--max-tokens``
    past the model's context)."""


def _json(r: requests.Response):
    """``r``'s JSON body; raises ServerError with the server's message for an HTTP error."""
    if r.status_code >= 400:
        try:
            body = r.json()
            msg = body.get("message") or body.get("error") or body
        except ValueError:
            msg = r.text[:500]
        raise ServerError(f"{r.request.method} {r.url}: HTTP {r.status_code}: {msg}")
    return r.json()


def grade(task: str, row: dict, client: Client, *, timeout_s: float, mbpp_shots: list[dict]) -> dict:
    """Ask one problem and grade the reply: ``{"correct": bool, "prediction": ..., "output": ...}``."""
    if task == "gsm8k":
        out = client.chat(row["question"])
        pred = extract_gsm8k(out)
        return {"correct": gsm8k_correct(pred, row["answer"]), "prediction": pred, "output": out}
    if task == "math500":
        out = client.chat(row["problem"] + "\nPut the final answer in \\boxed{}.")
        pred = last_boxed(out)
        return {"correct": math_correct(pred, row["answer"]), "prediction": pred, "output": out}
    if task == "arc_easy":
        q = row["question"]
        labels = [c["label"] for c in q["choices"]]
        choices = "\n".join(f"{c['label']}. {c['text']}" for c in q["choices"])
        out = client.chat(f"{q['stem']}\n{choices}\nAnswer with the letter of the correct choice.")
        pred = extract_choice(out, labels)
        return {"correct": pred == row["answerKey"], "prediction": pred, "output": out}
    if task == "humaneval":
        out = truncate_humaneval(client.complete(row["prompt"], stop=["\ndef ", "\nclass ", "\nif __name__"]))
        program = f"{row['prompt']}{out}\n\n{row['test']}\n\ncheck({row['entry_point']})\n"
        ok, err = run_program(program, timeout_s)
        return {"correct": ok, "prediction": None, "output": out, "error": err}
    out = client.complete(_mbpp_prompt(row, mbpp_shots), stop=["[DONE]"])
    program = "\n".join([row.get("test_setup_code", ""), out, *row["test_list"]])
    ok, err = run_program(program, timeout_s)
    return {"correct": ok, "prediction": None, "output": out, "error": err}


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-rq tasks``."""
    from sglang_rq.quality.data import resolve_data_dir

    p = argparse.ArgumentParser(prog="sglang-rq tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True,
                   help="Server or router base URL, e.g. http://127.0.0.1:30000 (or its /v1 form)")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--limit", type=int, default=50, help="Problems to ask (from the start of the file).")
    p.add_argument("--concurrency", type=int, default=8, help="Requests in flight.")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--timeout-s", type=float, default=10.0, help="Wall-clock limit per program run.")
    p.add_argument("--model", default=None, help="Model name (default: first of /v1/models).")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="Task data (default: $SGLANG_RQ_DATA_DIR, else shared/data next to the "
                        "source checkout).")
    p.add_argument("--out", type=Path, default=None, help="Write per-problem results as JSON here.")
    a = p.parse_args(argv)
    if a.limit < 1 or a.concurrency < 1 or a.max_tokens < 1:
        p.error("--limit, --concurrency and --max-tokens must be >= 1")
    if (err := wait_error("--timeout-s", a.timeout_s)) is not None:
        p.error(err)
    if (err := out_file_error("--out", a.out)) is not None:
        p.error(err)
    try:
        a.data_dir = resolve_data_dir(a.data_dir)
        rows = load_problems(a.task, a.data_dir, a.limit)
        shots = ([r for r in _json_rows(a.data_dir / "mbpp/mbpp.jsonl", a.data_dir, FIELDS["mbpp"])
                  if r["task_id"] in (2, 3, 4)] if a.task == "mbpp" else [])
        client = Client(a.url, a.model, a.max_tokens)
    except (ValueError, FileNotFoundError, requests.RequestException, ServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.time()
    try:
        with cf.ThreadPoolExecutor(a.concurrency) as pool:
            results = list(pool.map(lambda r: grade(a.task, r, client, timeout_s=a.timeout_s,
                                                    mbpp_shots=shots), rows))
    except (requests.RequestException, ServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    acc = sum(r["correct"] for r in results) / len(results)
    summary = {"task": a.task, "url": a.url, "model": client.model, "n": len(results),
               "accuracy": acc, "seconds": time.time() - t0}
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary))
    return 0
