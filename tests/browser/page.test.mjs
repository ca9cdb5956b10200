#!/usr/bin/env node
// Real-browser test of the shop's web page (GET /): headless Debian chromium
// driven by playwright-core, against a running shop.
//
//   node tests/browser/page.test.mjs BASE_URL [--expect-broken]
//
// Normal mode: loads the page, places an order, clicks the button five times as
// fast as it can (exactly one order), does it again with the disabled-button
// guard bypassed (the back end still makes exactly one), places a deliberate
// second order and replays a business id. Exit 0 when every check holds.
//
// --expect-broken: runs the same checks on `/?brokenTokenFlow=1`, where the page
// resends its old token instead of fetching a new one after a submit. There the
// checks MUST fail (a later submit gets 409 duplicate_submission); the run exits
// 0 only if they do, proving the test can catch a broken token flow.
//
// Environment: SCREENSHOT=path saves a screenshot after the first order (normal
// mode); CHROMIUM=path overrides /usr/bin/chromium.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

const args = process.argv.slice(2);
const expectBroken = args.includes('--expect-broken');
const base = args.find((a) => !a.startsWith('--'))?.replace(/\/+$/, '');
if (!base || args.some((a) => a.startsWith('--') && a !== '--expect-broken')) {
  console.error('usage: node page.test.mjs BASE_URL [--expect-broken]');
  process.exit(2);
}
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SCREENSHOT = process.env.SCREENSHOT || '';
const TOTAL_TIMEOUT_MS = 120_000;

