"""The bundled sample: 12 multi-hop questions over 24 passages about an invented country.

Written by this project (every fact is made up, so no model knows the answers without
searching). It is a fallback for smoke tests and demos when no MuSiQue or HotpotQA download is
found, not a benchmark. :func:`build_sample` writes it in both official formats, so the same
loaders read it as they read the real data:

* ``musique/rag_sample_dev.json``: MuSiQue records (every passage as a paragraph of every
  question, ``is_supporting`` flags, ``question_decomposition`` with ``#k`` references);
* ``hotpotqa/rag_sample_dev.json``: HotpotQA records (``context`` of ``[title, sentences]``,
  ``supporting_facts`` of ``[title, sentence index]``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from agentgym_lightning.paths import build_once

__all__ = ["SAMPLE_PASSAGES", "SAMPLE_QUESTIONS", "sample_version", "musique_records", "hotpotqa_records",
           "build_sample", "ensure_sample"]

#: title -> sentences.
SAMPLE_PASSAGES: dict[str, list[str]] = {
    "Lake Orvell": [
        "Lake Orvell is a freshwater lake in the highlands of Kestria.",
        "The market town of Dunmere lies on its northern shore.",
        "The River Tessel flows out of the lake at its southern end.",
    ],
    "Dunmere": [
        "Dunmere is a market town on the northern shore of Lake Orvell.",
        "It was founded in 1412 by the wool merchant Aldric Vane.",
        "Since 2019 its mayor has been Helena Brask.",
    ],
    "Aldric Vane": [
        "Aldric Vane (1380-1449) was a wool merchant born in the port city of Saltreach.",
        "He founded the town of Dunmere and paid for the Vane Bridge.",
    ],
    "Saltreach": [
        "Saltreach is a port city on the western coast of Kestria, known for its shipyards.",
        "Its university, the Saltreach Academy, was established in 1502.",
    ],
    "Helena Brask": [
        "Helena Brask is a Kestrian politician who became mayor of Dunmere in 2019.",
        "She studied civil engineering at the Saltreach Academy.",
    ],
    "Vane Bridge": [
        "The Vane Bridge is a stone bridge over the River Tessel, completed in 1440.",
        "It was commissioned by Aldric Vane.",
    ],
    "River Tessel": [
        "The River Tessel flows from Lake Orvell to the sea at Saltreach.",
        "It is 212 kilometres long.",
    ],
    "Kestria": [
        "Kestria is a highland country.",
        "Its capital is Marrowgate and its currency is the kestrel crown.",
    ],
    "Marrowgate": [
        "Marrowgate is the capital and largest city of Kestria.",
        "The composer Ilse Navarre was born there in 1861.",
    ],
    "Ilse Navarre": [
        "Ilse Navarre (1861-1930) was a Kestrian composer.",
        "Her best-known work is the opera The Glass Orchard, first performed in 1894.",
    ],
    "The Glass Orchard": [
        "The Glass Orchard is an opera in three acts by Ilse Navarre.",
        "It premiered at the Orvell Opera House in Dunmere.",
    ],
    "Orvell Opera House": [
        "The Orvell Opera House is a theatre in Dunmere that opened in 1888.",
        "It was designed by the architect Tomas Reyl.",
    ],
    "Tomas Reyl": [
        "Tomas Reyl (1840-1902) was an architect born in Marrowgate.",
        "He also designed the central railway station of Saltreach.",
    ],
    "Mount Corra": [
        "Mount Corra is the highest mountain in Kestria, at 3,104 metres.",
        "The Pellam Observatory stands on its summit.",
    ],
    "Pellam Observatory": [
        "The Pellam Observatory was founded in 1790 by the Saltreach Academy.",
        "Its first director was the astronomer Ottilie Marsh.",
    ],
    "Ottilie Marsh": [
        "Ottilie Marsh (1751-1822) was an astronomer born in Dunmere.",
        "She catalogued more than four hundred comets.",
    ],
    # Distractors: near misses for the questions above.
    "Lake Ferrin": [
        "Lake Ferrin is a shallow lake in the southern lowlands of Kestria.",
        "The village of Brill lies on its eastern shore.",
    ],
    "Brill": [
        "Brill is a fishing village on Lake Ferrin, founded in 1530 by Oswin Tarr.",
        "Its mayor is Corwin Brask, a cousin of Helena Brask.",
    ],
    "Kestrel crown": [
        "The kestrel crown replaced the silver mark as the currency of Kestria in 1921.",
        "It is issued by the Bank of Marrowgate.",
    ],
    "Saltreach Shipyards": [
        "The Saltreach Shipyards have built ships since 1610.",
        "Their largest dry dock was designed by the engineer Hugo Pell.",
    ],
    "Marrowgate Conservatory": [
        "The Marrowgate Conservatory is a music school founded in 1870.",
        "The pianist Ada Renn taught there for forty years.",
    ],
    "Mount Esk": [
        "Mount Esk is a mountain of 2,410 metres in eastern Kestria.",
        "A weather station was built on it in 1902.",
    ],
    "Tessel Valley Railway": [
        "The Tessel Valley Railway runs along the River Tessel from Saltreach to Dunmere.",
        "It opened in 1871.",
    ],
    "Dunmere Cathedral": [
        "Dunmere Cathedral is a Gothic church begun in 1460.",
        "Its bell tower is 64 metres tall.",
    ],
}

#: Each question: its id, text, answer, aliases, HotpotQA type, and its hops as
#: ``(sub-question, sub-answer, supporting passage title)``; ``#k`` refers to hop k's answer.
SAMPLE_QUESTIONS: list[dict[str, Any]] = [
    {"id": "2hop__rs01", "question": "Who founded the town on the northern shore of Lake Orvell?",
     "answer": "Aldric Vane", "aliases": [], "type": "bridge",
     "hops": [("Which town lies on the northern shore of Lake Orvell?", "Dunmere", "Lake Orvell"),
              ("Who founded #1?", "Aldric Vane", "Dunmere")]},
    {"id": "2hop__rs02", "question": "In which city was the founder of Dunmere born?",
     "answer": "Saltreach", "aliases": [], "type": "bridge",
     "hops": [("Who founded Dunmere?", "Aldric Vane", "Dunmere"),
              ("In which city was #1 born?", "Saltreach", "Aldric Vane")]},
    {"id": "2hop__rs03", "question": "Where did the mayor of Dunmere study?",
     "answer": "Saltreach Academy", "aliases": ["the Saltreach Academy"], "type": "bridge",
     "hops": [("Who is the mayor of Dunmere?", "Helena Brask", "Dunmere"),
              ("Where did #1 study?", "Saltreach Academy", "Helena Brask")]},
    {"id": "2hop__rs04", "question": "In which year did the theatre where The Glass Orchard premiered open?",
     "answer": "1888", "aliases": [], "type": "bridge",
     "hops": [("Where did The Glass Orchard premiere?", "Orvell Opera House", "The Glass Orchard"),
              ("In which year did #1 open?", "1888", "Orvell Opera House")]},
    {"id": "3hop1__rs05", "question": "Who designed the theatre where Ilse Navarre's best-known work premiered?",
     "answer": "Tomas Reyl", "aliases": ["Reyl"], "type": "bridge",
     "hops": [("What is Ilse Navarre's best-known work?", "The Glass Orchard", "Ilse Navarre"),
              ("Where did #1 premiere?", "Orvell Opera House", "The Glass Orchard"),
              ("Who designed #2?", "Tomas Reyl", "Orvell Opera House")]},
    {"id": "2hop__rs06", "question": "How long is the river that the Vane Bridge crosses?",
     "answer": "212 kilometres", "aliases": ["212 km", "212 kilometers"], "type": "bridge",
     "hops": [("Which river does the Vane Bridge cross?", "River Tessel", "Vane Bridge"),
              ("How long is #1?", "212 kilometres", "River Tessel")]},
    {"id": "2hop__rs07", "question": "What is the currency of the country whose capital is Marrowgate?",
     "answer": "kestrel crown", "aliases": ["the kestrel crown"], "type": "bridge",
     "hops": [("Marrowgate is the capital of which country?", "Kestria", "Marrowgate"),
              ("What is the currency of #1?", "kestrel crown", "Kestria")]},
    {"id": "2hop__rs08", "question": "In which city was the composer of The Glass Orchard born?",
     "answer": "Marrowgate", "aliases": [], "type": "bridge",
     "hops": [("Who composed The Glass Orchard?", "Ilse Navarre", "The Glass Orchard"),
              ("In which city was #1 born?", "Marrowgate", "Marrowgate")]},
    {"id": "3hop1__rs09", "question": "How tall is the mountain whose observatory was first directed by Ottilie Marsh?",
     "answer": "3,104 metres", "aliases": ["3104 metres", "3,104 m", "3,104 meters"], "type": "bridge",
     "hops": [("Which observatory did Ottilie Marsh direct first?", "Pellam Observatory", "Pellam Observatory"),
              ("On which mountain does #1 stand?", "Mount Corra", "Mount Corra"),
              ("How tall is #2?", "3,104 metres", "Mount Corra")]},
    {"id": "2hop__rs10", "question": "Which institution founded the observatory on the summit of Mount Corra?",
     "answer": "Saltreach Academy", "aliases": ["the Saltreach Academy"], "type": "bridge",
     "hops": [("Which observatory stands on the summit of Mount Corra?", "Pellam Observatory", "Mount Corra"),
              ("Which institution founded #1?", "Saltreach Academy", "Pellam Observatory")]},
    {"id": "2hop__rs11", "question": "In which town was the first director of the Pellam Observatory born?",
     "answer": "Dunmere", "aliases": [], "type": "bridge",
     "hops": [("Who was the first director of the Pellam Observatory?", "Ottilie Marsh", "Pellam Observatory"),
              ("In which town was #1 born?", "Dunmere", "Ottilie Marsh")]},
    {"id": "2hop__rs12", "question": "Were Aldric Vane and Tomas Reyl born in the same city?",
     "answer": "no", "aliases": [], "type": "comparison",
     "hops": [("In which city was Aldric Vane born?", "Saltreach", "Aldric Vane"),
              ("In which city was Tomas Reyl born?", "Marrowgate", "Tomas Reyl")]},
]

#: The file name of the sample's questions, in each format's folder.
SAMPLE_FILE = "rag_sample_dev.json"


def _text(title: str) -> str:
    return " ".join(SAMPLE_PASSAGES[title])


def _supporting_titles(q: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(title for _, _, title in q["hops"]))


def musique_records() -> list[dict[str, Any]]:
    """The sample in MuSiQue's official format (one dict per question)."""
    titles = list(SAMPLE_PASSAGES)
    records = []
    for q in SAMPLE_QUESTIONS:
        support = set(_supporting_titles(q))
        paragraphs = [
            {"idx": i, "title": t, "paragraph_text": _text(t), "is_supporting": t in support}
            for i, t in enumerate(titles)
        ]
        decomposition = [
            {"id": n, "question": sub, "answer": ans, "paragraph_support_idx": titles.index(title)}
            for n, (sub, ans, title) in enumerate(q["hops"], 1)
        ]
        records.append({
            "id": q["id"], "paragraphs": paragraphs, "question": q["question"],
            "question_decomposition": decomposition, "answer": q["answer"],
            "answer_aliases": list(q["aliases"]), "answerable": True,
        })
    return records


