#!/usr/bin/env node
// Real-browser test of the gateway's CORS (issue 54): headless Debian
// chromium driven by playwright-core, a page of one origin calling the
// gateway on another, as a shop's front end calls its API.
//
//   node tests/browser/gateway_cors.test.mjs GATEWAY_URL LISTED_URL OTHER_URL
//
// LISTED_URL is a backend (crates/norepeat-gateway/tests/backend.py) whose
// origin the gateway's `cors.allow_origins` lists, OTHER_URL another that it
// does not. From a page of the listed origin, a JSON `POST /payments` with
// an Idempotency-Key (not a simple request: the browser sends a preflight)
// answers 201; the same again is a replay whose Idempotent-Replayed the page
// can read; the key with another body is the gateway's 422, whose JSON the
// page can read. From a page of the other origin the browser refuses the
// answer (fetch rejects). The backend ran one payment.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [gateway, listed, other] = process.argv.slice(2).map((u) => u?.replace(/\/+$/, ''));
if (!gateway || !listed || !other) {
  console.error('usage: node gateway_cors.test.mjs GATEWAY_URL LISTED_URL OTHER_URL');
  process.exit(2);
}
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
assert.ok(existsSync(CHROMIUM), `no chromium at ${CHROMIUM}`);

/// POST /payments from the page, as its script would: what it can read.
const pay = (page, key, amount) => page.evaluate(async ([url, key, amount]) => {
  try {
    const res = await fetch(`${url}/payments`, {
      method: 'POST',
      credentials: 'include',
      headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key, 'X-User-Id': 'u1' },
      body: JSON.stringify({ amount }),
    });
    return {
      status: res.status,
      replayed: res.headers.get('Idempotent-Replayed'),
      body: await res.json(),
    };
  } catch (e) {
    return { error: String(e) };
  }
}, [gateway, key, amount]);

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage();
  await page.goto(`${listed}/effects`);
  const first = await pay(page, 'k1', 5);
  assert.equal(first.status, 201, JSON.stringify(first));
  assert.equal(first.replayed, null);
  console.log('  a listed origin: the payment, 201');
  const replay = await pay(page, 'k1', 5);
  assert.equal(replay.status, 201, JSON.stringify(replay));
  assert.equal(replay.replayed, 'true', 'the page reads Idempotent-Replayed');
  assert.equal(replay.body.effect, first.body.effect);
  console.log('  the same again: the replay, Idempotent-Replayed read');
  const mismatch = await pay(page, 'k1', 6);
  assert.equal(mismatch.status, 422, JSON.stringify(mismatch));
  assert.equal(mismatch.body.code, 'idempotency_key_mismatch');
  console.log('  the key with another body: the gateway\'s 422, its JSON read');

  await page.goto(`${other}/effects`);
  const refused = await pay(page, 'k2', 5);
  assert.ok(refused.error, `another origin's page reads nothing: ${JSON.stringify(refused)}`);
  console.log('  another origin: the browser refuses the answer');

  const effects = await (await fetch(`${listed}/effects`)).json();
  assert.equal(effects['/payments'], 1, 'the backend ran one payment');
} finally {
  await browser.close();
}
