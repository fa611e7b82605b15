#!/usr/bin/env python3
"""Other MCP servers' documented calls, in their argument shapes, served by
microagent (docs/mcp.md, "Calls as other MCP servers document them").

One scenario per server whose users we serve, each through the official
MCP Python SDK on one `microagent serve mcp` session over stdio:

- microsandbox: `sandbox_start` is `workspace_create(start: true)` with a
  memory size as a string, `sandbox_run_command` is `workspace_exec` with
  `command` and `args`, `sandbox_get_metrics` is `workspace_metrics` with
  namespace `*`;
- devbox: `workspace_create` with `services` (a service from an image
  pulled from a registry, reached from the workspace by its name),
  `server_list` rows with `host`, `workspace_list(user)`;
- microvm-orchestrator: `run_task`, then `wait_next_event` answering with
  `type` and `task_id`;
- agentkernel: `extend_ttl` without `by` (an hour), `snapshot_restore`
  without `as_name` (a new workspace `<workspace>-restored`).

    python3 seed_scenarios.py SERVICE_IMAGE REPO

SERVICE_IMAGE is a registry reference of an image whose command serves
HTTP on port 8080 (pulled over plain HTTP: a local registry); REPO an
allowlisted repository whose task command commits. MICROAGENT names the
binary (default `microagent` on PATH). Prints one JSON object of what each
scenario saw; exits 1 at the first refused call.
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


class Refused(Exception):
    pass


async def microsandbox(call) -> dict:
    made = await call(
        "workspace_create", name="ms", image="minimal", mem_mib="512m", start=True
    )
    ran = await call(
        "workspace_exec", name="ms", command="echo", args=["hello", "from microsandbox"]
    )
    metrics = await call("workspace_metrics", namespace="*")
    await call("workspace_delete", name="ms", force=True)
    return {
        "state": made["state"],
        "mem_mib": made["spec"]["mem_mib"],
        "stdout": ran["stdout"],
        "metrics_of": sorted(w["name"] for w in metrics["workspaces"]),
    }


async def devbox(call, service_image: str) -> dict:
    await call("image_pull", reference=service_image, insecure=True)
    made = await call(
        "workspace_create",
        name="dbx",
        image="minimal",
        start=True,
        services=[{"name": "web", "image": service_image, "ports": [8080]}],
    )
    # The service's command may still be starting its server.
    deadline = time.monotonic() + 120
    while True:
        fetched = await call(
            "workspace_exec", name="dbx", command="wget", args=["-qO-", "http://web:8080/"]
        )
        if fetched["exit_code"] == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    servers = await call("server_list")
    theirs = await call("workspace_list", user="someone-else")
    await call("workspace_delete", name="dbx", force=True)
    return {
        "state": made["state"],
        "services": [s["name"] for s in made["spec"]["services"]],
        "fetched": fetched["stdout"],
        "hosts": [s.get("host") for s in servers["servers"]],
        "someone_elses": theirs["count"],
    }


async def orchestrator(call, repo: str) -> dict:
    started = await call("run_task", description="from the orchestrator", repo=repo)
    ended = await call("wait_next_event", timeout_ms=900_000)
    return {
        "task_id": started["task_id"],
        "type": ended.get("type"),
        "event_task_id": ended.get("task_id"),
    }


async def agentkernel(call) -> dict:
    made = await call(
        "workspace_create", name="ak", image="minimal", start=True, ttl_secs=600
    )
    extended = await call("workspace_extend_ttl", name="ak")
    snapshot = await call("snapshot_take", workspace="ak")
    restored = await call("snapshot_restore", name=snapshot["name"])
    ran = await call("workspace_exec", name="ak-restored", command="hostname")
    for name in ("ak-restored", "ak"):
        await call("workspace_delete", name=name, force=True)
    await call("snapshot_delete", name=snapshot["name"])
    return {
        "ttl_secs": [made["spec"]["ttl_secs"], extended["spec"]["ttl_secs"]],
        "restored": restored["workspace"]["name"],
        "restored_state": restored["workspace"]["state"],
        "restored_ran": ran["exit_code"],
    }


async def run(service_image: str, repo: str) -> dict:
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
                    raise Refused(f"{tool} failed: {result.content[0].text}")
                return result.structured_content

            # Caught here: the SDK's task group would wrap it on the way out.
            try:
                return {
                    "microsandbox": await microsandbox(call),
                    "devbox": await devbox(call, service_image),
                    "orchestrator": await orchestrator(call, repo),
                    "agentkernel": await agentkernel(call),
                }
            except Refused as e:
                return {"refused": str(e)}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    seen = asyncio.run(run(sys.argv[1], sys.argv[2]))
    if "refused" in seen:
        print(seen["refused"], file=sys.stderr)
        sys.exit(1)
    print(json.dumps(seen))