def hotpotqa_records(distractors: int = 6) -> list[dict[str, Any]]:
    """The sample in HotpotQA's original format: supporting passages plus ``distractors`` others."""
    titles = list(SAMPLE_PASSAGES)
    records = []
    for i, q in enumerate(SAMPLE_QUESTIONS):
        support = _supporting_titles(q)
        others = [t for t in titles if t not in support]
        # A fixed, question-dependent choice of distractors (no RNG: the files are reproducible).
        picked = [others[(i * 5 + j * 3) % len(others)] for j in range(distractors)]
        context_titles = list(dict.fromkeys(support + picked))
        facts = [[t, s] for t in support for s in range(len(SAMPLE_PASSAGES[t]))]
        records.append({
            "_id": q["id"].split("__")[1], "question": q["question"], "answer": q["answer"],
            "type": q["type"], "level": "medium", "supporting_facts": facts,
            # HotpotQA's sentences carry their own separating space: " Second sentence."
            "context": [[t, [s if j == 0 else f" {s}" for j, s in enumerate(SAMPLE_PASSAGES[t])]]
                        for t in context_titles],
        })
    return records


def sample_version() -> str:
    """A short hash of the sample's content: a changed sample is built into a new folder."""
    blob = json.dumps([SAMPLE_PASSAGES, SAMPLE_QUESTIONS, SAMPLE_FILE], sort_keys=True, default=list)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:10]


def build_sample(dest: str | os.PathLike[str]) -> Path:
    """Write ``musique/`` and ``hotpotqa/`` (one dev file each) under ``dest``; returns ``dest``."""
    dest = Path(dest)
    for name, records in (("musique", musique_records()), ("hotpotqa", hotpotqa_records())):
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SAMPLE_FILE).write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    (dest / "SAMPLE.md").write_text(
        "Built by agentgym_lightning.envs.rag.sample: 12 invented multi-hop questions, not MuSiQue or "
        "HotpotQA.\nPoint the envs at real data with `agentgym-lightning data musique PATH` "
        "(or `data hotpotqa PATH`).\n",
        encoding="utf-8",
    )
    return dest


def ensure_sample(cache_root: str | os.PathLike[str]) -> Path:
    """The sample's folder under ``cache_root``, built (atomically) if it is not there yet."""
    def complete(p: Path) -> bool:
        return (p / "musique" / SAMPLE_FILE).is_file() and (p / "hotpotqa" / SAMPLE_FILE).is_file()

    return build_once(Path(cache_root) / f"rag-sample-{sample_version()}", build_sample, complete)