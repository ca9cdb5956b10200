#!/usr/bin/env node
// Real-browser test of the gateway's `on_repeat: replay` on a plain HTML
// form: headless Debian chromium driven by playwright-core.
//
//   node tests/browser/gateway_replay.test.mjs GATEWAY_URL BACKEND_URL
//
// The backend's GET /slow-form page fetches a repeat token into a hidden
// field and posts POST /slow-orders, which takes a second and answers 303
// to the order's page (GET /order-page?n=N). A user clicks once, then
// (on a fresh form) clicks twice, then double-clicks: each time one order
// is made, and the browser ends on that order's page, never on a refusal.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [gateway, backend] = process.argv.slice(2).map((u) => u?.replace(/\/+$/, ''));
if (!gateway || !backend) {
  console.error('usage: node gateway_replay.test.mjs GATEWAY_URL BACKEND_URL');
  process.exit(2);
}
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
assert.ok(existsSync(CHROMIUM), `no chromium at ${CHROMIUM}`);
const orders = async () => (await (await fetch(`${backend}/effects`)).json())['/slow-orders'] ?? 0;

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage();
  const load = async () => {
    await page.goto(`${gateway}/slow-form`);
    await page.waitForFunction(() => document.querySelector('#token').value.length > 0);
  };
  // Polled, not `waitForURL`: a second click aborts the first submit's
  // navigation, which `waitForURL` reports as an error.
  const ends = async (how) => {
    const deadline = Date.now() + 15000;
    while (!/\/order-page\?n=\d+$/.test(page.url())) {
      assert.ok(Date.now() < deadline, `${how}: never reached the order's page (at ${page.url()})`);
      await page.waitForTimeout(100);
    }
    await page.waitForSelector('h1');
    const n = Number(new URL(page.url()).searchParams.get('n'));
    assert.equal(await page.textContent('h1'), `Order ${n}`, `${how}: the order's page`);
    return n;
  };

  await load();
  await page.click('#buy');
  const once = await ends('one click');
  assert.equal(await orders(), 1);
  console.log(`  one click: order ${once}, its page`);

  // The mouse itself, not a locator's click (which waits for the first
  // submit's navigation): the second click lands on the form still shown.
  const button = async () => {
    const box = await page.locator('#buy').boundingBox();
    return [box.x + box.width / 2, box.y + box.height / 2];
  };
  await load();
  let [x, y] = await button();
  await page.mouse.click(x, y);
  await page.waitForTimeout(200);
  await page.mouse.click(x, y);
  const twice = await ends('two clicks');
  assert.equal(await orders(), 2, 'two clicks made one more order');
  assert.equal(twice, 2);
  console.log(`  two clicks: order ${twice}, its page`);

  await load();
  [x, y] = await button();
  await page.mouse.dblclick(x, y);
  const dbl = await ends('a double click');
  assert.equal(await orders(), 3, 'a double click made one more order');
  assert.equal(dbl, 3);
  console.log(`  a double click: order ${dbl}, its page`);
} finally {
  await browser.close();
}
