"""Math problem files: JSONL, JSON and Parquet rows in the common shapes, and their errors."""

import json
import sys

import pytest

from fp8rl.errors import ConfigError, DataError
from fp8rl.tasks import DEFAULT_TEMPLATE, FIXTURE_PATH, MathTask, get_task

DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
    '\n\nWhat is 17 * 2?\n\nRemember to put your answer on its own line after "Answer:".'
)
DAPO_ROW = {
    "data_source": "math_dapo",
    "prompt": [{"content": DAPO_PROMPT, "role": "user"}],
    "ability": "MATH",
    "reward_model": {"ground_truth": "34", "style": "rule-based"},
    "extra_info": {"index": "a1"},
}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_deepscaler_shape_gets_the_default_template(tmp_path):
    f = write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"problem": "What is 1+1?", "answer": "2", "solution": "It is \\boxed{2}."},
            {"problem": "Half of 1?", "answer": "\\frac{1}{2}"},
        ],
    )
    samples = MathTask(train_path=f).samples("train")
    assert [s.answer for s in samples] == ["2", "\\frac{1}{2}"]
    assert samples[0].question == "What is 1+1?"
    assert (
        samples[0].prompt
        == "What is 1+1? Let's think step by step and output the final answer within \\boxed{}."
    )
    assert samples[0].prompt == DEFAULT_TEMPLATE.replace("{question}", "What is 1+1?")
    assert samples[1].meta == {"source": str(f), "row": "line 2"}


