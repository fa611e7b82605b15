"""Drives `microagent serve mcp` with the official MCP Python SDK.

argv[1] is a JSON object: {"url", "token"?, "cafile"?} for Streamable HTTP,
or {"stdio": [command, args...], "env": {...}} to start the server as a
subprocess; then "calls": [{"tool", "args", "timeout"?}] (a call past its
timeout is abandoned, which cancels it) or {"subscribe": URI, "then": call,
"timeout"?} (subscribed to the resource, the call made, and its update
awaited: through subscriptions/listen at protocol 2026-07-28, else
resources/subscribe) or {"watch": PATH, "name", "then": call, "until":
[kind]} (a file watch read until those kinds came), "reads": [URI], and
"hold":
true to keep the session open after printing. One session: initialize, list
the tools, make the calls in turn, list the resources and templates, read
the URIs ("hold": then wait for stdin to close); "modern": true discovers
protocol 2026-07-28 instead of initializing. Prints one line of JSON
on stdout: {"protocol", "server", "tools",
"calls": [{"is_error", "structured", "text", "links", "images", "resources"} or {"is_error", "abandoned"}
or {"via", "honored"?, "then_error", "updated"} or {"watch", "then_error", "events"}
or {"error", "code"}],
"resources", "templates",
"reads": [{"contents"} or {"error", "code"}]}.
"""

import asyncio
import contextlib
import json
import os
import ssl
import sys

import httpx2
from mcp import ClientSession
from mcp.client.subscriptions import listen
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


async def subscribed(session, step, updates):
    """Subscribes to step["subscribe"], makes step["then"]'s call, then waits
    up to step["timeout"] s for the resource's update."""
    uri, then, timeout = step["subscribe"], step["then"], step.get("timeout", 60)
    try:
        if session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            async with listen(session, resource_subscriptions=[uri]) as sub:
                honored = sub.honored.resource_subscriptions or []
                result = await session.call_tool(then["tool"], then.get("args", {}))
                try:
                    event = await asyncio.wait_for(sub.__anext__(), timeout)
                    updated = getattr(event, "uri", None)
                except asyncio.TimeoutError:
                    updated = None
            return {
                "is_error": False,
                "via": "listen",
                "honored": honored,
                "then_error": bool(result.is_error),
                "updated": updated,
            }
        await session.subscribe_resource(uri)
        result = await session.call_tool(then["tool"], then.get("args", {}))
        try:
            updated = await asyncio.wait_for(updates.get(), timeout)
        except asyncio.TimeoutError:
            updated = None
        await session.unsubscribe_resource(uri)
        return {"is_error": False, "via": "subscribe", "then_error": bool(result.is_error), "updated": updated}
    except Exception as e:  # an MCP error: its message and code
        error = getattr(e, "error", None)
        return {"is_error": True, "error": str(e), "code": getattr(error, "code", None)}


async def watched(session, step):
    """file_watch of step["watch"] in step["name"], step["then"]'s call, then
    file_watch_events until every kind in step["until"] was seen (at most
    five reads), then file_unwatch."""
    started = await session.call_tool("file_watch", {"name": step["name"], "path": step["watch"]})
    if started.is_error:
        return {"is_error": True, "text": [c.text for c in started.content if getattr(c, "type", "") == "text"]}
    watch = started.structured_content["watch"]
    then = step["then"]
    result = await session.call_tool(then["tool"], then.get("args", {}))
    events, since = [], 0
    for _ in range(5):
        got = await session.call_tool("file_watch_events", {"watch": watch, "since": since, "timeout_ms": 10000})
        since = got.structured_content["next"]
        events += [[e["kind"], e["path"]] for e in got.structured_content["events"]]
        if all(any(kind == e[0] for e in events) for kind in step["until"]):
            break
    gone = await session.call_tool("file_unwatch", {"watch": watch})
    return {"is_error": bool(gone.is_error), "watch": watch, "then_error": bool(result.is_error), "events": events}


async def run(session, spec, updates):
    if spec.get("modern"):
        # 2026-07-28: server/discover instead of the initialize handshake.
        await session.discover()
        server = session.server_info.name if getattr(session, "server_info", None) else None
    else:
        server = (await session.initialize()).server_info.name
    tools = await session.list_tools()
    out = {
        "protocol": session.protocol_version,
        "server": server,
        "tools": [t.name for t in tools.tools],
        "calls": [],
    }
    for call in spec.get("calls", []):
        if "subscribe" in call:
            out["calls"].append(await subscribed(session, call, updates))
            continue
        if "watch" in call:
            out["calls"].append(await watched(session, call))
            continue
        if "timeout" in call:
            # Abandoned after that long: the SDK sends notifications/cancelled.
            try:
                result = await session.call_tool(
                    call["tool"], call.get("args", {}), read_timeout_seconds=call["timeout"]
                )
            except Exception as e:
                out["calls"].append({"is_error": True, "abandoned": str(e)})
                continue
        else:
            result = await session.call_tool(call["tool"], call.get("args", {}))
        out["calls"].append(
            {
                "is_error": bool(result.is_error),
                "structured": result.structured_content,
                "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
                "links": [str(c.uri) for c in result.content if getattr(c, "type", "") == "resource_link"],
                "images": [{"mime": getattr(c, "mime_type", None) or getattr(c, "mimeType", None), "data": c.data} for c in result.content if getattr(c, "type", "") == "image"],
                "resources": [c.resource.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content if getattr(c, "type", "") == "resource"],
            }
        )
    out["resources"] = [r.uri for r in (await session.list_resources()).resources]
    templates = await session.list_resource_templates()
    out["templates"] = [t.uri_template for t in templates.resource_templates]
    out["reads"] = []
    for uri in spec.get("reads", []):
        try:
            read = await session.read_resource(uri)
            contents = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in read.contents]
            out["reads"].append({"contents": contents})
        except Exception as e:  # an MCP error: its message and code
            error = getattr(e, "error", None)
            out["reads"].append({"error": str(e), "code": getattr(error, "code", None)})
    print(json.dumps(out), flush=True)
    if spec.get("hold"):
        # Until stdin closes; then the session ends as a client ends it.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def main(spec):
    async with contextlib.AsyncExitStack() as stack:
        if "stdio" in spec:
            command = spec["stdio"]
            params = StdioServerParameters(
                command=command[0], args=command[1:], env={**os.environ, **spec.get("env", {})}
            )
            streams = await stack.enter_async_context(stdio_client(params))
        else:
            headers = {}
            if spec.get("token"):
                headers["Authorization"] = "Bearer " + spec["token"]
            verify = True
            if spec.get("cafile"):
                verify = ssl.create_default_context(cafile=spec["cafile"])
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, verify=verify, timeout=1800)
            )
            streams = await stack.enter_async_context(streamable_http_client(spec["url"], http_client=http))
        updates = asyncio.Queue()

        async def on_message(message):
            # resources/subscribe's updates come as session notifications.
            note = getattr(message, "root", message)
            if getattr(note, "method", None) == "notifications/resources/updated":
                await updates.put(str(note.params.uri))

        session = await stack.enter_async_context(
            ClientSession(streams[0], streams[1], message_handler=on_message)
        )
        await run(session, spec, updates)


asyncio.run(main(json.loads(sys.argv[1])))
