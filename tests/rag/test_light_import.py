"""``import agentgym_lightning`` (and the CLI, the plugins, the RAG env modules) imports neither
chromadb nor torch: they load when the first RAG env is made."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import agentgym_lightning
from agentgym_lightning.plugin_manager import get_plugin_manager
from agentgym_lightning.cli import build_parser
get_plugin_manager()
build_parser()
import agentgym_lightning.envs.rag.env, agentgym_lightning.envs.rag.cli
heavy = sorted(m for m in ("chromadb", "torch", "sentence_transformers", "transformers", "onnxruntime") if m in sys.modules)
print(",".join(heavy) or "light")
"""


def test_importing_the_package_and_rag_modules_stays_light():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "light"
