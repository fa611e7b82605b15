"""Drives `microagent serve mcp --http` as a task-aware client of protocol
2026-07-28 (stateless: server/discover, no initialize) with the official
MCP Python SDK, which has no tasks API of its own: it declares the
`io.modelcontextprotocol/tasks` extension and claims `task` results, and
sends tasks/get and tasks/cancel as requests.

argv[1] is a JSON object: {"url", "calls": [{"tool", "args", "cancel"?}]}.
Each call is made with tasks allowed; a task is polled until it ends, or
with "cancel": true cancelled at once and then polled. Prints one line of
JSON: {"protocol", "calls": [{"task": bool, "status", "result", "error",
"polls"}]}.
"""

import json
import sys
from typing import Any, Literal

import anyio
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result

TERMINAL = {"completed", "failed", "cancelled"}


class CreateTaskResult(Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class GetTaskResult(Result):
    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class Ack(Result):
    result_type: str | None = None


class TaskIdParams(RequestParams):
    task_id: str


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


async def _unused(task, ctx: ClaimContext) -> CallToolResult:
    raise RuntimeError("this client polls its tasks itself")


class TasksExtension(ClientExtension):
    identifier = "io.modelcontextprotocol/tasks"

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_unused)]


async def poll(session, task_id, delay):
    polls = 0
    while True:
        polls += 1
        got = await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), GetTaskResult)
        if got.status in TERMINAL:
            return got, polls
        await anyio.sleep(delay)


async def main(spec):
    out = {"calls": []}
    async with Client(spec["url"], extensions=[TasksExtension()]) as client:
        out["protocol"] = client.protocol_version
        session = client.session
        for call in spec["calls"]:
            answer = await session.call_tool(call["tool"], call.get("args", {}), allow_claimed=True)
            if not isinstance(answer, CreateTaskResult):
                out["calls"].append({"task": False, "result": answer.model_dump(mode="json", by_alias=True)})
                continue
            if call.get("cancel"):
                await session.send_request(CancelTask(params=TaskIdParams(task_id=answer.task_id)), Ack)
            delay = (answer.poll_interval_ms or 1000) / 1000
            got, polls = await poll(session, answer.task_id, min(delay, 0.5))
            out["calls"].append(
                {"task": True, "status": got.status, "result": got.result, "error": got.error, "polls": polls}
            )
    print(json.dumps(out), flush=True)


anyio.run(main, json.loads(sys.argv[1]))
