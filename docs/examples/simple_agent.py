#!/usr/bin/env python3
"""A simple agent on the official MCP Python SDK (docs/agent-guide.md).

It starts `microagent serve mcp` over stdio, then: creates a workspace with
a repository cloned in (started, and gone when this session ends), runs the
repository's tests there, and reads a file of it. It prints one JSON line
with what it saw, and exits 1 when the tests failed.

    python3 simple_agent.py REPO [TEST_COMMAND]

REPO is an allowlisted repository (`microagent repo allow PATH`);
TEST_COMMAND runs in its clone, /workspace/repo (default `sh test.sh`).
MICROAGENT names the binary (default `microagent` on PATH).
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def run(repo: str, test_command: str) -> dict:
    server = StdioServerParameters(
        command=os.environ.get("MICROAGENT", "microagent"),
        args=["serve", "mcp"],
        env=dict(os.environ),
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()

            async def call(tool: str, **args) -> dict:
                result = await session.call_tool(tool, args)
                if result.is_error:
                    raise SystemExit(f"{tool} failed: {result.content[0].text}")
                return result.structured_content

            # 1. A workspace with the repository cloned in, running when the
            #    call returns; session_scoped: it goes when this session ends.
            made = await call(
                "workspace_create",
                name="simple-agent",
                image="debian",
                repo=repo,
                start=True,
                session_scoped=True,
            )
            # 2. The repository's tests, in its clone.
            tests = await call(
                "workspace_exec",
                name="simple-agent",
                shell=test_command,
                cwd="/workspace/repo",
                timeout_secs=600,
            )
            # 3. A file of the repository.
            readme = await call(
                "file_read", name="simple-agent", path="/workspace/repo/README"
            )
            return {
                "workspace": made["name"],
                "state": made["state"],
                "exit_code": tests["exit_code"],
                "stdout": tests["stdout"],
                "readme": readme["content"],
            }


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    test_command = sys.argv[2] if len(sys.argv) > 2 else "sh test.sh"
    seen = asyncio.run(run(sys.argv[1], test_command))
    print(json.dumps(seen))
    return 0 if seen["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
