// The official `openai` npm client against sluice serve: chat and completions, plain and
// streamed, stop sequences, seeds, usage, errors, KV-cache reuse.
// usage: node openai_test.cjs STORIES_URL CHATML_URL   (NODE_PATH must reach node_modules)
'use strict';
const assert = require('node:assert/strict');
const { OpenAI, BadRequestError, NotFoundError } = require('openai');

const [storiesUrl, chatmlUrl] = process.argv.slice(2);
const client = (url) =>
  new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-unused', maxRetries: 0, timeout: 120000 });
const stories = client(storiesUrl); // stories260K: no chat template (plain concatenation)
const chatml = client(chatmlUrl); // qwen3moe-tiny: ChatML from its vocabulary

async function metric(url, name) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  assert.ok(m, `metric ${name} missing`);
  return Number(m[1]);
}

function checkUsage(u, maxTokens, finish) {
  assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0);
  assert.ok(Number.isInteger(u.completion_tokens) && u.completion_tokens >= 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.ok(u.completion_tokens <= maxTokens);
  if (finish === 'length') assert.equal(u.completion_tokens, maxTokens);
}

// Collect a streamed completion or chat completion.
async function collect(stream, chat) {
  const out = { text: '', role: null, finish: null, usage: null, chunks: 0 };
  for await (const ch of stream) {
    out.chunks++;
    assert.equal(ch.object, chat ? 'chat.completion.chunk' : 'text_completion');
    if (ch.usage) out.usage = ch.usage;
    if (!ch.choices.length) continue;
    const c = ch.choices[0];
    if (chat) {
      if (c.delta.role) out.role = c.delta.role;
      if (c.delta.content) out.text += c.delta.content;
    } else {
      out.text += c.text;
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

const tests = [];
const test = (name, fn) => tests.push([name, fn]);

test('GET /v1/models lists the served model', async () => {
  for (const c of [stories, chatml]) {
    const page = await c.models.list();
    assert.equal(page.data.length, 1);
    assert.equal(page.data[0].object, 'model');
    assert.ok(page.data[0].id.length > 0);
  }
});

test('chat completion, plain (ChatML model)', async () => {
  const r = await chatml.chat.completions.create({
    model: 'any',
    messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hello there' },
    ],
    max_tokens: 16,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  checkUsage(r.usage, 16, c.finish_reason);
});

test('chat completion, streamed, equals the plain answer', async () => {
  const req = {
    model: 'any',
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me a story' }] }],
    max_tokens: 24,
    temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  };
  const plain = await chatml.chat.completions.create(req);
  const s = await collect(
    await chatml.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }),
    true,
  );
  assert.equal(s.role, 'assistant');
  assert.equal(s.text, plain.choices[0].message.content);
  assert.equal(s.finish, plain.choices[0].finish_reason);
  assert.deepEqual(s.usage, plain.usage);
  assert.ok(s.chunks >= 3);
});

test('chat on a model without a template (plain concatenation)', async () => {
  const r = await stories.chat.completions.create({
    model: 'any',
    messages: [{ role: 'user', content: 'Once upon a time' }],
    max_tokens: 20,
    temperature: 0,
  });
  const c = await stories.completions.create({ model: 'any', prompt: 'Once upon a time', max_tokens: 20, temperature: 0 });
  assert.equal(r.choices[0].message.content, c.choices[0].text);
  assert.equal(r.usage.prompt_tokens, c.usage.prompt_tokens);
});

test('completion, plain and streamed (stories260K)', async () => {
  const req = { model: 'any', prompt: 'Once upon a time', max_tokens: 30, temperature: 0 };
  const plain = await stories.completions.create(req);
  assert.equal(plain.object, 'text_completion');
  assert.match(plain.id, /^cmpl-/);
  assert.ok(plain.choices[0].text.length > 0);
  checkUsage(plain.usage, 30, plain.choices[0].finish_reason);
  const s = await collect(await stories.completions.create({ ...req, stream: true }), false);
  assert.equal(s.text, plain.choices[0].text);
  assert.equal(s.finish, plain.choices[0].finish_reason);
  assert.equal(s.usage, null); // only with stream_options.include_usage
});

test('stop sequences: string or array, across tokens, never emitted', async () => {
  const base = { model: 'any', prompt: 'Once upon a time', max_tokens: 40, temperature: 0 };
  const full = (await stories.completions.create(base)).choices[0].text;
  assert.ok(full.length > 24, `too short: ${JSON.stringify(full)}`);
  const stop = full.slice(10, 17); // seven characters: several tokens of stories260K
  const cut = full.indexOf(stop);
  for (const s of [stop, ['never-there', stop]]) {
    const r = await stories.completions.create({ ...base, stop: s });
    assert.equal(r.choices[0].text, full.slice(0, cut));
    assert.equal(r.choices[0].finish_reason, 'stop');
    const st = await collect(await stories.completions.create({ ...base, stop: s, stream: true }), false);
    assert.equal(st.text, full.slice(0, cut));
    assert.equal(st.finish, 'stop');
  }
  const chat = await stories.chat.completions.create({
    model: 'any', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 40, temperature: 0, stop,
  });
  assert.equal(chat.choices[0].message.content, full.slice(0, cut));
});

test('a seed makes sampling repeatable', async () => {
  const req = { model: 'any', prompt: 'Once upon a time', max_tokens: 30, temperature: 1, top_p: 0.9, seed: 1234 };
  const a = await stories.completions.create(req);
  const b = await stories.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('max_tokens is honoured and reported as length', async () => {
  const r = await stories.completions.create({ model: 'any', prompt: 'Once upon a time', max_tokens: 3, temperature: 0 });
  assert.equal(r.usage.completion_tokens, 3);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('errors are OpenAI-shaped and raise the SDK error classes', async () => {
  const msgs = [{ role: 'user', content: 'x' }];
  await assert.rejects(chatml.chat.completions.create({ model: 'any', messages: msgs, temperature: 5 }), (e) => {
    assert.ok(e instanceof BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.type, 'invalid_request_error');
    assert.equal(e.param, 'temperature');
    return true;
  });
  await assert.rejects(chatml.chat.completions.create({ model: 'any', messages: [] }), BadRequestError);
  await assert.rejects(chatml.chat.completions.create({ model: 'any', messages: [{ role: 'robot', content: 'x' }] }),
    (e) => e instanceof BadRequestError && e.param === 'messages[0].role');
  await assert.rejects(stories.completions.create({ model: 'any', prompt: 'x', max_tokens: -1 }),
    (e) => e instanceof BadRequestError && e.param === 'max_tokens');
  // a streamed request is validated before the stream starts: a plain 400, not an event
  await assert.rejects(stories.completions.create({ model: 'any', prompt: 'x', top_p: 7, stream: true }), BadRequestError);
  await assert.rejects(client(storiesUrl).models.retrieve('nope'), NotFoundError);
});

test('a follow-up turn reuses the KV cache and answers as a fresh evaluation would', async () => {
  const t1 = [{ role: 'user', content: 'Tell me a story about a cat' }];
  const a1 = await chatml.chat.completions.create({ model: 'any', messages: t1, max_tokens: 12, temperature: 0 });
  const t2 = [...t1, { role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'Go on' }];
  const before = await metric(chatmlUrl, 'sluice_prompt_tokens_reused_total');
  const a2 = await chatml.chat.completions.create({ model: 'any', messages: t2, max_tokens: 12, temperature: 0 });
  const reused = (await metric(chatmlUrl, 'sluice_prompt_tokens_reused_total')) - before;
  assert.ok(reused >= a1.usage.prompt_tokens, `reused ${reused} of ${a2.usage.prompt_tokens}`);
  // a prompt sharing no token resets the session; then the same turn is evaluated from scratch
  await chatml.completions.create({ model: 'any', prompt: [5, 6, 7], max_tokens: 2 });
  const before2 = await metric(chatmlUrl, 'sluice_prompt_tokens_reused_total');
  const fresh = await chatml.chat.completions.create({ model: 'any', messages: t2, max_tokens: 12, temperature: 0 });
  assert.equal(await metric(chatmlUrl, 'sluice_prompt_tokens_reused_total'), before2);
  assert.equal(fresh.choices[0].message.content, a2.choices[0].message.content);
});

(async () => {
  let failed = 0;
  for (const [name, fn] of tests) {
    try {
      await fn();
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}\n     ${(e && e.stack) || e}`);
    }
  }
  console.log(`${tests.length - failed}/${tests.length} openai client tests passed`);
  process.exit(failed ? 1 : 0);
})();
