// The official `openai` client against a running `meshtrain serve`: completions, chat,
// streaming, n > 1, stop sequences, logprobs, errors and 32 concurrent streams. (A client
// that disconnects is tested from C++ with a raw socket: the SDK's abort may keep the
// connection open to reuse it.) Run by tests/e2e/serve_e2e_test.cpp, which starts the server.
//
//   node serve_client.js --base-url http://127.0.0.1:PORT/v1 --model NAME --api-key KEY \
//        --prompt TEXT --expect-greedy TEXT
//
// Prints "ok <check>" or "FAIL <check>: <why>" per check; exits with the number of failures.
'use strict';
const OpenAI = require('openai');

function args() {
  const a = {};
  for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
  for (const k of ['base-url', 'model', 'api-key', 'prompt', 'expect-greedy'])
    if (a[k] === undefined) throw new Error(`missing --${k}`);
  return a;
}

const opts = args();
const root = opts['base-url'].replace(/\/v1$/, '');
const client = new OpenAI({ baseURL: opts['base-url'], apiKey: opts['api-key'], maxRetries: 0, timeout: 120000 });
const model = opts.model;
const prompt = opts.prompt;
const greedy = opts['expect-greedy'];  // `meshtrain generate`'s text: prompt + 24 greedy tokens
let failures = 0;

function check(cond, what) {
  if (!cond) throw new Error(what);
}
async function run(name, fn) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  }
}
async function expectStatus(status, fn, words) {
  try {
    await fn();
  } catch (e) {
    check(e.status === status, `status ${e.status}, expected ${status}: ${e.message}`);
    if (words) check(String(e.message).includes(words), `message '${e.message}' lacks '${words}'`);
    return e;
  }
  throw new Error(`no error, expected ${status}`);
}
async function streamText(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const texts = {};
  let usage = null, finish = {};
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] || '') + c.text;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { texts, usage, finish };
}

