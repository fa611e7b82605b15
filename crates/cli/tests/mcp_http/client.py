"""Drives `microagent serve mcp --http` with the official MCP Python SDK.

argv[1] is a JSON object: {"url", "token"?, "cafile"?, "calls": [{"tool",
"args"}], "reads": [URI]}. One session: initialize, list the tools, make
the calls in turn, list the resources and templates, read the URIs. Prints
{"protocol", "server", "tools", "calls": [{"is_error", "structured",
"text"}], "resources", "templates", "reads": [{"contents"} or {"error",
"code"}]} as JSON on stdout.
"""

import asyncio
import json
import ssl
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(spec):
    headers = {}
    if spec.get("token"):
        headers["Authorization"] = "Bearer " + spec["token"]
    verify = True
    if spec.get("cafile"):
        verify = ssl.create_default_context(cafile=spec["cafile"])
    async with httpx2.AsyncClient(headers=headers, verify=verify, timeout=600) as http:
        async with streamable_http_client(spec["url"], http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                init = await session.initialize()
                tools = await session.list_tools()
                out = {
                    "protocol": init.protocol_version,
                    "server": init.server_info.name,
                    "tools": [t.name for t in tools.tools],
                    "calls": [],
                }
                for call in spec.get("calls", []):
                    result = await session.call_tool(call["tool"], call.get("args", {}))
                    out["calls"].append(
                        {
                            "is_error": bool(result.is_error),
                            "structured": result.structured_content,
                            "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
                        }
                    )
                out["resources"] = [r.uri for r in (await session.list_resources()).resources]
                templates = await session.list_resource_templates()
                out["templates"] = [t.uri_template for t in templates.resource_templates]
                out["reads"] = []
                for uri in spec.get("reads", []):
                    try:
                        read = await session.read_resource(uri)
                        out["reads"].append({"contents": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in read.contents]})
                    except Exception as e:  # an MCP error: its message and code
                        error = getattr(e, "error", None)
                        out["reads"].append({"error": str(e), "code": getattr(error, "code", None)})
    print(json.dumps(out))


asyncio.run(main(json.loads(sys.argv[1])))
