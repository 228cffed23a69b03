"""Task runners: answer extraction on hand cases, and grading of the datasets' own reference
solutions (which must be graded correct) through the same program assembly as model output."""

from __future__ import annotations

import json
import re

import pytest

from sglang_rq.quality import tasks
from sglang_rq.quality.data import data_dir_with

DATA_DIR = data_dir_with("gsm8k")
needs_data = pytest.mark.skipif(DATA_DIR is None, reason="no data directory with gsm8k "
                                "(SGLANG_RQ_DATA_DIR or ../shared/data)")


def test_gsm8k_extraction():
    assert tasks.extract_gsm8k("so 3 + 4 = 7 apples.\n#### 1,234") == "1234"
    assert tasks.extract_gsm8k("She pays 12 then 18.") == "18"
    assert tasks.extract_gsm8k("no idea") is None
    assert tasks.gsm8k_correct("18", "work...\n#### 18")
    assert tasks.gsm8k_correct("18.00", "#### 18")
    assert not tasks.gsm8k_correct("17", "#### 18")
    assert not tasks.gsm8k_correct(None, "#### 18")


def test_math_extraction_and_normalisation():
    assert tasks.last_boxed(r"first \boxed{1} then \boxed{\frac{a}{b^{2}}}.") == r"\frac{a}{b^{2}}"
    assert tasks.last_boxed("nothing") is None
    assert tasks.math_correct(r"\dfrac{1}{2}", r"\frac12")
    assert tasks.math_correct(r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})")
    assert tasks.math_correct("90^\\circ", "90")
    assert tasks.math_correct("5.0", "5")
    assert not tasks.math_correct("6", "5")


def test_choice_extraction():
    labels = ["A", "B", "C", "D"]
    assert tasks.extract_choice("The answer is (B).", labels) == "B"
    assert tasks.extract_choice("C. Carbon dioxide", labels) == "C"
    assert tasks.extract_choice("Answer: 4", ["1", "2", "3", "4"]) == "4"
    assert tasks.extract_choice("Bananas", labels) is None  # letters inside words do not count
    # a review (12-06): the article "A" was read as choice A
    assert tasks.extract_choice("A plant needs light, so the answer is C.", labels) == "C"
    assert tasks.extract_choice("A plant needs light, so C.", labels) == "C"
    assert tasks.extract_choice("A", labels) == "A"
    assert tasks.extract_choice("(D) because of gravity", labels) == "D"
    assert tasks.extract_choice("I think A is right", labels) == "A"  # the last resort


def test_program_runner_pass_fail_timeout():
    assert tasks.run_program("assert 1 + 1 == 2", 10)[0]
    ok, err = tasks.run_program("assert 1 + 1 == 3", 10)
    assert not ok and "AssertionError" in err
    ok, err = tasks.run_program("while True: pass", 1.0)
    assert not ok and "timeout" in err


@needs_data
def test_reference_solutions_grade_correct():
    for row in tasks.load_problems("gsm8k", DATA_DIR, 20):
        assert tasks.gsm8k_correct(tasks.extract_gsm8k(row["answer"]), row["answer"])
    rows = tasks.load_problems("math500", DATA_DIR, 500)
    hits = sum(tasks.math_correct(tasks.last_boxed(r["solution"]), r["answer"]) for r in rows)
    assert hits / len(rows) > 0.9, hits  # boxed reference vs the answer field
    for row in tasks.load_problems("humaneval", DATA_DIR, 5):
        program = f"{row['prompt']}{row['canonical_solution']}\n\n{row['test']}\n\ncheck({row['entry_point']})\n"
        assert tasks.run_program(program, 20)[0], row["task_id"]
    for row in tasks.load_problems("mbpp", DATA_DIR, 5):
        assert row["task_id"] >= 11
        program = "\n".join([row.get("test_setup_code", ""), row["code"], *row["test_list"]])
        assert tasks.run_program(program, 20)[0], row["task_id"]
    row = tasks.load_problems("mbpp", DATA_DIR, 1)[0]
    name = re.search(r"assert\s+\(?\s*(\w+)\(", row["test_list"][0]).group(1)
    broken = "\n".join([row["code"], f"def {name}(*a, **k):\n    return None", *row["test_list"]])
    assert not tasks.run_program(broken, 20)[0]


@needs_data
def test_mbpp_prompt_is_three_shot():
    shots = [json.loads(x) for x in (DATA_DIR / "mbpp/mbpp.jsonl").read_text().splitlines()]
    shots = [r for r in shots if r["task_id"] in (2, 3, 4)]
    row = tasks.load_problems("mbpp", DATA_DIR, 1)[0]
    prompt = tasks._mbpp_prompt(row, shots)
    assert prompt.count("[BEGIN]") == 4 and prompt.count("[DONE]") == 3 and prompt.endswith("[BEGIN]\n")


def test_unknown_task_names_flag():
    with pytest.raises(ValueError, match="--task"):
        tasks.load_problems("mmlu", DATA_DIR, 1)


@pytest.mark.parametrize("task,content,needle", [
    ("humaneval", b"garbage", "cannot read it (Not a gzipped file"),
    # the fix's review: a gzip header over a damaged body (zlib.error), an empty file and MBPP
    # without its test split (ZeroDivisionError after the server was asked)
    ("humaneval", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", "cannot read it"),
    ("gsm8k", b"", "holds no gsm8k problems"),
    ("mbpp", b'{"task_id": 1, "text": "t", "code": "c", "test_list": []}\n',
     "holds no mbpp problems (task ids 11-510)"),
    ("gsm8k", b"\xff\xfe", "cannot read it ('utf-8' codec can't decode"),
    ("gsm8k", b"nope\n", "line 1: not JSON"),
    ("mbpp", b'{"text": "x"}\n', "line 1: a JSON object with task_id, text, code, test_list is "
                                 "expected (no task_id, code, test_list)"),
    ("arc_easy", b'{"question": {"stem": "s", "choices": []}, "answerKey": "A"}\n[1, 2]\n',
     "line 2: a JSON object with question, answerKey is expected"),
    # session 44: fields of the wrong type were TypeError tracebacks mid-run (robustness.md 11)
    ("gsm8k", b'{"question": 5, "answer": "4"}\n', "line 1: question must be a string (got 5)"),
    ("mbpp", b'{"task_id": "11", "text": "t", "code": "c", "test_list": []}\n',
     'line 1: task_id must be an integer (got "11")'),
    ("mbpp", b'{"task_id": 11, "text": "t", "code": "c", "test_list": "assert f()"}\n',
     "line 1: test_list must be a list of strings"),
    ("arc_easy", b'{"question": {"stem": "s", "choices": [{"label": "A"}]}, "answerKey": "A"}\n',
     "line 1: question must be an object with a string stem and choices")])
def test_malformed_data_files_name_the_file_and_flag(tmp_path, task, content, needle):
    """A seventh new-user review (session 42): a corrupt HumanEval .gz, an MBPP row without
    task_id and ARC rows that are lists were BadGzipFile, KeyError and TypeError tracebacks;
    non-JSON or non-UTF-8 files named neither the file nor --data-dir."""
    rel = {"humaneval": "humaneval/HumanEval.jsonl.gz", "gsm8k": "gsm8k/test.jsonl",
           "mbpp": "mbpp/mbpp.jsonl", "arc_easy": "arc_easy/test.jsonl"}[task]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        tasks.load_problems(task, tmp_path, 10)
    assert str(err.value).startswith(f"--data-dir={tmp_path}: {path}") and needle in str(err.value)
