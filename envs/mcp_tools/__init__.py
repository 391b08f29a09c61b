"""``lightning/MCP-v0``: train an agent on any MCP server's tools (see ``README.md``)."""
