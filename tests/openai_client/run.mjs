// kvx serve tested as users use it: the official `openai` npm client (and
// plain fetch where the client cannot send what we test) against a running
// `kvx serve` on a synthetic model. Checks chat and completions, streaming
// and not, errors in OpenAI's shape, a client leaving mid-stream, session
// save/restore (a corrupted file refused, the server healthy after), a load
// run of 1..64 concurrent streaming clients with shared and unshared
// prefixes (no errors, pool under budget, prefix hits in /metrics), and
// SIGTERM ending in-flight streams and the process.
//
// Usage: node run.mjs --kvx BUILD/kvx [--model MODEL.gguf]
// Exit 0 pass, 1 fail, 77 skipped (the openai package is not installed:
// scripts/install-deps.sh runs npm ci here).
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch {
  console.log('SKIP: the openai npm package is not installed (run scripts/install-deps.sh, or npm ci in tests/openai_client)');
  process.exit(77);
}
const kvx = args.kvx;
if (!kvx || !fs.existsSync(kvx)) {
  console.error('give --kvx PATH to the kvx binary');
  process.exit(1);
}
const LIMIT_MS = 90_000;  // the whole run, hard
setTimeout(() => { console.error(`FAIL: over ${LIMIT_MS / 1000} s`); process.exit(1); }, LIMIT_MS).unref();

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvx-openai-'));
let model = args.model;
if (!model) {
  model = path.join(tmp, 'tiny.gguf');
  const g = spawnSync(kvx, ['gen-model', '--shape', 'tiny', '--type', 'q8_0', '-o', model], { encoding: 'utf8' });
  assert.equal(g.status, 0, g.stderr);
}
const sessionDir = path.join(tmp, 'sessions');
const KEY = 'test-key';

// Starts kvx serve on a free port; resolves with { proc, base, exited }.
function startServer(extra = []) {
  return new Promise((resolve, reject) => {
    const proc = spawn(kvx, ['serve', '-m', model, '--port', '0', '-c', '2048', '--max-seqs', '64', '-t', '2',
      '--api-key', KEY, '--session-dir', sessionDir, '--shutdown-grace', '2', ...extra]);
    let log = '';
    const exited = new Promise((r) => proc.on('exit', (code, signal) => r({ code, signal, log })));
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/[0-9.]+:\d+)/);
      if (m && !proc.started) {
        proc.started = true;
        resolve({ proc, base: m[1], exited });
      }
    });
    proc.on('exit', () => { if (!proc.started) reject(new Error('kvx serve exited: ' + log)); });
  });
}

async function metrics(base) {
  // /metrics is guarded by the API key like every endpoint but /health.
  const text = await (await fetch(base + '/metrics', { headers: { Authorization: `Bearer ${KEY}` } })).text();
  const m = {};
  for (const line of text.split('\n')) {
    const r = line.match(/^([a-z_]+)(\{[^}]*\})? ([-0-9.e+]+)$/);
    if (r && !r[2]) m[r[1]] = Number(r[3]);
  }
  return m;
}

const results = [];
async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push([name, true]);
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const { proc, base, exited } = await startServer();
const client = new OpenAI({ apiKey: KEY, baseURL: base + '/v1', maxRetries: 0, timeout: 30_000 });

await test('models list', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'tiny');
});

await test('completion, not streamed', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 5);
});

await test('completion streamed equals not streamed (greedy)', async () => {
  const body = { model: 'tiny', prompt: 'The cat sat', max_tokens: 12, temperature: 0 };
  const whole = await client.completions.create(body);
  const stream = await client.completions.create({ ...body, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, 'length');
});

await test('chat, not streamed and streamed with usage', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }];
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
  const stream = await client.chat.completions.create({
    model: 'tiny', messages, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let role = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? '';
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
});

// Chat content parts as chunks (docs/kv-reuse.md): the client sends kvx's
// chunk_repair beside the messages; each text part is then a chunk, and the
// parts reordered come from the chunk cache.
await test('chat content parts as chunks', async () => {
  const parts = ['First document about rivers. ', 'Second one: 4 8 15 16 23 42. ', 'Third.'];
  const ask = (order) => client.chat.completions.create({
    model: 'tiny', max_tokens: 4, temperature: 0, chunk_repair: 'epic,k=4',
    messages: [{ role: 'user', content: order.map((i) => ({ type: 'text', text: parts[i] })) }] });
  const first = await ask([0, 1, 2]);
  const details = first.usage.prompt_tokens_details;
  assert.ok(details.chunk_tokens > 10, JSON.stringify(first.usage));
  const second = await ask([2, 0, 1]);
  assert.equal(second.usage.prompt_tokens_details.chunk_cache_tokens, details.chunk_tokens);
  const joined = await client.chat.completions.create({
    model: 'tiny', max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: parts.map((text) => ({ type: 'text', text })) }] });
  assert.equal(joined.usage.prompt_tokens_details?.chunk_tokens, undefined);
});

