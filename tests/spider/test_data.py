"""The Spider loader, its search order, the bundled sample and the ``data spider`` command."""

from __future__ import annotations

import argparse
import json
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest

from agentgym_lightning.envs.spider import data as spider_data
from agentgym_lightning.envs.spider.data import (
    SpiderDataError,
    SpiderDataWarning,
    load_spider,
    resolve_spider_dir,
    validate_spider_dir,
)
from agentgym_lightning.envs.spider.sample import SAMPLE_DATABASES, SAMPLE_QUESTIONS, build_sample


@pytest.fixture(autouse=True)
def fresh_loader(monkeypatch):
    """Forget cached loads and the once-per-process sample notice."""
    monkeypatch.setattr(spider_data, "_cache", {})
    monkeypatch.setattr(spider_data, "_sample_noticed", False)


@pytest.mark.spider
def test_real_spider_counts_and_one_warning(spider_dir: Path):
    with pytest.warns(SpiderDataWarning) as record:
        dev = load_spider("dev", spider_dir)
    # Only the data warnings: the window also catches what the garbage collector reports of other
    # tests (a ResourceWarning for a socket they left open landed here once).
    data_warnings = [w for w in record if issubclass(w.category, SpiderDataWarning)]
    assert len(data_warnings) == 1 and "wta_1 (62)" in str(data_warnings[0].message), [f"{w.category.__name__}: {w.message}" for w in record]
    assert (len(dev), dev.num_skipped, dict(dev.skipped)) == (972, 62, {"wta_1": 62})
    assert dev.source == "argument" and not dev.is_sample
    ids = [e.id for e in dev.examples]
    assert ids[0] == "dev-0" and len(set(ids)) == 972  # ids keep the file's positions
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cached: no second warning
        load_spider("dev", spider_dir)
    with pytest.warns(SpiderDataWarning, match="baseball_1 \\(82\\), soccer_1 \\(14\\)"):
        train = load_spider("train", spider_dir)
    assert len(train) == 6904
    task = dev.examples[0].to_task()
    assert set(task) == {"id", "split", "db_id", "question", "query", "db_path"}
    assert Path(task["db_path"]).is_file()


def test_sample_fallback_says_so_once(isolated_cache: Path):
    with pytest.warns(SpiderDataWarning, match="agentgym-lightning data spider PATH") as record:
        dev = load_spider("dev")
        train = load_spider("train")
    assert len(record) == 1
    assert dev.is_sample and (len(dev), len(train)) == (22, 22)
    assert dev.root.parent == isolated_cache and dev.root.name.startswith("spider-sample-")
    assert {e.db_id for e in dev.examples}.isdisjoint({e.db_id for e in train.examples})  # as in Spider
    with pytest.raises(SpiderDataError, match="no Spider data found"):
        resolve_spider_dir(allow_sample=False)


def test_sample_content_is_sound(sample_dir: Path, evaluator):
    assert 40 <= len(SAMPLE_QUESTIONS) <= 50 and len(SAMPLE_DATABASES) == 4
    report = validate_spider_dir(sample_dir, check_gold=True)
    assert report.ok and report.gold_failures == [] and report.gold_checked == len(SAMPLE_QUESTIONS)
    empty = 0
    for split in ("dev", "train"):
        for ex in load_spider(split, sample_dir).examples:
            verdicts = evaluator.evaluate_all(ex.db_path, ex.query, ex.query)
            assert all(v.score == 1.0 for v in verdicts.values()), ex
            empty += not evaluator.gold_result(ex.db_path, ex.query).rows
    assert empty == 1  # one empty result, on purpose
    tables = json.loads((sample_dir / "tables.json").read_text())
    assert {t["db_id"] for t in tables} == set(SAMPLE_DATABASES)


