"""Loading MuSiQue and HotpotQA (official formats), where the data is found, and the sample."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from agentgym_lightning.cli import main as cli_main
from agentgym_lightning.envs.rag import data as rag_data
from agentgym_lightning.envs.rag.data import RagDataError, RagDataWarning, load_hotpotqa, load_musique, passage_id
from agentgym_lightning.envs.rag.sample import SAMPLE_PASSAGES, SAMPLE_QUESTIONS


def test_musique_shared_data(musique_dir: Path):
    data = load_musique(data_dir=musique_dir)
    assert data.split == "train" and data.source == "argument" and len(data) == 100
    assert len(data.corpus) == 1890  # the corpus file holds every question's paragraphs
    first = data.examples[0]
    assert first.id == "2hop__150763_14904" and first.kind == "2hop"
    assert first.answers == ("G. Stanley Hall", "Stanley Hall")
    by_id = {p.id: p for p in data.corpus}
    assert [by_id[i].title for i in first.supporting_ids] == ["Journal of Psychotherapy Integration", "Adolescence"]
    # "#1" is filled in with hop 1's answer; each hop names its supporting passage.
    hop1, hop2 = first.sub_questions
    assert hop1.answer == "American Psychological Association"
    assert hop2.question == "Who was the first president of American Psychological Association ?"
    assert {hop1.supporting_id, hop2.supporting_id} == set(first.supporting_ids)
    assert all(e.supporting_ids and e.sub_questions for e in data.examples)
    assert all(s.supporting_id in by_id for e in data.examples for s in e.sub_questions)


def test_hotpotqa_shared_data_both_formats(hotpotqa_dir: Path):
    dev = load_hotpotqa(data_dir=hotpotqa_dir)  # IRCoT format, dev picked by default
    assert dev.split == "dev" and len(dev) == 500 and len(dev.corpus) == 4858
    assert dev.examples[0].answers == ("Chief of Protocol",)
    assert all(len(e.supporting_ids) == 2 for e in dev.examples)
    train = load_hotpotqa("train", hotpotqa_dir)  # HotpotQA's original format + a corpus file
    assert len(train) == 100 and len(train.corpus) == 994
    first = train.examples[0]
    assert first.answers == ("a spirit",) and first.kind == "bridge" and len(first.supporting_ids) == 2
    by_id = {p.id: p for p in train.corpus}
    assert {by_id[i].title for i in first.supporting_ids} == {"Alû", "Lilu (mythology)"}


def test_data_dir_may_be_a_folder_of_data_sets_or_a_file(musique_dir: Path):
    assert len(load_musique(data_dir=musique_dir.parent)) == 100
    assert len(load_musique(data_dir=musique_dir / "hipporag_v1_musique_train.json")) == 100


def test_environment_variable_then_import_then_sample(musique_dir: Path, isolated_cache: Path, monkeypatch, capsys):
    monkeypatch.setattr(rag_data, "_noticed", set())
    with pytest.warns(RagDataWarning, match="bundled 12-question sample"):
        sample = load_musique()
    assert sample.is_sample and len(sample) == 12 and str(isolated_cache) in str(sample.files[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # announced once per process
        assert load_musique().is_sample

    assert cli_main(["data", "musique", str(musique_dir)]) == 0
    assert "100 questions, 1890 passages" in capsys.readouterr().out
    assert (isolated_cache / "musique").is_symlink()
    assert load_musique().source == "cache"
    assert cli_main(["data", "musique"]) == 0
    assert "imported" in capsys.readouterr().out

    monkeypatch.setenv("AGENTGYM_LIGHTNING_MUSIQUE_DIR", str(isolated_cache / "nowhere"))
    with pytest.raises(RagDataError, match="does not exist"):
        load_musique()  # an explicit location never falls back to the sample


def test_bad_folders_and_records_are_clear_errors(tmp_path: Path):
    with pytest.raises(RagDataError, match="no question file"):
        load_musique(data_dir=tmp_path)
    (tmp_path / "x_train.json").write_text("[]")
    with pytest.raises(RagDataError, match="no dev question file"):
        load_musique("dev", tmp_path)
    (tmp_path / "x_train.json").write_text("{not json")
    with pytest.raises(RagDataError, match="not valid JSON"):
        load_musique(data_dir=tmp_path)
    (tmp_path / "x_train.json").write_text(json.dumps([{"id": "q", "question": "?"}]))
    with pytest.raises(RagDataError, match=r"x_train.json\[0\] lacks answer, paragraphs"):
        load_musique(data_dir=tmp_path)
    assert cli_main(["data", "hotpotqa", "--no-import", str(tmp_path / "missing")]) == 1


def test_unanswerable_musique_questions_are_skipped_and_counted(tmp_path: Path):
    record = {"id": "2hop__1_2", "question": "q?", "answer": "a", "answer_aliases": [], "answerable": True,
              "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "a text", "is_supporting": True}]}
    lines = [record, {**record, "id": "2hop__3_4", "answerable": False}]
    (tmp_path / "musique_full_v1.0_dev.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    with pytest.warns(RagDataWarning, match="skipped 1 unanswerable"):
        data = load_musique(data_dir=tmp_path)
    assert [e.id for e in data.examples] == ["2hop__1_2"] and data.skipped == {"unanswerable": 1}
    assert data.examples[0].supporting_ids == (passage_id("T", "a text"),)


def test_the_sample_reads_the_same_in_both_formats(isolated_cache: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RagDataWarning)
        musique, hotpot = load_musique(), load_hotpotqa()
    assert len(musique) == len(hotpot) == len(SAMPLE_QUESTIONS)
    assert len(musique.corpus) == len(SAMPLE_PASSAGES)
    for m, h, q in zip(musique.examples, hotpot.examples, SAMPLE_QUESTIONS):
        assert m.question == h.question == q["question"] and m.answers[0] == h.answers[0] == q["answer"]
        assert set(m.supporting_ids) == set(h.supporting_ids)  # the same passages, by content hash
        assert [s.answer for s in m.sub_questions] == [a for _, a, _ in q["hops"]]
        assert "#" not in " ".join(s.question for s in m.sub_questions)