await test('n samples and seeds', async () => {
  const body = { model: 'tiny', prompt: 'Once', max_tokens: 8, temperature: 1, seed: 42, n: 3 };
  const a = await client.completions.create(body);
  const b = await client.completions.create(body);
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
});

await test('stop strings cut the text and finish with stop', async () => {
  const body = { model: 'tiny', prompt: 'abc', max_tokens: 24, temperature: 0 };
  const full = (await client.completions.create(body)).choices[0].text;
  assert.ok(full.length >= 6, `need some text, got ${JSON.stringify(full)}`);
  const stop = full.slice(3, 5);
  const want = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...body, stop: [stop] });
  assert.equal(r.choices[0].text, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  let streamed = '';
  for await (const chunk of await client.completions.create({ ...body, stop, stream: true })) {
    streamed += chunk.choices.map((c) => c.text).join('');
  }
  assert.equal(streamed, want);
});

await test('errors in OpenAI shape', async () => {
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: base + '/v1', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', temperature: 'hot' }),
    (e) => e.status === 400 && e.param === 'temperature' && e.type === 'invalid_request_error');
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 0 }),
    (e) => e.status === 400 && e.param === 'max_tokens');
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [] }),
    (e) => e.status === 400 && e.param === 'messages');
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'wizard', content: 'x' }] }),
    (e) => e.status === 400 && e.param === 'messages[0].role');
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'word '.repeat(5000) }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
  const headers = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };
  for (const body of ['{"prompt": "x"', '[1,2]', Buffer.from([0x7b, 0x22, 0x70, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d])]) {
    const r = await fetch(base + '/v1/completions', { method: 'POST', headers, body });
    assert.equal(r.status, 400);
    const j = await r.json();
    assert.equal(typeof j.error.message, 'string');
    assert.equal(j.error.type, 'invalid_request_error');
  }
  const big = await fetch(base + '/v1/completions', { method: 'POST', headers, body: 'x'.repeat(9 << 20) });
  assert.equal(big.status, 413);
  assert.equal((await fetch(base + '/health')).status, 200);
});

await test('a client leaving mid-stream cancels its request at once', async () => {
  const before = await metrics(base);
  const ctl = new AbortController();
  const r = await fetch(base + '/v1/completions', {
    method: 'POST', signal: ctl.signal,
    headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', prompt: 'go', max_tokens: 2000, stream: true, temperature: 0 }),
  });
  const reader = r.body.getReader();
  await reader.read();  // the first chunk
  ctl.abort();
  const t0 = Date.now();
  let m;
  do {
    await new Promise((res) => setTimeout(res, 50));
    m = await metrics(base);
  } while (m.kvx_requests_cancelled_total === before.kvx_requests_cancelled_total && Date.now() - t0 < 3000);
  assert.equal(m.kvx_requests_cancelled_total, before.kvx_requests_cancelled_total + 1, 'not cancelled within 3 s');
  assert.ok(m.kvx_client_disconnects_total > (before.kvx_client_disconnects_total ?? 0));
  assert.ok(m.kvx_generated_tokens_total - before.kvx_generated_tokens_total < 2000, 'it generated to the end');
  assert.equal(m.kvx_sequences_running, 0);
});

