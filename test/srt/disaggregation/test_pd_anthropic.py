"""`/v1/messages` (Anthropic's Messages API) in a PD deployment started by `launch_pd` (default
model, real sglang-router), with the official `anthropic` client. The real router has no
/v1/messages, so the decode server serves it by running the request through the router's
/generate (`responses_via_router.generate_through_router`) and parsing the text itself: the same
greedy text as the router's chat completion, Anthropic's stream grammar, tool_choice any/tool
calls that validate against the input_schema, a tool_result turn, count_tokens and the error shape.
`/v1/responses` takes the same way (the router answers 501 for it): a function tool's call and its
`function_call_output` round trip."""

import os
import subprocess
import sys

import pytest
import requests

from sglang.test.anthropic_cases import CAPITAL_ASK, TOOLS, WEATHER_ASK, check_tool_use, collect_events
from sglang.test.fuzz.runner import assert_pools_restored
from sglang.test.server_utils import find_free_port, wait_for_health

pytestmark = pytest.mark.server

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd_anthropic")
    ports = [find_free_port() for _ in range(4)]
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_pd", "--model-path", "default",
                             "--port", str(ports[0]), "--prefill-port", str(ports[1]), "--decode-port", str(ports[2]),
                             "--bootstrap-port", str(ports[3]), "--",
                             "--tool-call-parser", "qwen25", "--constrained-json-max-whitespace-cnt", "2"],
                            stdout=open(logs / "pd.log", "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    urls = {name: f"http://127.0.0.1:{p}" for name, p in zip(("router", "prefill", "decode"), ports)}
    try:
        wait_for_health(urls["router"], timeout=300, process=proc)
        client = anthropic.Anthropic(base_url=urls["decode"], api_key="unused", max_retries=0, timeout=300)
        yield {**urls, "client": client}
        client.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def create(pd, **kw):
    kw.setdefault("model", "default")
    kw.setdefault("max_tokens", 24)
    kw.setdefault("messages", CAPITAL_ASK)
    return pd["client"].messages.create(**kw)


def test_router_has_no_messages_route_the_decode_server_serves_it(pd):
    r = requests.post(pd["router"] + "/v1/messages", timeout=60,
                      json={"model": "default", "max_tokens": 4, "messages": CAPITAL_ASK})
    assert r.status_code in (404, 405, 501), (r.status_code, r.text)  # why the decode server relays it
    msg = create(pd, system="Be brief.", extra_body=GREEDY)
    chat = openai.OpenAI(base_url=pd["router"] + "/v1", api_key="x", max_retries=0, timeout=300)
    ref = chat.chat.completions.create(model="default", max_tokens=24, temperature=0,
                                       messages=[{"role": "system", "content": "Be brief."}] + CAPITAL_ASK)
    chat.close()
    assert msg.content[0].text == ref.choices[0].message.content and "Paris" in msg.content[0].text
    assert msg.usage.output_tokens == ref.usage.completion_tokens
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    count = pd["client"].messages.count_tokens(model="default", system="Be brief.", messages=CAPITAL_ASK)
    assert count.input_tokens == ref.usage.prompt_tokens
    got = collect_events(create(pd, system="Be brief.", stream=True, extra_body=GREEDY))
    assert [b["text"] for b in got["blocks"]] == [msg.content[0].text]
    assert got["stop_reason"] == msg.stop_reason and got["usage"].output_tokens == msg.usage.output_tokens


def test_tools_and_a_tool_result_turn_through_the_router(pd):
    r = create(pd, messages=WEATHER_ASK, tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True},
               max_tokens=80, extra_body=GREEDY)
    assert r.stop_reason == "tool_use" and r.content
    for block in r.content:
        check_tool_use(block)
    got = collect_events(create(pd, messages=WEATHER_ASK, tools=TOOLS, stream=True, max_tokens=80,
                                tool_choice={"type": "tool", "name": "get_time"}, extra_body=GREEDY))
    (block,) = got["blocks"]
    assert got["stop_reason"] == "tool_use" and block["name"] == "get_time" and block["fragments"] > 1
    call = r.content[0]
    turn = WEATHER_ASK + [
        {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees"}]},
    ]
    answer = create(pd, messages=turn, tools=TOOLS, max_tokens=16, extra_body=GREEDY)
    assert answer.content[0].type == "text" and answer.stop_reason in ("end_turn", "max_tokens")
    with pytest.raises(anthropic.BadRequestError) as e:
        create(pd, messages=[{"role": "system", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert_pools_restored([pd["prefill"], pd["decode"]])


def test_responses_function_tool_round_trip_through_the_router(pd):
    from sglang.test.structured_output_cases import TOOLS as CHAT_TOOLS, check_call

    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in CHAT_TOOLS]
    client = openai.OpenAI(base_url=pd["decode"] + "/v1", api_key="x", max_retries=0, timeout=300)
    first = client.responses.create(model="default", input="Weather in Paris?", tools=tools, max_output_tokens=80,
                                    tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    check_call(call.name, call.arguments)
    second = client.responses.create(model="default", previous_response_id=first.id, tools=tools, tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
                                     max_output_tokens=12, temperature=0)
    assert second.status == "completed" and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens
    client.close()
