// Mutated requests against sluice serve: valid bodies with fields dropped, retyped, set to odd
// numbers and strings, truncated or spliced. Every answer must be 200 or a 4xx with an
// OpenAI error object, and the server must stay up. Seeded, so a failure repeats.
// usage: node mutate_requests.cjs URL [COUNT] [SEED]
'use strict';

const [url, countArg, seedArg] = process.argv.slice(2);
const count = Number(countArg || 300);
let state = BigInt(seedArg || 12345);
function rnd() { // xorshift64*, deterministic
  state ^= state >> 12n; state ^= (state << 25n) & 0xffffffffffffffffn; state ^= state >> 27n;
  return Number(((state * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn) >> 11n) / 2 ** 53;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];

const bases = [
  ['/v1/chat/completions', { messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Once upon a time' }], max_tokens: 4 }],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }] }], max_tokens: 3, stream: true, stop: ['.', 'x'] }],
  ['/v1/completions', { prompt: 'The little dog', max_tokens: 4, temperature: 0.5, top_p: 0.9, seed: 3 }],
  ['/v1/completions', { prompt: [1, 403, 407], max_tokens: 2, stream: true, stream_options: { include_usage: true } }],
];
const odd = [null, true, false, 0, -1, 1.5, 2 ** 31, -(2 ** 63), 1e308, -1e-308, '', 'x', '\u00e9\u20ac\ud83d\ude00',
  '<|im_start|>', '<s>', [], [[]], {}, { a: 1 }, 'a'.repeat(5000), Array(50).fill(1)];

function mutate(v, depth) {
  if (depth > 4) return pick(odd);
  if (Array.isArray(v)) {
    const a = v.map((x) => (rnd() < 0.3 ? mutate(x, depth + 1) : x));
    if (rnd() < 0.2) a.push(pick(odd));
    if (rnd() < 0.2) a.splice(Math.floor(rnd() * (a.length + 1)), 1);
    return a;
  }
  if (v && typeof v === 'object') {
    const o = { ...v };
    for (const k of Object.keys(o)) {
      const r = rnd();
      if (r < 0.15) delete o[k];
      else if (r < 0.35) o[k] = pick(odd);
      else if (r < 0.6) o[k] = mutate(o[k], depth + 1);
    }
    if (rnd() < 0.2) o[pick(['n', 'stop', 'seed', 'logprobs', 'chat_template_kwargs', 'max_completion_tokens', 'top_k', 'min_p', 'ignore_eos'])] = pick(odd);
    return o;
  }
  return rnd() < 0.5 ? pick(odd) : v;
}

function body() {
  const [path, base] = pick(bases);
  let text = JSON.stringify(mutate(base, 0));
  const r = rnd();
  if (r < 0.1) text = text.slice(0, Math.floor(rnd() * text.length)); // truncated
  else if (r < 0.15) text = text.replace(/"/, "'"); // not JSON
  else if (r < 0.2) text = text + text; // two values
  return [path, Buffer.from(text)];
}

(async () => {
  const seen = {};
  for (let i = 0; i < count; i++) {
    const [path, data] = body();
    let res;
    try {
      res = await fetch(url + path, { method: 'POST', body: data, headers: { 'content-type': 'application/json' } });
    } catch (e) {
      console.log(`FAIL request ${i} (${path}): ${e.message}\n  body: ${data.toString().slice(0, 400)}`);
      process.exit(1);
    }
    const text = await res.text();
    seen[res.status] = (seen[res.status] || 0) + 1;
    const okStatus = res.status === 200 || res.status === 400;
    const errShape = res.status === 200 || /^\{"error":\{"message":/.test(text);
    if (!okStatus || !errShape) {
      console.log(`FAIL request ${i} (${path}): ${res.status} ${text.slice(0, 300)}\n  body: ${data.toString().slice(0, 400)}`);
      process.exit(1);
    }
  }
  console.log(`mutated requests: ${count} sent, statuses ${JSON.stringify(seen)}`);
})();
