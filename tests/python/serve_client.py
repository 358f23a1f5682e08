"""The official `openai` Python client against a running `meshtrain serve`: completions, chat,
streaming, n > 1, stop sequences, logprobs, errors and 32 concurrent streams. (A client that
disconnects is tested from C++ with a raw socket: the SDK may keep a closed stream's
connection to reuse it.) Run by tests/e2e/serve_e2e_test.cpp, which starts the server.

  python3 serve_client.py --base-url http://127.0.0.1:PORT/v1 --model NAME --api-key KEY \\
       --prompt TEXT --expect-greedy TEXT

Prints "ok <check>" or "FAIL <check>: <why>" per check; exits with the number of failures.
"""
import argparse
import asyncio
import json
import re
import traceback
import urllib.error
import urllib.request

import openai


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ["--base-url", "--model", "--api-key", "--prompt", "--expect-greedy"]:
        p.add_argument(name, required=True)
    return p.parse_args()


opts = parse_args()
root = re.sub(r"/v1$", "", opts.base_url)
client = openai.OpenAI(base_url=opts.base_url, api_key=opts.api_key, max_retries=0, timeout=120)
model, prompt = opts.model, opts.prompt
greedy = opts.expect_greedy  # `meshtrain generate`'s text: prompt + 24 greedy tokens
failures = 0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def run(name):
    """Runs the decorated check at once and reports it."""
    def wrap(fn):
        global failures
        try:
            fn()
            print(f"ok {name}", flush=True)
        except Exception as e:  # every failure is reported, the rest still run
            failures += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (line {where.lineno})", flush=True)
        return fn
    return wrap


def expect_status(status, fn, words=None):
    try:
        fn()
    except openai.APIStatusError as e:
        check(e.status_code == status, f"status {e.status_code}, expected {status}: {e.message}")
        if words:
            check(words in str(e.message), f"message {e.message!r} lacks {words!r}")
        return e
    raise AssertionError(f"no error, expected {status}")


def get(path, headers=None):
    """(status, body) of a GET on the server's root, whatever the status."""
    req = urllib.request.Request(root + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def collect(chunks):
    texts, finish, usage = {}, {}, None
    for chunk in chunks:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, usage


def stream_text(**params):
    return collect(client.completions.create(**params, stream=True, stream_options={"include_usage": True}))


base = dict(model=model, prompt=prompt, max_tokens=24, temperature=0)
state = {"completion": "", "chat": ""}


@run("models.list names the served model")
def _():
    ids = [m.id for m in client.models.list().data]
    check(ids == [model], f"ids {ids}")


@run("greedy completion equals meshtrain generate")
def _():
    r = client.completions.create(**base, echo=True)
    check(r.object == "text_completion", f"object {r.object}")
    check(r.choices[0].text == greedy, f"text {r.choices[0].text!r} vs {greedy!r}")
    plain = client.completions.create(**base)
    state["completion"] = completion = plain.choices[0].text
    check(prompt + completion == greedy, f"without echo: {completion!r}")
    u = plain.usage
    check(u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens, str(u))
    if plain.choices[0].finish_reason == "length":
        check(u.completion_tokens == 24, f"finish length, usage {u}")
    else:
        check(u.completion_tokens <= 24, f"finish {plain.choices[0].finish_reason}, usage {u}")


@run("a list of prompts answers each, in order")
def _():
    r = client.completions.create(**{**base, "prompt": [prompt, "ROMEO:"]})
    check([c.index for c in r.choices] == [0, 1], str(r.choices))
    check(r.choices[0].text == state["completion"], f"choice 0 {r.choices[0].text!r}")


@run("n = 3 seeded samples: three choices, reproducible")
def _():
    p = dict(model=model, prompt=prompt, max_tokens=16, temperature=1.0, n=3, seed=1234)
    a, b = client.completions.create(**p), client.completions.create(**p)
    check(len(a.choices) == 3, f"{len(a.choices)} choices")
    check([c.index for c in a.choices] == [0, 1, 2], "indices")
    check([c.text for c in a.choices] == [c.text for c in b.choices], "not reproducible")
    check(len({c.text for c in a.choices}) > 1, "all choices equal")
    check(a.usage.completion_tokens <= 48, str(a.usage))


@run("stop sequence ends the text before it")
def _():
    completion = state["completion"]
    check(len(completion) >= 8, f"completion too short: {completion!r}")
    stop = completion[4:7]
    r = client.completions.create(**base, stop=[stop, "zzzzzz"])
    want = completion[:completion.index(stop)]
    check(r.choices[0].text == want, f"text {r.choices[0].text!r} want {want!r}")
    check(r.choices[0].finish_reason == "stop", f"finish {r.choices[0].finish_reason}")
    texts, finish, _ = stream_text(**base, stop=stop)
    check(texts.get(0) == want, f"streamed {texts.get(0)!r}")
    check(finish.get(0) == "stop", f"streamed finish {finish.get(0)}")


@run("streamed completion equals the whole one, usage last")
def _():
    texts, finish, usage = stream_text(**base)
    check(texts.get(0) == state["completion"], f"streamed {texts.get(0)!r}")
    check(usage and usage.completion_tokens > 0 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
          f"usage {usage}")
    check(finish.get(0) in ("length", "stop"), f"finish {finish.get(0)}")


messages = [{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "Speak of the moon."}]


@run("chat completion (plain template) equals the completion of its rendering")
def _():
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0)
    check(r.object == "chat.completion", f"object {r.object}")
    m = r.choices[0].message
    check(m.role == "assistant" and isinstance(m.content, str), str(m))
    state["chat"] = m.content
    rendered = "system: You are a poet.\nuser: Speak of the moon.\nassistant:"
    c = client.completions.create(model=model, prompt=rendered, max_tokens=20, temperature=0)
    check(c.choices[0].text == m.content, f"chat {m.content!r} vs completion {c.choices[0].text!r}")
    check(r.usage.prompt_tokens == c.usage.prompt_tokens, f"prompt tokens {r.usage.prompt_tokens} vs {c.usage.prompt_tokens}")


