"""The Responses API's tools and items <-> the chat pipeline (`serving_responses.py`).

In: function tools (`{"type": "function", "name", "description", "parameters"}`) become chat
function tools and `tool_choice` ("auto" / "none" / "required" / `{"type": "function", "name"}`)
the chat route's; other tool kinds (web search, file search, MCP, ...) are OpenAI's hosted tools and
refused by name. Input items: `message`; `function_call` (a call of an earlier turn) joins the
assistant message before it (or starts one) as a tool call; `function_call_output` becomes a `tool`
message; `reasoning` (an earlier turn's reasoning item) becomes the next assistant message's
`reasoning_content`.

Out: the chat route's `ChoiceOutput` pieces become output items in OpenAI's order of appearance: a
`reasoning` item (its text in `content`, `reasoning_text`), a `message` item (`output_text`), one
`function_call` item per call (`call_id`, `name`, `arguments`). `ResponseItemStream` turns streamed
pieces into OpenAI's events: response.output_item.added / .done around each item, with
response.reasoning_text.delta / .done, response.content_part.added / response.output_text.delta /
.done / response.content_part.done, or response.function_call_arguments.delta / .done inside.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ----------------------------------------------------------------------------- in


def chat_tools(tools: List[Dict[str, Any]]) -> Optional[List[Dict[str, Any]]]:
    out = []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ValueError(f"tools[{i}]: tools of type '{kind}' are OpenAI's hosted tools; this server runs "
                             "function tools only.")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ValueError(f"tools[{i}]: a function tool needs a 'name'.")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out or None


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ValueError(f"tool_choice {choice!r}: only 'auto', 'none', 'required' or "
                     "{'type': 'function', 'name': ...} are supported by this server.")


def call_messages(item: Dict[str, Any], msgs: List[dict], pending_reasoning: List[str]) -> None:
    """A `function_call` / `function_call_output` / `reasoning` input item -> the chat messages."""
    kind = item.get("type")
    if kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        pending_reasoning.append("".join(p.get("text", "") for p in parts if isinstance(p, dict)))
        return
    if not isinstance(item.get("call_id"), str) or not item["call_id"]:
        raise ValueError(f"A '{kind}' input item needs a 'call_id'.")
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = json.dumps(output)
        msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        return
    if not isinstance(item.get("name"), str):
        raise ValueError("A 'function_call' input item needs a 'name'.")
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
    last = msgs[-1] if msgs else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": ""}
        msgs.append(last)
    last.setdefault("tool_calls", []).append(call)
    if pending_reasoning:
        last["reasoning_content"] = "".join(pending_reasoning)
        pending_reasoning.clear()


# ----------------------------------------------------------------------------- out


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def message_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def whole_items(content: Optional[str], reasoning: Optional[str], tool_calls: List[dict]) -> List[dict]:
    items = []
    if reasoning:
        items.append(reasoning_item(_new_id("rs"), reasoning, "completed"))
    if content:
        items.append(message_item(_new_id("msg"), content, "completed"))
    for call in tool_calls:
        fn = call["function"]
        items.append(function_call_item(_new_id("fc"), call["id"], fn["name"], fn["arguments"], "completed"))
    return items


def assistant_turn(items: List[dict]) -> dict:
    """The chat message a response's output items stand for (stored for previous_response_id)."""
    turn: Dict[str, Any] = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "message":
            turn["content"] += "".join(p["text"] for p in item["content"])
        elif item["type"] == "reasoning":
            turn["reasoning_content"] = "".join(p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            turn.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item["arguments"]}})
    return turn


class ResponseItemStream:
    """Streamed pieces (`ChoiceOutput.delta` / `.end`) -> Responses events, as `event(type, **fields)`
    payload calls. `items` holds the finished output items."""

    def __init__(self, event: Callable[..., bytes]):
        self.event = event
        self.items: List[dict] = []
        self._open: Optional[Tuple[str, dict]] = None  # (kind, item) of the open item
        self._text = ""
        self._calls: Dict[int, dict] = {}  # chat tool index -> its open item

    def pieces(self, pieces: List[dict]) -> List[bytes]:
        out: List[bytes] = []
        for piece in pieces:
            if piece.get("reasoning_content"):
                out += self._text_delta("reasoning", piece["reasoning_content"])
            if piece.get("content"):
                out += self._text_delta("message", piece["content"])
            for call in piece.get("tool_calls") or []:
                out += self._tool_call(call)
        return out

    def close(self) -> List[bytes]:
        if self._open is None:
            return []
        kind, item = self._open
        index, out = len(self.items), []
        if kind == "reasoning":
            done = reasoning_item(item["id"], self._text, "completed")
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=self._text))
        elif kind == "message":
            done = message_item(item["id"], self._text, "completed")
            part = done["content"][0]
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=self._text, logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=part))
        else:
            done = function_call_item(item["id"], item["call_id"], item["name"], self._text, "completed")
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  name=item["name"], arguments=self._text))
        out.append(self.event("response.output_item.done", output_index=index, item=done))
        self.items.append(done)
        self._open, self._text = None, ""
        return out

    def _start(self, kind: str, item: dict) -> List[bytes]:
        out = self.close()
        self._open = (kind, item)
        index = len(self.items)
        out.append(self.event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                         "logprobs": []}))
        return out

    def _text_delta(self, kind: str, text: str) -> List[bytes]:
        out: List[bytes] = []
        if self._open is None or self._open[0] != kind:
            prefix, make = ("rs", reasoning_item) if kind == "reasoning" else ("msg", message_item)
            out += self._start(kind, make(_new_id(prefix), "", "in_progress"))
        self._text += text
        item_id, index = self._open[1]["id"], len(self.items)
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self.event(name, item_id=item_id, output_index=index, content_index=0, delta=text, **extra))
        return out

    def _tool_call(self, call: dict) -> List[bytes]:
        fn = call.get("function") or {}
        out: List[bytes] = []
        if fn.get("name") is not None:
            item = function_call_item(_new_id("fc"), call["id"], fn["name"], "", "in_progress")
            out += self._start("function_call", item)
            self._calls[call.get("index", 0)] = item
        args = fn.get("arguments")
        if args and self._open is not None and self._open[1] is self._calls.get(call.get("index", 0)):
            self._text += args
            out.append(self.event("response.function_call_arguments.delta", item_id=self._open[1]["id"],
                                  output_index=len(self.items), delta=args))
        return out
