"""An MCP server with two tools, as a user of the ``mcp`` SDK writes one (its ``MCPServer``, the
FastMCP of mcp 1.x), started by the tests over stdio or streamable HTTP on 127.0.0.1.

``python two_tools_server.py [stdio | http PORT] [--misbehave die|hang|garbage]``: with
``--misbehave``, calling ``add`` kills the server, never returns, or writes garbage where the
JSON-RPC answer belongs (stdio).
"""

import argparse
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

CAPITALS = {"France": "Paris", "Japan": "Tokyo"}

parser = argparse.ArgumentParser()
parser.add_argument("transport", nargs="?", default="stdio", choices=["stdio", "http"])
parser.add_argument("port", nargs="?", type=int, default=0)
parser.add_argument("--misbehave", choices=["die", "hang", "garbage"])
args = parser.parse_args()

server = MCPServer("two-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    if args.misbehave == "die":
        os._exit(3)
    if args.misbehave == "hang":
        time.sleep(3600)
    if args.misbehave == "garbage":
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
        time.sleep(3600)
    return a + b


@server.tool()
def capital(country: str) -> str:
    """The capital city of a country."""
    if country not in CAPITALS:
        raise ToolError(f"no capital known for {country!r}")
    return CAPITALS[country]


if args.transport == "stdio":
    server.run()
else:
    server.run("streamable-http", host="127.0.0.1", port=args.port)
