"""Spider text-to-SQL environment (``lightning/Spider-v0``).

- :mod:`.data`: the Spider loader (official layout) and the bundled-sample fallback;
- :mod:`.sample`: the 44-question sample the project writes itself;
- :mod:`.evaluation`: execution accuracy, ``official`` and ``strict``;
- :mod:`.sandbox`: read-only, time-limited execution of predicted SQL;
- :mod:`.schema`: the schema text of prompts;
- :mod:`.agent`: the write / execute / check / rewrite agent on the ``openai`` client;
- :mod:`.env`: ``make_env`` (the Gymnasium entry point);
- :mod:`.cli`: ``agentgym-lightning data spider PATH``.

Importing this package stays light (no env, no gateway); import the submodules you need.
"""
