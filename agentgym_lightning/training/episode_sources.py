"""Where a run's episodes are: run folders and trajectory files, read as one list of episodes.

A source is a run folder (every episode file in its ``trajectories/``: an RL run's training
episodes, those it trained on and those dynamic sampling set aside; and ``rollouts/``: an SFT run's
rounds; never ``eval/``, the held-out episodes, which must not become training data) or a
trajectory JSONL file (``eval --output``). SFT learns from them (:mod:`.sft.episodes`) and
``agentgym-lightning pass-rates`` counts each task's attempts and successes in them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentgym_lightning.trajectory import Trajectory, load_trajectories

__all__ = ["RUN_FOLDERS", "source_files", "load_sources"]

#: Episode files of a run folder: an RL run's training episodes, an SFT run's rounds (never eval/:
#: the held-out episodes must not be trained on).
RUN_FOLDERS = ("trajectories", "rollouts")


def source_files(sources: Sequence[str | Path], what: str = "episode source") -> list[Path]:
    """The episode files of ``sources`` (run folders or JSONL files), in a fixed order;
    ``FileNotFoundError`` naming a source that is neither, or a run folder without episodes
    (``what`` names the source in that message, e.g. ``"SFT source"``)."""
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(p for folder in RUN_FOLDERS for p in (path / folder).glob("*.jsonl"))
            if not found:
                raise FileNotFoundError(
                    f"{what} {path} holds no episodes: a run folder has them in {', '.join(f'{f}/' for f in RUN_FOLDERS)}; "
                    "or pass a trajectory JSONL file"
                )
            files.extend(found)
        else:
            raise FileNotFoundError(f"{what} {path}: no such run folder or trajectory file")
    return files


def load_sources(sources: Sequence[str | Path], what: str = "episode source") -> list[Trajectory]:
    """Every episode of ``sources`` (see :func:`source_files`)."""
    return [t for path in source_files(sources, what) for t in load_trajectories(path)]
