"""``--env openenv:URL``: an OpenEnv environment server driven by a chat agent (see ``README.md``)."""