await test('sessions: save, restore, a corrupted file refused, server healthy', async () => {
  const headers = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };
  const post = (p, body = {}) => fetch(base + p, { method: 'POST', headers, body: JSON.stringify(body) });
  const first = await client.completions.create({ model: 'tiny', prompt: 'A story', max_tokens: 6, temperature: 0, session: 'chat1' });
  assert.equal(first.choices.length, 1);
  let r = await post('/v1/sessions/chat1/save');
  assert.equal(r.status, 200, await r.clone().text());
  const saved = await r.json();
  assert.ok(saved.tokens > 6);
  const cont = (await client.completions.create({ model: 'tiny', prompt: ' and', max_tokens: 6, temperature: 0, session: 'chat1' })).choices[0].text;
  r = await post('/v1/sessions/chat1/restore');  // back to the saved state
  assert.equal(r.status, 200, await r.clone().text());
  const again = (await client.completions.create({ model: 'tiny', prompt: ' and', max_tokens: 6, temperature: 0, session: 'chat1' })).choices[0].text;
  assert.equal(again, cont, 'a restored session continues as the saved one did');
  // The key's tenant has a directory of its own in --session-dir.
  const tenantDirs = fs.readdirSync(sessionDir).filter((d) => d.startsWith('tenant-'));
  assert.equal(tenantDirs.length, 1);
  const tenantDir = path.join(sessionDir, tenantDirs[0]);
  const bytes = fs.readFileSync(path.join(tenantDir, 'chat1.kvxs'));
  bytes[bytes.length - 7] ^= 0x40;
  fs.writeFileSync(path.join(tenantDir, 'broken.kvxs'), bytes);
  r = await post('/v1/sessions/broken/restore');
  assert.equal(r.status, 400);
  const err = await r.json();
  assert.equal(err.error.code, 'invalid_session_file');
  assert.match(err.error.message, /corrupted/);
  r = await post('/v1/sessions/missing/restore');
  assert.equal(r.status, 404);
  r = await post('/v1/sessions/..%2Fetc/save');
  assert.ok(r.status === 400 || r.status === 404);
  assert.equal((await fetch(base + '/health')).status, 200);
  const after = await client.completions.create({ model: 'tiny', prompt: 'still', max_tokens: 3 });
  assert.equal(after.choices.length, 1);
});

await test('load: 1..64 concurrent streaming clients, shared and unshared prefixes', async () => {
  const shared = 'You are a helpful assistant. Answer the question below in a few words. '.repeat(3);
  let maxUsed = 0;
  let budget = 0;
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const m = await metrics(base);
      maxUsed = Math.max(maxUsed, m.kvx_pool_bytes_used);
      budget = m.kvx_pool_budget_bytes;
      await new Promise((res) => setTimeout(res, 20));
    }
  })();
  const before = await metrics(base);
  for (const n of [1, 8, 32, 64]) {
    const t0 = Date.now();
    const jobs = [];
    for (let i = 0; i < n; ++i) {
      const prompt = (i % 2 === 0 ? shared : `Unshared ${i} ${'x'.repeat(i % 7)} `) + `Question ${i}?`;
      jobs.push((async () => {
        const stream = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, stream: true, seed: i });
        let chunks = 0;
        let finish = null;
        for await (const chunk of stream) {
          chunks++;
          for (const c of chunk.choices) if (c.finish_reason) finish = c.finish_reason;
        }
        assert.ok(chunks > 0);
        assert.ok(finish === 'length' || finish === 'stop', `finish ${finish}`);
      })());
    }
    const settled = await Promise.allSettled(jobs);
    const failed = settled.filter((s) => s.status === 'rejected');
    assert.equal(failed.length, 0, `${failed.length} of ${n} failed: ${failed[0]?.reason}`);
    console.log(`     ${n} clients: ${Date.now() - t0} ms`);
  }
  polling = false;
  await poller;
  const after = await metrics(base);
  assert.ok(budget > 0 && maxUsed <= budget, `pool ${maxUsed} over budget ${budget}`);
  assert.ok(after.kvx_prefix_cache_hit_tokens_total > before.kvx_prefix_cache_hit_tokens_total, 'no prefix hits reported');
  assert.ok(after.kvx_prefix_cache_hit_ratio > 0);
  assert.equal(after.kvx_requests_failed_total, before.kvx_requests_failed_total);
});

await test('SIGTERM ends in-flight streams and the server', async () => {
  const stream = await client.completions.create({ model: 'tiny', prompt: 'long', max_tokens: 500, stream: true, temperature: 0 });
  const it = stream[Symbol.asyncIterator]();
  await it.next();
  proc.kill('SIGTERM');
  let chunks = 1;
  try {
    for (let r = await it.next(); !r.done; r = await it.next()) chunks++;
  } catch (e) {
    // The stream may end with an error event (cancelled by the shutdown).
    assert.match(String(e.message), /shutting down|terminated|aborted|closed/i);
  }
  const { code, log } = await exited;
  assert.equal(code, 0, log);
  assert.match(log, /stopped/);
});

if (proc.exitCode === null) proc.kill('SIGKILL');
fs.rmSync(tmp, { recursive: true, force: true });
const failed = results.filter(([, ok]) => !ok);
console.log(`${results.length - failed.length}/${results.length} passed`);
process.exit(failed.length ? 1 : 0);
