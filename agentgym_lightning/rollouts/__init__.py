"""The drivers: what runs episodes and collects their trajectories.

- :mod:`.base`: the one front-end signature (:class:`~.base.Rollouts`: ``rollout`` /
  ``iter_rollout``) and the one collect path (:func:`~.base.collect`);
- :mod:`.in_process`: the batched driver in this process (``rollout``, ``iter_rollout``,
  ``RolloutStream``, ``InProcessRollouts``), its state machine in :mod:`.driver`;
- :mod:`.ray_workers`: the same driver on Ray actors (``RayRolloutRunner``);
- :mod:`.served_policy`: the trainer's rollouts on those actors, its generator served to them;
- :mod:`.http_agents`: the HTTP driver for agents that run elsewhere (``StandaloneGateway``,
  ``agentgym-lightning serve``);
- :mod:`.evaluation`: ``evaluate``, the eval command's and the trainer's;
- :mod:`.schedule`: which tasks each training step runs (``TaskSchedule``);
- :mod:`.async_rollouts`: asynchronous training's producer thread and buffer of finished groups
  (``AsyncRollouts``, ``max_staleness`` >= 1).

They come after the env in the flow (agent -> gateway -> episode -> env -> rollouts -> training)
and nothing before them imports them (``bench/import_graph.py``'s layers).
"""