const log = (msg) => console.log(`  ${msg}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// --- the shop's API, straight from node (the test's own view of the truth) ---

async function apiGet(path, user) {
  const res = await fetch(base + path, { headers: user ? { 'X-User-Id': user } : {} });
  const body = await res.json().catch(() => null);
  assert.equal(res.status, 200, `GET ${path} answered ${res.status}: ${JSON.stringify(body)}`);
  return body;
}
const ordersOf = async (user) => (await apiGet('/orders', user)).orders;
const stockOf = async (sku) => (await apiGet(`/stock/${sku}`)).available;

// --- the flow ---

async function runFlow(browser, { broken, observed }) {
  const context = await browser.newContext({ viewport: { width: 980, height: 720 } });
  const page = await context.newPage();
  page.setDefaultTimeout(15_000);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('console', (m) => {
    // The browser logs every 4xx answer; the 409s here are expected.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
  });
  page.on('requestfailed', (req) => pageErrors.push(`request failed: ${req.url()}`));
  page.on('response', (res) => {
    if (res.status() === 404) pageErrors.push(`404 for ${res.url()}`);
  });

  // Every POST /orders the page sends, with its token and answer.
  const posts = [];
  page.on('request', (req) => {
    if (req.method() === 'POST' && new URL(req.url()).pathname === '/orders') {
      const entry = { token: req.headers()['repeat-token'], status: null, code: null };
      posts.push(entry);
      req.response().then(async (res) => {
        // The body first: `postsSettled` waits on `status`, so it must be
        // set last or a reader may see a status without its code.
        entry.code = (await res?.json().catch(() => null))?.code ?? null;
        entry.status = res?.status() ?? null;
        if (entry.code === 'duplicate_submission') observed.duplicate = true;
      }).catch(() => {});
    }
  });

  const tokenSeq = async () => Number(await page.getAttribute('#token-status', 'data-token-seq'));
  // Ready = a token newer than `after` is in hand, nothing in flight, button usable.
  const waitForToken = (after) => page.waitForFunction((seq) => {
    const s = document.getElementById('token-status');
    return s.dataset.state === 'ready' && Number(s.dataset.tokenSeq) > seq
      && !document.getElementById('submit').disabled;
  }, after);
  const outcome = async () => ({
    outcome: await page.getAttribute('#result', 'data-outcome'),
    text: (await page.textContent('#result')).trim(),
  });
  const waitForStockCell = (sku, expected) => page.waitForFunction(
    ([s, n]) => document.getElementById(`stock-${s}`).dataset.available === String(n), [sku, expected],
  ).catch(async () => assert.fail(`page shows stock ${await page.textContent(`#stock-${sku}`)} for ${sku}, expected ${expected}`));
  const waitForOrdersCount = (n) => page.waitForFunction(
    (count) => document.getElementById('orders-count').dataset.count === String(count), n,
  ).catch(async () => assert.fail(`page lists ${await page.textContent('#orders-count')} orders, expected ${n}`));
  const postsSettled = async () => {
    for (let i = 0; i < 100 && posts.some((p) => p.status === null); i++) await sleep(50);
  };
  const deliberate = []; // the token of each single, deliberate submit
  const lastToken = () => deliberate.push(posts.at(-1)?.token);

  // 1. Load: a token is fetched, the stock is shown.
  await page.goto(`${base}/${broken ? '?brokenTokenFlow=1' : ''}`);
  await waitForToken(0);
  assert.equal(await page.inputValue('#user-id'), 'u1', 'default user id');
  for (const sku of ['SKU-1', 'SKU-2', 'SKU-3']) await waitForStockCell(sku, await stockOf(sku));
  log('page loaded: repeat token fetched, stock of SKU-1..3 shown');

  // 2. A fresh user (its own orders list); changing the user fetches a new token.
  const user = `browser-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}`;
  let seq = await tokenSeq();
  await page.fill('#user-id', user);
  await waitForToken(seq);
  await waitForOrdersCount(0);
  log(`user changed to ${user}: new token fetched`);

  // 3. One order: created, stock goes down by its quantity, listed.
  const stock1 = await stockOf('SKU-1');
  await page.selectOption('#sku', 'SKU-1');
  await page.fill('#quantity', '2');
  seq = await tokenSeq();
  await page.click('#submit');
  await waitForToken(seq);
  lastToken();
  let r = await outcome();
  assert.equal(r.outcome, 'created', `first order: page says "${r.text}"`);
  let orders = await ordersOf(user);
  assert.equal(orders.length, 1, 'first order: orders in the shop');
  assert.ok(r.text.includes(orders[0].orderId), `first order: the page shows the order id (${r.text})`);
  assert.equal(await stockOf('SKU-1'), stock1 - 2, 'first order: stock went down by the quantity');
  await waitForStockCell('SKU-1', stock1 - 2);
  await waitForOrdersCount(1);
  log(`order 1 created (${orders[0].orderId}); SKU-1 stock ${stock1} -> ${stock1 - 2} on the page`);
  if (SCREENSHOT && !broken) {
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
    log(`screenshot saved to ${SCREENSHOT}`);
  }

  // 4. Five clicks as fast as the mouse goes, the answer held back meanwhile:
  //    the button is disabled after the first, one request, one order.
  await page.fill('#quantity', '1');
  await page.route('**/orders', async (route) => {
    if (route.request().method() === 'POST') await sleep(800);
    await route.fallback();
  });
  seq = await tokenSeq();
  let sentBefore = posts.length;
  const box = await page.locator('#submit').boundingBox();
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2, { clickCount: 5 });
  assert.equal(await page.$eval('#submit', (b) => b.disabled), true, 'button is disabled while submitting');
  await waitForToken(seq);
  lastToken();
  await page.unroute('**/orders');
  await postsSettled();
  r = await outcome();
  assert.equal(posts.length - sentBefore, 1, 'five fast clicks: requests sent');
  assert.equal(r.outcome, 'created', `five fast clicks: page says "${r.text}"`);
  assert.equal((await ordersOf(user)).length, 2, 'five fast clicks: exactly one more order');
  assert.equal(await stockOf('SKU-1'), stock1 - 3, 'five fast clicks: stock went down by one');
  log('5 fast clicks: button disabled, 1 request, exactly 1 order');

  // 5. The same burst with the disabled-button guard bypassed: five requests
  //    with one token reach the shop, which makes exactly one order.
  seq = await tokenSeq();
  sentBefore = posts.length;
  await page.evaluate(() => {
    const b = document.getElementById('submit');
    for (let i = 0; i < 5; i++) { b.disabled = false; b.click(); }
  });
  await waitForToken(seq);
  await postsSettled();
  const burst = posts.slice(sentBefore);
  assert.equal(burst.length, 5, 'guard bypassed: requests sent');
  assert.equal(new Set(burst.map((p) => p.token)).size, 1, 'guard bypassed: all five carry one token');
  const statuses = burst.map((p) => p.status).sort();
  assert.deepEqual(statuses, [201, 409, 409, 409, 409], 'guard bypassed: answers');
  assert.ok(burst.every((p) => p.status === 201 || p.code === 'duplicate_submission'), 'guard bypassed: 409s are duplicate_submission');
  assert.equal((await ordersOf(user)).length, 3, 'guard bypassed: exactly one more order');
  assert.equal(await stockOf('SKU-1'), stock1 - 4, 'guard bypassed: stock went down by one');
  log('guard bypassed, 5 requests with one token: 1 x 201, 4 x 409, exactly 1 order');

  // 6. A deliberate next order works with the new token.
  const stock2 = await stockOf('SKU-2');
  await page.selectOption('#sku', 'SKU-2');
  await page.fill('#quantity', '3');
  seq = await tokenSeq();
  await page.click('#submit');
  await waitForToken(seq);
  lastToken();
  r = await outcome();
  assert.equal(r.outcome, 'created', `deliberate next order: page says "${r.text}"`);
  assert.equal((await ordersOf(user)).length, 4, 'deliberate next order: orders in the shop');
  await waitForStockCell('SKU-2', stock2 - 3);
  await waitForOrdersCount(4);
  log('deliberate next order created with a new token');

  // 7. A business id: the first submit orders, the same id again replays that order.
  const bizId = `biz-${user}`;
  await page.fill('#biz-id', bizId);
  await page.fill('#quantity', '1');
  for (const [i, want] of [[1, 'created'], [2, 'replayed']]) {
    seq = await tokenSeq();
    await page.click('#submit');
    await waitForToken(seq);
    lastToken();
    r = await outcome();
    assert.equal(r.outcome, want, `bizId submit ${i}: page says "${r.text}"`);
  }
  orders = await ordersOf(user);
  assert.equal(orders.length, 5, 'bizId: one order for two submits');
  assert.equal(orders.filter((o) => o.bizId === bizId).length, 1, 'bizId: one order carries it');
  log('bizId: first submit created, second replayed the same order');

  // Every deliberate submit carried its own token.
  await postsSettled();
  assert.equal(new Set(deliberate).size, deliberate.length, 'each deliberate submit used a new token');
  assert.deepEqual(pageErrors, [], 'no JavaScript errors on the page');
  await context.close();
}

// --- main ---

async function main() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no browser at ${CHROMIUM} (install Debian's chromium: apt-get install -y chromium)`);
  }
  console.log(`browser test of ${base}/ ${expectBroken ? 'with ?brokenTokenFlow=1 (expecting failure)' : ''}`);
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60_000,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--no-proxy-server', '--disable-dev-shm-usage'],
  });
  const observed = { duplicate: false };
  try {
    if (!expectBroken) {
      await runFlow(browser, { broken: false, observed });
      console.log('PASS: the page follows the token flow; exactly one order per submission');
      return 0;
    }
    try {
      await runFlow(browser, { broken: true, observed });
    } catch (e) {
      if (e instanceof assert.AssertionError && observed.duplicate) {
        console.log(`  assertion failed as it must: ${e.message.split('\n')[0]}`);
        console.log('PASS (expected failure): with the old token resent, the shop answered 409 and the checks failed');
        return 0;
      }
      throw e;
    }
    console.error('FAIL: ?brokenTokenFlow=1 resent an old token, yet every check passed: the test cannot catch that bug');
    return 1;
  } finally {
    await browser.close();
  }
}

const timer = setTimeout(() => {
  console.error(`FAIL: the browser test did not finish within ${TOTAL_TIMEOUT_MS / 1000} s`);
  process.exit(1);
}, TOTAL_TIMEOUT_MS);
main().then(
  (code) => { clearTimeout(timer); process.exitCode = code; },
  (e) => {
    clearTimeout(timer);
    console.error(`FAIL: ${e instanceof assert.AssertionError ? e.message : e.stack || e}`);
    process.exitCode = 1;
  },
);