def test_search_order(tmp_path: Path, sample_dir: Path, isolated_cache: Path, monkeypatch):
    other = build_sample(tmp_path / "other")
    # The imported copy in the cache...
    isolated_cache.mkdir(parents=True, exist_ok=True)
    (isolated_cache / "spider").symlink_to(sample_dir, target_is_directory=True)
    assert resolve_spider_dir() == (isolated_cache / "spider", "cache")
    # ...is beaten by the environment variable...
    monkeypatch.setenv(spider_data.ENV_VAR, str(other))
    assert resolve_spider_dir() == (other, "env")
    # ...which is beaten by data_dir.
    assert resolve_spider_dir(sample_dir) == (sample_dir, "argument")
    # An explicit location that is not Spider is an error, never a silent fallback.
    monkeypatch.setenv(spider_data.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(SpiderDataError, match="does not exist"):
        resolve_spider_dir()
    with pytest.raises(SpiderDataError, match="not a Spider folder"):
        resolve_spider_dir(tmp_path)


def test_zip_parent_folder_and_train_others(tmp_path: Path, sample_dir: Path):
    root = tmp_path / "download" / "spider"
    shutil.copytree(sample_dir, root)
    others = [{"db_id": "bakery_orders", "question": "Count customers.", "query": "SELECT count(*) FROM customer"}]
    (root / "train_others.json").write_text(json.dumps(others))
    train = load_spider("train", tmp_path / "download")  # the folder the zip unpacks into
    assert len(train) == 23 and train.examples[-1].question == "Count customers."
    with pytest.raises(ValueError, match="unknown Spider split"):
        load_spider("validation", root)


def test_missing_database_is_skipped_and_counted(tmp_path: Path, sample_dir: Path):
    root = shutil.copytree(sample_dir, tmp_path / "spider")
    shutil.rmtree(root / "database" / "city_transit")
    with pytest.warns(SpiderDataWarning, match="skipped 11 of 22 questions.*city_transit \\(11\\)"):
        dev = load_spider("dev", root)
    assert len(dev) == 11 and dev.num_skipped == 11


def test_malformed_questions(tmp_path: Path, sample_dir: Path):
    root = shutil.copytree(sample_dir, tmp_path / "spider")
    (root / "dev.json").write_text('[{"db_id": "school_library"}]')
    with pytest.raises(SpiderDataError, match="string db_id, question and query"):
        load_spider("dev", root)


# --------------------------------------------------------------------------- the command


def run_cli(*argv: str) -> int:
    from agentgym_lightning.commands import data as data_command

    parser = argparse.ArgumentParser(prog="agentgym-lightning")
    data_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", *argv])
    return int(args.func(args))


def test_data_spider_imports_a_folder(sample_dir: Path, isolated_cache: Path, capsys):
    assert run_cli("spider", str(sample_dir), "--check-gold") == 0
    out = capsys.readouterr().out
    assert "dev: 22 usable of 22 questions" in out and "failed: 0" in out
    target = isolated_cache / "spider"
    assert target.is_symlink() and target.resolve() == sample_dir.resolve()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # real (imported) data: no sample notice
        assert load_spider("dev").source == "cache"
    assert run_cli("spider") == 0
    assert "imported" in capsys.readouterr().out


def test_data_spider_rejects_other_folders(tmp_path: Path, isolated_cache: Path, capsys):
    assert run_cli("spider", str(tmp_path)) == 1
    assert "not a Spider folder" in capsys.readouterr().out
    assert not (isolated_cache / "spider").exists()


def test_data_spider_unpacks_a_zip(tmp_path: Path, sample_dir: Path, isolated_cache: Path):
    archive = tmp_path / "spider.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sample_dir.rglob("*"):
            if path.is_file():
                zf.write(path, Path("spider") / path.relative_to(sample_dir))
    assert run_cli("spider", str(archive)) == 0
    target = isolated_cache / "spider"
    assert (target / "database" / "school_library" / "school_library.sqlite").is_file() and not target.is_symlink()
    assert run_cli("spider", str(archive)) == 1  # a real copy is only replaced with --force
    assert run_cli("spider", str(archive), "--force") == 0
    assert [p.name for p in isolated_cache.iterdir() if p.name.startswith(".spider-")] == []


@pytest.mark.spider
def test_validate_real_spider(spider_dir: Path):
    report = validate_spider_dir(spider_dir)
    assert report.ok
    assert report.splits == {"dev": (972, 1034), "train": (6904, 7000)}
    assert report.missing_databases == {"dev": ["wta_1"], "train": ["baseball_1", "soccer_1"]}
    assert report.databases == 163 and report.tables_json_databases == 166