@run("chat streaming: role first, then the same content")
def _():
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, first, finish, usage = "", None, None, None
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"object {chunk.object}")
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if first is None:
                first = c.delta
            text += c.delta.content or ""
            if c.finish_reason:
                finish = c.finish_reason
    check(first is not None and first.role == "assistant", f"first delta {first}")
    check(text == state["chat"], f"streamed {text!r}")
    check(finish in ("length", "stop"), f"finish {finish}")
    check(usage and usage.completion_tokens > 0, f"usage {usage}")


@run("logprobs: the greedy token is the most likely")
def _():
    r = client.completions.create(**{**base, "max_tokens": 8}, logprobs=2)
    lp = r.choices[0].logprobs
    check(lp and len(lp.tokens) == len(lp.token_logprobs) and lp.tokens, str(lp))
    check("".join(lp.tokens) == r.choices[0].text or r.choices[0].finish_reason == "stop", "tokens do not spell the text")
    for i, token_logprob in enumerate(lp.token_logprobs):
        top = lp.top_logprobs[i]
        best = max(top.values())
        check(token_logprob <= 0 and abs(token_logprob - best) < 1e-6, f"token {i}: {token_logprob} vs best {best}")
        check(len(top) <= 2, f"top {top}")
    c = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = c.choices[0].logprobs.content
    check(content and len(content[0].top_logprobs) == 3 and isinstance(content[0].bytes, list), str(content[:1]))


@run("errors: OpenAI status codes and shapes")
def _():
    e404 = expect_status(404, lambda: client.completions.create(**{**base, "model": "no-such-model"}), "no-such-model")
    check(e404.code == "model_not_found", f"code {e404.code}")
    expect_status(400, lambda: client.completions.create(**{**base, "max_tokens": 100000000}), "max_tokens")
    expect_status(400, lambda: client.completions.create(**{**base, "temperature": -1}), "temperature")
    expect_status(400, lambda: client.completions.create(model=model, max_tokens=5, prompt=openai.omit), "prompt")
    expect_status(400, lambda: client.chat.completions.create(model=model, messages=[]), "messages")
    expect_status(400, lambda: client.chat.completions.create(model=model, messages=[{"role": "wizard", "content": "x"}]),
                  "wizard")
    wrong = openai.OpenAI(base_url=opts.base_url, api_key="wrong-key", max_retries=0)
    e401 = expect_status(401, lambda: wrong.models.list())
    check(e401.code == "invalid_api_key", f"code {e401.code}")
    status, body = get("/v1/no-such-route", {"Authorization": f"Bearer {opts.api_key}"})
    j = json.loads(body)
    check(status == 404 and "no-such-route" in j["error"]["message"], body)


@run("32 concurrent streaming clients all complete, each as if alone")
def _():
    prompts = ["ROMEO:", "JULIET:", "First Citizen:", "KING HENRY:"]
    one = dict(model=model, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    alone = {p: client.completions.create(prompt=p, **one).choices[0].text for p in prompts}
    concurrent = openai.AsyncOpenAI(base_url=opts.base_url, api_key=opts.api_key, max_retries=0, timeout=120)

    async def stream(p):
        chunks = await concurrent.completions.create(prompt=p, **one, stream=True, stream_options={"include_usage": True})
        return collect([chunk async for chunk in chunks])

    async def all_clients():
        try:
            return await asyncio.gather(*[stream(prompts[i % 4]) for i in range(32)])
        finally:
            await concurrent.close()

    for i, (texts, finish, usage) in enumerate(asyncio.run(all_clients())):
        check(usage and usage.completion_tokens == 16, f"client {i} usage {usage}")
        check(finish.get(0) == "length", f"client {i} finish {finish.get(0)}")
        want = alone[prompts[i % 4]]
        check(texts.get(0) == want, f"client {i}: {texts.get(0)!r} vs {want!r}")
    metrics = get("/metrics")[1]
    steps = re.search(r'^meshtrain_batch_size_bucket\{le="4"\} (\d+)$', metrics, re.M)
    count = re.search(r"^meshtrain_batch_size_count (\d+)$", metrics, re.M)
    check(steps and count and int(count[1]) > int(steps[1]), "no decode step ran more than 4 sequences")


@run("health and metrics")
def _():
    status, _ = get("/health")
    check(status == 200, f"health {status}")
    metrics = get("/metrics")[1]
    for name in ['meshtrain_requests_total{endpoint="/v1/completions",status="200"}', "meshtrain_generation_tokens_total",
                 "meshtrain_queue_depth", "meshtrain_kv_cache_usage_ratio", "meshtrain_request_latency_seconds_bucket",
                 "meshtrain_time_to_first_token_seconds_count",
                 'meshtrain_requests_total{endpoint="/v1/completions",status="400"}']:
        check(name in metrics, f"metrics lack {name}")


print("all checks passed" if failures == 0 else f"{failures} checks failed", flush=True)
raise SystemExit(failures)