async function main() {
  const base = { model, prompt, max_tokens: 24, temperature: 0 };
  let completion = '';

  await run('models.list names the served model', async () => {
    const list = await client.models.list();
    const ids = list.data.map((m) => m.id);
    check(ids.length === 1 && ids[0] === model, `ids ${JSON.stringify(ids)}`);
  });

  await run('greedy completion equals meshtrain generate', async () => {
    const r = await client.completions.create({ ...base, echo: true });
    check(r.object === 'text_completion', `object ${r.object}`);
    check(r.choices[0].text === greedy, `text ${JSON.stringify(r.choices[0].text)} vs ${JSON.stringify(greedy)}`);
    const plain = await client.completions.create(base);
    completion = plain.choices[0].text;
    check(prompt + completion === greedy, `without echo: ${JSON.stringify(completion)}`);
    const u = plain.usage;
    check(u.prompt_tokens > 0 && u.total_tokens === u.prompt_tokens + u.completion_tokens, JSON.stringify(u));
    check(plain.choices[0].finish_reason === 'length' ? u.completion_tokens === 24 : u.completion_tokens <= 24,
          `finish ${plain.choices[0].finish_reason}, usage ${JSON.stringify(u)}`);
  });

  await run('a list of prompts answers each, in order', async () => {
    const r = await client.completions.create({ ...base, prompt: [prompt, 'ROMEO:'] });
    check(r.choices.length === 2 && r.choices[0].index === 0 && r.choices[1].index === 1, JSON.stringify(r.choices));
    check(r.choices[0].text === completion, `choice 0 ${JSON.stringify(r.choices[0].text)}`);
  });

  await run('n = 3 seeded samples: three choices, reproducible', async () => {
    const p = { model, prompt, max_tokens: 16, temperature: 1.0, n: 3, seed: 1234 };
    const a = await client.completions.create(p), b = await client.completions.create(p);
    check(a.choices.length === 3, `${a.choices.length} choices`);
    check(a.choices.map((c) => c.index).join() === '0,1,2', 'indices');
    check(JSON.stringify(a.choices.map((c) => c.text)) === JSON.stringify(b.choices.map((c) => c.text)), 'not reproducible');
    check(new Set(a.choices.map((c) => c.text)).size > 1, 'all choices equal');
    check(a.usage.completion_tokens <= 48, JSON.stringify(a.usage));
  });

  await run('stop sequence ends the text before it', async () => {
    check(completion.length >= 8, `completion too short: ${JSON.stringify(completion)}`);
    const stop = completion.slice(4, 7);
    const r = await client.completions.create({ ...base, stop: [stop, 'zzzzzz'] });
    const want = completion.slice(0, completion.indexOf(stop));
    check(r.choices[0].text === want, `text ${JSON.stringify(r.choices[0].text)} want ${JSON.stringify(want)}`);
    check(r.choices[0].finish_reason === 'stop', `finish ${r.choices[0].finish_reason}`);
    const s = await streamText({ ...base, stop });
    check(s.texts[0] === want, `streamed ${JSON.stringify(s.texts[0])}`);
    check(s.finish[0] === 'stop', `streamed finish ${s.finish[0]}`);
  });

  await run('streamed completion equals the whole one, usage last', async () => {
    const s = await streamText(base);
    check(s.texts[0] === completion, `streamed ${JSON.stringify(s.texts[0])}`);
    check(s.usage && s.usage.completion_tokens > 0 && s.usage.total_tokens === s.usage.prompt_tokens + s.usage.completion_tokens,
          `usage ${JSON.stringify(s.usage)}`);
    check(s.finish[0] === 'length' || s.finish[0] === 'stop', `finish ${s.finish[0]}`);
  });

  let chatText = '';
  const messages = [{ role: 'system', content: 'You are a poet.' }, { role: 'user', content: 'Speak of the moon.' }];
  await run('chat completion (plain template) equals the completion of its rendering', async () => {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0 });
    check(r.object === 'chat.completion', `object ${r.object}`);
    const m = r.choices[0].message;
    check(m.role === 'assistant' && typeof m.content === 'string', JSON.stringify(m));
    chatText = m.content;
    const rendered = 'system: You are a poet.\nuser: Speak of the moon.\nassistant:';
    const c = await client.completions.create({ model, prompt: rendered, max_tokens: 20, temperature: 0 });
    check(c.choices[0].text === chatText, `chat ${JSON.stringify(chatText)} vs completion ${JSON.stringify(c.choices[0].text)}`);
    check(r.usage.prompt_tokens === c.usage.prompt_tokens, `prompt tokens ${r.usage.prompt_tokens} vs ${c.usage.prompt_tokens}`);
  });

  await run('chat streaming: role first, then the same content', async () => {
    const stream = await client.chat.completions.create({
      model, messages, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = '', first = null, finish = null, usage = null;
    for await (const chunk of stream) {
      check(chunk.object === 'chat.completion.chunk', `object ${chunk.object}`);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (first === null) first = c.delta;
        text += c.delta.content || '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    check(first && first.role === 'assistant', `first delta ${JSON.stringify(first)}`);
    check(text === chatText, `streamed ${JSON.stringify(text)}`);
    check(finish === 'length' || finish === 'stop', `finish ${finish}`);
    check(usage && usage.completion_tokens > 0, `usage ${JSON.stringify(usage)}`);
  });

  await run('logprobs: the greedy token is the most likely', async () => {
    const r = await client.completions.create({ ...base, max_tokens: 8, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    check(lp && lp.tokens.length === lp.token_logprobs.length && lp.tokens.length > 0, JSON.stringify(lp));
    check(lp.tokens.join('') === r.choices[0].text || r.choices[0].finish_reason === 'stop', 'tokens do not spell the text');
    for (let i = 0; i < lp.tokens.length; i++) {
      const top = lp.top_logprobs[i];
      const best = Math.max(...Object.values(top));
      check(lp.token_logprobs[i] <= 0 && Math.abs(lp.token_logprobs[i] - best) < 1e-6,
            `token ${i}: ${lp.token_logprobs[i]} vs best ${best}`);
      check(Object.keys(top).length <= 2, `top ${JSON.stringify(top)}`);
    }
    const c = await client.chat.completions.create({ model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = c.choices[0].logprobs.content;
    check(content.length > 0 && content[0].top_logprobs.length === 3 && Array.isArray(content[0].bytes), JSON.stringify(content[0]));
  });

  await run('errors: OpenAI status codes and shapes', async () => {
    const e404 = await expectStatus(404, () => client.completions.create({ ...base, model: 'no-such-model' }), 'no-such-model');
    check(e404.code === 'model_not_found', `code ${e404.code}`);
    await expectStatus(400, () => client.completions.create({ ...base, max_tokens: 100000000 }), 'max_tokens');
    await expectStatus(400, () => client.completions.create({ ...base, temperature: -1 }), 'temperature');
    await expectStatus(400, () => client.completions.create({ model, max_tokens: 5 }), 'prompt');
    await expectStatus(400, () => client.chat.completions.create({ model, messages: [] }), 'messages');
    await expectStatus(400, () => client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }), 'wizard');
    const wrong = new OpenAI({ baseURL: opts['base-url'], apiKey: 'wrong-key', maxRetries: 0 });
    const e401 = await expectStatus(401, () => wrong.models.list());
    check(e401.code === 'invalid_api_key', `code ${e401.code}`);
    const r = await fetch(`${root}/v1/no-such-route`, { headers: { Authorization: `Bearer ${opts['api-key']}` } });
    const body = await r.json();
    check(r.status === 404 && body.error && body.error.message.includes('no-such-route'), JSON.stringify(body));
  });

  await run('32 concurrent streaming clients all complete, each as if alone', async () => {
    const prompts = ['ROMEO:', 'JULIET:', 'First Citizen:', 'KING HENRY:'];
    const alone = {};
    for (const p of prompts) alone[p] = (await client.completions.create({ model, prompt: p, max_tokens: 16, temperature: 0, ignore_eos: true })).choices[0].text;
    const runs = await Promise.all(Array.from({ length: 32 }, (_, i) =>
      streamText({ model, prompt: prompts[i % 4], max_tokens: 16, temperature: 0, ignore_eos: true })));
    runs.forEach((s, i) => {
      check(s.usage && s.usage.completion_tokens === 16, `client ${i} usage ${JSON.stringify(s.usage)}`);
      check(s.finish[0] === 'length', `client ${i} finish ${s.finish[0]}`);
      check(s.texts[0] === alone[prompts[i % 4]], `client ${i}: ${JSON.stringify(s.texts[0])} vs ${JSON.stringify(alone[prompts[i % 4]])}`);
    });
    const metrics = await (await fetch(`${root}/metrics`)).text();
    const steps = metrics.match(/^meshtrain_batch_size_bucket\{le="4"\} (\d+)$/m);
    const all = metrics.match(/^meshtrain_batch_size_count (\d+)$/m);
    check(steps && all && Number(all[1]) > Number(steps[1]), 'no decode step ran more than 4 sequences');
  });

  await run('health and metrics', async () => {
    const h = await fetch(`${root}/health`);
    check(h.status === 200, `health ${h.status}`);
    const m = await (await fetch(`${root}/metrics`)).text();
    for (const name of ['meshtrain_requests_total{endpoint="/v1/completions",status="200"}', 'meshtrain_generation_tokens_total',
                        'meshtrain_queue_depth', 'meshtrain_kv_cache_usage_ratio', 'meshtrain_request_latency_seconds_bucket',
                        'meshtrain_time_to_first_token_seconds_count', 'meshtrain_requests_total{endpoint="/v1/completions",status="400"}'])
      check(m.includes(name), `metrics lack ${name}`);
  });

  console.log(failures === 0 ? 'all checks passed' : `${failures} checks failed`);
  process.exit(failures);
}

main().catch((e) => {
  console.log(`FAIL main: ${e.stack}`);
  process.exit(100);
});