def test_solution_only_and_gsm8k_answers(tmp_path):
    f = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"problem": "p", "solution": "First \\boxed{1}, finally $\\boxed{\\frac{3}{4}}$."},
            {"question": "q", "answer": "Natalia sold 48/2 = 24 clips.\n#### 72"},
            {"prompt": "r", "ground_truth": 5},
        ],
    )
    assert [s.answer for s in MathTask(test_path=f).samples("test")] == ["\\frac{3}{4}", "72", "5"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_dapo_nested_shape_is_used_verbatim(tmp_path, fmt):
    path = tmp_path / f"dapo.{fmt}"
    (write_jsonl if fmt == "jsonl" else write_parquet)(path, [DAPO_ROW, DAPO_ROW])
    samples = MathTask(train_path=path).samples("train")
    assert len(samples) == 2
    assert samples[0].answer == "34"
    assert samples[0].prompt == samples[0].question == DAPO_PROMPT
    assert samples[1].meta["row"] == ("line 2" if fmt == "jsonl" else "row 1")


def test_explicit_template_applies_to_chat_rows_too(tmp_path):
    f = write_jsonl(tmp_path / "dapo.jsonl", [DAPO_ROW])
    s = MathTask(train_path=f, template="Q: {question}\nA:").samples("train")[0]
    assert s.prompt == "Q: " + DAPO_PROMPT + "\nA:"


def test_explicit_keys_and_dotted_paths(tmp_path):
    f = write_jsonl(
        tmp_path / "custom.jsonl",
        [{"input": {"text": "What?"}, "target": "7", "answer": "not this"}],
    )
    s = MathTask(train_path=f, prompt_key="input.text", answer_key="target").samples("train")[0]
    assert (s.question, s.answer) == ("What?", "7")


def test_parquet_and_json_array_and_several_files(tmp_path):
    a = write_parquet(
        tmp_path / "a.parquet", [{"problem": "p1", "answer": "1"}, {"problem": "p2", "answer": "2"}]
    )
    b = tmp_path / "b.json"
    b.write_text(json.dumps([{"problem": "p3", "answer": "3"}]))
    samples = MathTask(train_path=[a, b]).samples("train")
    assert [s.answer for s in samples] == ["1", "2", "3"]
    assert [s.meta["row"] for s in samples] == ["row 0", "row 1", "row 0"]


def test_invalid_json_line_names_file_and_line(tmp_path):
    f = write_jsonl(
        tmp_path / "bad.jsonl", [{"problem": "p", "answer": "1"}, "", '{"problem": "p",']
    )
    with pytest.raises(DataError, match=r"bad\.jsonl: line 3: invalid JSON"):
        MathTask(train_path=f).samples("train")


def test_missing_answer_names_file_row_and_keys(tmp_path):
    f = write_jsonl(
        tmp_path / "noans.jsonl", [{"problem": "p", "answer": "1"}, {"problem": "p", "hint": "h"}]
    )
    with pytest.raises(
        DataError,
        match=(
            r"noans\.jsonl: line 2: no answer field .*'reward_model\.ground_truth'.*"
            r"\['hint', 'problem'\]"
        ),
    ):
        MathTask(train_path=f).samples("train")


def test_missing_configured_key(tmp_path):
    f = write_jsonl(tmp_path / "k.jsonl", [{"problem": "p", "answer": "1"}])
    with pytest.raises(
        DataError, match=r"k\.jsonl: line 1: no question field \(looked for 'query'"
    ):
        MathTask(train_path=f, prompt_key="query").samples("train")


@pytest.mark.parametrize(
    "row,message",
    [
        (
            {"problem": "p", "answer": ["1", "2"]},
            r"field 'answer' must be text or a number, found \['1', '2'\]",
        ),
        ({"problem": "p", "answer": True}, "field 'answer' must be text or a number"),
        ({"problem": "   ", "answer": "1"}, "field 'problem' is empty"),
        ({"problem": "p", "answer": " "}, "field 'answer' is empty"),
        (
            {"problem": 3, "answer": "1"},
            "field 'problem' must be text or a chat message list, found 3",
        ),
        (
            {"prompt": [{"role": "system", "content": "hi"}], "answer": "1"},
            "field 'prompt' is a message list without a user message",
        ),
        (
            {"problem": "p", "solution": "no box here"},
            r"field 'solution' is a solution without a \\boxed\{\} answer: 'no box here'",
        ),
        (["not", "an", "object"], "expected an object"),
    ],
)
def test_malformed_rows_name_field_and_value(tmp_path, row, message):
    f = write_jsonl(tmp_path / "rows.jsonl", [{"problem": "ok", "answer": "1"}, row])
    with pytest.raises(DataError, match=r"rows\.jsonl: line 2: " + message):
        MathTask(train_path=f).samples("train")


def test_parquet_bad_row_is_named(tmp_path):
    f = write_parquet(
        tmp_path / "t.parquet", [{"problem": "p", "answer": "1"}, {"problem": "p", "answer": None}]
    )
    with pytest.raises(DataError, match=r"t\.parquet: row 1: no answer field"):
        MathTask(train_path=f).samples("train")


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        MathTask(train_path=tmp_path / "nope.jsonl").samples("train")
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows"):
        MathTask(train_path=empty).samples("train")
    csv = tmp_path / "data.csv"
    csv.write_text("problem,answer\n")
    with pytest.raises(DataError, match=r"data\.csv: unknown file type '\.csv'"):
        MathTask(train_path=csv).samples("train")
    obj = tmp_path / "obj.json"
    obj.write_text("{}")
    with pytest.raises(DataError, match=r"obj\.json: expected a JSON array"):
        MathTask(train_path=obj).samples("train")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable Parquet file"):
        MathTask(train_path=junk).samples("train")


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    f = tmp_path / "x.parquet"
    f.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"x\.parquet: reading Parquet needs pyarrow"):
        MathTask(train_path=f).samples("train")


def test_split_without_files_and_unknown_split(tmp_path):
    with pytest.raises(ConfigError, match="config key 'test_path'"):
        MathTask(train_path=FIXTURE_PATH).samples("test")
    with pytest.raises(ConfigError, match="config key 'split'"):
        MathTask(train_path=FIXTURE_PATH).samples("dev")


def test_config_errors():
    with pytest.raises(ConfigError, match="template"):
        MathTask(template="no placeholder")
    with pytest.raises(ConfigError, match="timeout_s"):
        MathTask(timeout_s=0)
    with pytest.raises(ConfigError, match="workers"):
        MathTask(workers=-1)
    with pytest.raises(ConfigError, match="stop_strings"):
        MathTask(stop_strings=["</s>", ""])  # "" would cut every response to nothing


def test_shipped_fixture_loads_through_the_registry():
    task = get_task("math", train_path=FIXTURE_PATH)
    samples = task.samples("train")
    assert 30 <= len(samples) <= 40
    assert samples[0].answer == "\\frac{3}{4}"
