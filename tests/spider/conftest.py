"""Fixtures for the Spider tests: the real data in ../shared/data/spider, and the bundled sample
built into a temporary cache (never the user's)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

#: The real Spider data: ../shared/data/spider from the repository root.
SPIDER_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider"


def have_spider() -> bool:
    return (SPIDER_DIR / "dev.json").is_file() and (SPIDER_DIR / "database").is_dir()


@pytest.fixture(scope="session")
def spider_dir() -> Path:
    if not have_spider():
        pytest.skip(f"needs the real Spider data at {SPIDER_DIR} (../shared/data/spider from the repo root)")
    return SPIDER_DIR


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample, built once into a temporary folder."""
    from agentgym_lightning.envs.spider.sample import build_sample

    return build_sample(tmp_path_factory.mktemp("spider-sample"))


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache folder, no Spider environment variable, and the bundled
    sample's notice unsaid (it is said once per process: a test elsewhere may have said it)."""
    from agentgym_lightning.envs.spider import data as spider_data

    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTGYM_LIGHTNING_CACHE", str(cache))
    monkeypatch.delenv("AGENTGYM_LIGHTNING_SPIDER_DIR", raising=False)
    monkeypatch.setattr(spider_data, "_sample_noticed", False)
    return cache


@pytest.fixture(scope="session")
def evaluator():
    from agentgym_lightning.envs.spider.evaluation import SpiderEvaluator

    ev = SpiderEvaluator()
    yield ev
    ev.close()


def hash_tree(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def writable_copy(src: Path, dest: Path) -> Path:
    """Copy a Spider-layout folder and make every file writable, so only the sandbox stands
    between a hostile query and the bytes."""
    shutil.copytree(src, dest)
    for path in dest.rglob("*"):
        path.chmod(path.stat().st_mode | stat.S_IWUSR | (stat.S_IXUSR if path.is_dir() else 0))
    dest.chmod(dest.stat().st_mode | stat.S_IWUSR)
    assert os.access(next(dest.rglob("*.sqlite")), os.W_OK)
    return dest


@pytest.fixture
def tree_hash():
    """``hash_tree`` as a fixture (test modules here are not a package)."""
    return hash_tree


@pytest.fixture
def copy_writable():
    """``writable_copy`` as a fixture."""
    return writable_copy
