"""Retrieval for the RAG envs on the MuSiQue corpus (1,890 passages), measured in one run.

1. Index build: embedding the whole corpus with all-MiniLM-L6-v2 into a fresh chromadb index
   (seconds, passages/s), then reopening the cached index (seconds; nothing embedded).
2. Query latency of one search at a time (embed the query + chromadb top-5), p50/p99, over
   every gold sub-question; and chromadb alone (the query vector given), p50/p99.
3. Searches from many threads at once through the shared, batching retriever: 64 threads
   (``--threads``) each searching their share of the sub-questions, versus one thread doing all
   of them: throughput ratio and per-search latency p50/p99; the same 64 threads without
   batching (each search embedded on its own) for comparison.
4. 64 concurrent episodes of ``lightning/MuSiQue-v0`` searching at once: a scripted policy
   (each episode searches its gold sub-questions, then answers) through the batched driver,
   episodes/s at concurrency 64 versus 1, and the retriever's mean batch size.
5. recall@5 of the supporting paragraphs: each gold sub-question (``#k`` filled in with the
   earlier hop's answer) must find its own supporting paragraph; per question, the share of its
   supporting paragraphs in the union of its hops' top 5; and, as a baseline, the question
   alone.

    python bench/bench_rag.py [--data-dir ../shared/data/musique] [--index-dir DIR] [--threads 64]

The index is built in a temporary folder (``--index-dir`` keeps it and reuses it next time).
Timings on a shared machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:7.1f} ms  p99 {pct(values, 0.99) * 1000:7.1f} ms"


def threaded(n_threads: int, queries: list[str], search) -> tuple[float, list[float]]:
    """Run ``search(q)`` over ``queries`` split across ``n_threads`` threads started together."""
    shares = [queries[i::n_threads] for i in range(n_threads)]
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n_threads + 1)

    def worker(share: list[str]) -> None:
        barrier.wait()
        mine = []
        for q in share:
            t = time.perf_counter()
            search(q)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(s,)) for s in shares]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "musique"))
    parser.add_argument("--index-dir", default=None, help="keep the index here (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=64)
    args = parser.parse_args(argv)

    from agentgym_lightning.envs.rag.data import load_musique
    from agentgym_lightning.envs.rag.embeddings import load_embedder
    from agentgym_lightning.envs.rag.index import PassageIndex
    from agentgym_lightning.envs.rag.retriever import Retriever

    data = load_musique(data_dir=args.data_dir)
    hops = [s for e in data.examples for s in e.sub_questions if s.supporting_id]
    queries = [s.question for s in hops]
    print(f"MuSiQue {data.split}: {len(data)} questions, {len(data.corpus)} passages, {len(hops)} gold sub-questions")
    t = time.perf_counter()
    embedder = load_embedder()
    print(f"model load (sentence-transformers import included): {time.perf_counter() - t:.1f} s")

    tmp = tempfile.TemporaryDirectory(prefix="bench-rag-")
    index_dir = Path(args.index_dir) if args.index_dir else Path(tmp.name)

    # 1. build, reopen
    t = time.perf_counter()
    index = PassageIndex.open(data.corpus, embedder, index_dir)
    build = time.perf_counter() - t
    built = index.built
    index.close()
    t = time.perf_counter()
    index = PassageIndex.open(data.corpus, embedder, index_dir, progress=False)
    reopen = time.perf_counter() - t
    state = "built" if built else "opened from the cache (pass a fresh --index-dir to time a build)"
    print(f"\n1. index: {state} in {build:.1f} s ({len(data.corpus) / build:.1f} passages/s); "
          f"reopened in {reopen * 1000:.0f} ms ({build / reopen:.0f}x faster)")

    # 2. one search at a time
    retriever = Retriever(index)
    for q in queries[:5]:
        retriever.search(q, 5)  # warm up
    single = []
    for q in queries:
        t = time.perf_counter()
        retriever.search(q, 5)
        single.append(time.perf_counter() - t)
    vectors = embedder.embed(queries)
    chroma = []
    for i in range(len(queries)):
        t = time.perf_counter()
        index.search_vectors(vectors[i : i + 1], 5)
        chroma.append(time.perf_counter() - t)
    print(f"\n2. one search at a time ({len(queries)} queries): {ms(single)}  ({len(queries) / sum(single):.1f} searches/s)")
    print(f"   chromadb alone (vector given):       {ms(chroma)}")

    # 3. many threads at once
    workload = queries * max(1, (4 * args.threads) // len(queries) + 1)
    workload = workload[: 4 * args.threads]
    wall_1, lat_1 = threaded(1, workload, lambda q: retriever.search(q, 5))
    before = (retriever.queries, retriever.batches)
    wall_n, lat_n = threaded(args.threads, workload, lambda q: retriever.search(q, 5))
    batch = (retriever.queries - before[0]) / max(1, retriever.batches - before[1])
    wall_u, lat_u = threaded(args.threads, workload, lambda q: index.search([q], 5))
    print(f"\n3. {len(workload)} searches, 1 thread:          {len(workload) / wall_1:7.1f} searches/s  {ms(lat_1)}")
    print(f"   {args.threads} threads, batched:           {len(workload) / wall_n:7.1f} searches/s  {ms(lat_n)}"
          f"  (mean batch {batch:.1f}; {wall_1 / wall_n:.2f}x the throughput of 1 thread)")
    print(f"   {args.threads} threads, one by one:        {len(workload) / wall_u:7.1f} searches/s  {ms(lat_u)}"
          f"  (batching: {wall_u / wall_n:.2f}x)")

    # 4. episodes searching at once, through the env and the batched driver
    from agentgym_lightning.envs.rag.env import make_env
    from agentgym_lightning.rollouts.in_process import rollout

    by_question = {e.question: e for e in data.examples}

    def scripted(requests):
        out = []
        for r in requests:
            question = r.messages[1]["content"].removeprefix("Question: ")
            example = by_question[question]
            searched = sum(1 for m in r.messages if m["role"] == "assistant")
            if searched < len(example.sub_questions):
                out.append(f"Search: {example.sub_questions[searched].question}")
            else:
                out.append(f"Answer: {example.answers[0]}")
        return out

    rates = {}
    for concurrency in (1, args.episodes):
        retriever.queries = retriever.batches = 0
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trajectories = rollout(lambda: make_env("musique", data_dir=args.data_dir, retriever=retriever, max_turns=6),
                                   scripted, episodes=args.episodes, concurrency=concurrency, progress=False)
        wall = time.perf_counter() - t
        rates[concurrency] = (len(trajectories) / wall, retriever.queries / max(1, retriever.batches),
                              statistics.mean(t.final_reward or 0.0 for t in trajectories))
    r1, rn = rates[1], rates[args.episodes]
    print(f"\n4. {args.episodes} episodes searching their sub-questions then answering (scripted policy):")
    print(f"   concurrency 1:  {r1[0]:6.2f} episodes/s (mean batch {r1[1]:.1f}, mean F1 {r1[2]:.3f})")
    print(f"   concurrency {args.episodes}: {rn[0]:6.2f} episodes/s (mean batch {rn[1]:.1f}); "
          f"{rn[0] / r1[0]:.2f}x concurrency 1")

    # 5. recall@5
    found = index.search(queries, 5)
    hop_hits = [s.supporting_id in {h.passage.id for h in f} for s, f in zip(hops, found)]
    per_question, by_question_only = [], []
    results = iter(found)
    question_hits = index.search([e.question for e in data.examples], 5)
    for e, qh in zip(data.examples, question_hits):
        union = set()
        for s in e.sub_questions:
            if s.supporting_id:
                union |= {h.passage.id for h in next(results)}
        support = set(e.supporting_ids)
        per_question.append(len(support & union) / len(support))
        by_question_only.append(len(support & {h.passage.id for h in qh}) / len(support))
    print(f"\n5. recall@5 of supporting paragraphs over {len(data.corpus)} passages:")
    print(f"   each gold sub-question finds its own paragraph: {statistics.mean(hop_hits):.3f} "
          f"({sum(hop_hits)}/{len(hop_hits)})")
    print(f"   per question, union of its sub-questions' top 5: {statistics.mean(per_question):.3f}")
    print(f"   per question, the question alone (baseline):     {statistics.mean(by_question_only):.3f}")
    retriever.close()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
