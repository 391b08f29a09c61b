"""Math with a calculator tool: ``lightning/GSM8K-v0``, ``lightning/CalcX-v0``, ``lightning/Arithmetic-v0``.

- :mod:`.calculator`: the safe calculator (parsed and checked, never executed);
- :mod:`.answers`: finding, reading and comparing final answers (sympy);
- :mod:`.arithmetic`: generated arithmetic problems at a chosen difficulty, with a held-out set;
- :mod:`.data`: the GSM8K and Calc-X loaders and the bundled-sample fallback;
- :mod:`.sample`: the small GSM8K- and Calc-X-style samples the project wrote itself;
- :mod:`.agent`: the calculator agent on the ``openai`` client (tool calls, or a text protocol);
- :mod:`.verifier`: a verifier after that agent, accepting or correcting its answer (two agents);
- :mod:`.env`: the ``make_env`` functions (Gymnasium entry points);
- :mod:`.gold`: gold-calculator episodes of GSM8K's train problems, the SFT warm start's data;
- :mod:`.cli`: ``agentgym-lightning data gsm8k PATH`` and ``data calcx PATH``.

Importing this package stays light (no env, no gateway); import the submodules you need.
"""
