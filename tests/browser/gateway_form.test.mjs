#!/usr/bin/env node
// Real-browser test of the gateway's tokens on a plain HTML form: headless
// Debian chromium driven by playwright-core, against a norepeat-gateway in
// front of crates/norepeat-gateway/tests/backend.py.
//
//   node tests/browser/gateway_form.test.mjs GATEWAY_URL BACKEND_URL
//
// The backend's GET /form page sets the caller's cookie (`sid`), fetches a
// repeat token from the gateway (GET /.norepeat/token, the cookie the
// caller) into a hidden `repeatToken` field, and submits a plain
// application/x-www-form-urlencoded POST /orders: no script sends the
// order. Checks: the first submit reaches the backend (201); the same
// token submitted again (the back button's stale form) is refused 409
// `duplicate_submission`, shown as the gateway's HTML page (a browser's
// navigation prefers text/html) with a link back to the form; the page
// reloaded gets a new token and submits again (201); the backend counted
// exactly two orders.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [gateway, backend] = process.argv.slice(2).map((u) => u?.replace(/\/+$/, ''));
if (!gateway || !backend) {
  console.error('usage: node gateway_form.test.mjs GATEWAY_URL BACKEND_URL');
  process.exit(2);
}
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
assert.ok(existsSync(CHROMIUM), `no chromium at ${CHROMIUM}`);
const effects = async () => (await (await fetch(`${backend}/effects`)).json())['/orders'] ?? 0;

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage();
  const load = async () => {
    await page.goto(`${gateway}/form`);
    await page.waitForFunction(() => document.querySelector('#token').value.length > 0);
    return page.inputValue('#token');
  };
  const submit = async () => {
    const [res] = await Promise.all([
      page.waitForResponse((r) => r.url().endsWith('/orders') && r.request().method() === 'POST'),
      page.click('#buy'),
    ]);
    return { status: res.status(), body: await res.text() };
  };

  const token = await load();
  const first = await submit();
  assert.equal(first.status, 201, `the first submit: ${first.body}`);
  console.log('  the form with its token: 201');

  // The stale form: the page as it was, its token already used.
  await load();
  await page.evaluate((t) => { document.querySelector('#token').value = t; }, token);
  const again = await submit();
  assert.equal(again.status, 409, `the same token again: ${again.body}`);
  // The refusal, as the page the browser shows: its title, a link back.
  assert.equal(await page.title(), '409 Duplicate submission', again.body);
  assert.equal(await page.textContent('h1'), 'Duplicate submission');
  assert.match(again.body, /duplicate_submission/);
  assert.equal(await page.getAttribute('a', 'href'), `${gateway}/form`);
  console.log('  the same token again: 409 duplicate_submission, as a page');

  const fresh = await load();
  assert.notEqual(fresh, token, 'a reload fetches a new token');
  const second = await submit();
  assert.equal(second.status, 201, `a new token: ${second.body}`);
  console.log('  a reloaded form, a new token: 201');

  assert.equal(await effects(), 2, 'the backend ran exactly two orders');
  console.log('  the backend ran two orders');
} finally {
  await browser.close();
}
