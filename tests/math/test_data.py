"""The GSM8K and Calc-X loaders, their search order, the bundled samples and the ``data`` commands."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from agentgym_lightning.cli import main
from agentgym_lightning.envs.math.answers import answers_match
from agentgym_lightning.envs.math.calculator import calculate
from agentgym_lightning.envs.math.data import MathDataError, MathDataWarning, load_calcx, load_gsm8k, resolve_data
from agentgym_lightning.envs.math.sample import CALCX_SAMPLE, GSM8K_SAMPLE


def test_real_gsm8k(gsm8k_dir: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # real data: no warning at all
        test = load_gsm8k("test", gsm8k_dir)
        train = load_gsm8k("train", gsm8k_dir)
    assert (len(test), len(train), test.source, test.is_sample) == (1319, 7473, "argument", False)
    first = test.tasks()[0]
    assert set(first) == {"id", "split", "question", "answer", "solution"}
    assert (first["id"], first["answer"]) == ("gsm8k-test-0", "18") and first["solution"].endswith("#### 18")
    assert load_gsm8k("test", gsm8k_dir) is test  # cached


def test_real_calcx_sample_file(calcx_file: Path):
    data = load_calcx("test", calcx_file)  # a file is its own split, whatever it is called
    assert len(data) == 10 and data.split == "test"
    tasks = {t["id"]: t for t in data.tasks()}
    assert tasks["ape210k__00384263"]["answer"] == "2/3"
    assert tasks["aqua_rat__0bgRP2fAiH8URR9A"]["answer"] == "C"
    assert {"chain", "result", "source"} <= set(tasks["ape210k__00384263"])


def test_search_order_argument_env_cache_sample(tmp_path: Path, monkeypatch, isolated_cache: Path):
    folder = tmp_path / "gsm"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps({"question": "q?", "answer": "x\n#### 5"}) + "\n")
    with pytest.warns(MathDataWarning, match="agentgym-lightning data gsm8k PATH") as record:
        assert resolve_data("gsm8k") == (None, "sample")
        assert resolve_data("gsm8k") == (None, "sample")
    assert len(record) == 1  # announced once
    assert main(["data", "gsm8k", str(folder)]) == 0
    assert (isolated_cache / "gsm8k").resolve() == folder.resolve()
    assert resolve_data("gsm8k") == (isolated_cache / "gsm8k", "cache")
    monkeypatch.setenv("AGENTGYM_LIGHTNING_GSM8K_DIR", str(folder))
    assert resolve_data("gsm8k") == (folder, "env")
    assert resolve_data("gsm8k", folder) == (folder, "argument")
    assert load_gsm8k("test").tasks()[0]["answer"] == "5"
    monkeypatch.setenv("AGENTGYM_LIGHTNING_GSM8K_DIR", str(tmp_path / "missing"))
    with pytest.raises(MathDataError, match="does not exist"):
        resolve_data("gsm8k")


def test_samples_are_announced_and_complete():
    with pytest.warns(MathDataWarning, match="bundled sample"):
        test = load_gsm8k("test")
    assert test.is_sample and len(test) == 8 and len(load_gsm8k("train")) == 8
    with pytest.warns(MathDataWarning, match="Calc-X"):
        assert len(load_calcx("test")) == 5
    with pytest.raises(MathDataError, match="splits test, train"):
        load_calcx("validation")


_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_GADGET = re.compile(r'<gadget id="calculator">(.*?)</gadget>\s*<output>(.*?)</output>')


def test_sample_arithmetic_is_right():
    """Every calculator annotation and gadget output in the samples is what the calculator says."""
    pairs = [p for records in GSM8K_SAMPLE.values() for r in records for p in _ANNOTATION.findall(r["answer"])]
    pairs += [p for records in CALCX_SAMPLE.values() for r in records for p in _GADGET.findall(r["chain"])]
    assert len(pairs) > 40
    for expression, value in pairs:
        assert answers_match(calculate(expression).text, value, 1e-6), (expression, value)


def test_malformed_records_and_unreadable_golds(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(MathDataError, match=r"bad.jsonl:1 must be a JSON object with question, answer"):
        load_gsm8k("test", bad)
    odd = tmp_path / "odd.jsonl"
    odd.write_text("\n".join(json.dumps(r) for r in [{"question": "a", "result": "7"}, {"question": "b", "result": "n/a"}]) + "\n")
    with pytest.warns(MathDataWarning, match="skipped 1 of 2 records"):
        data = load_calcx("test", odd)
    assert len(data) == 1 and data.skipped[0][0] == 2
    with pytest.raises(MathDataError, match="split 'train' needs"):
        load_calcx("train", tmp_path)


def test_data_commands(tmp_path: Path, capsys, calcx_file: Path):
    assert main(["data", "calcx"]) == 0
    assert "the bundled sample" in capsys.readouterr().out
    assert main(["data", "calcx", str(calcx_file.parent), "--no-import"]) == 0
    assert "sample: 10 problems, every gold answer readable" in capsys.readouterr().out
    assert main(["data", "calcx", str(tmp_path)]) == 1
    assert "holds no .jsonl files" in capsys.readouterr().out
    assert main(["data", "calcx", str(calcx_file.parent), "--copy"]) == 0
    assert main(["data", "calcx", str(calcx_file.parent)]) == 1  # a copy is there: needs --force
    assert "--force" in capsys.readouterr().err
    assert main(["data", "calcx", str(calcx_file.parent), "--force"]) == 0
