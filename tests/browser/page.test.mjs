#!/usr/bin/env node
// Real-browser test of the shop's web page (GET /): headless Debian chromium
// driven by playwright-core, against a running shop.
//
//   node tests/browser/page.test.mjs BASE_URL [--expect-broken | --expect-broken-payment]
//
// Normal mode, the whole flow of the page:
// - orders: loads the page, places an order, clicks the button five times as
//   fast as it can (exactly one order), does it again with the disabled-button
//   guard bypassed (the back end still makes exactly one), places a deliberate
//   second order and replays a business id;
// - payments: a double click on Pay under a slow network makes one payment; a
//   payment whose first answer is lost (network error) or late (the page's own
//   timeout) is retried with the same Idempotency-Key and the shop replays it
//   (`Idempotent-Replayed: true`, shown on the page), with one payment run;
// - the provider's SUCCESS notice, sent several times from the page's demo
//   control and from here, turns the order PAID once, and the points arrive
//   once: 10 per unit, not more.
// Every check is made on the page and through the API (GET /orders, GET
// /points, /metrics for how many payments ran). Exit 0 when every check holds.
//
// --expect-broken: runs the same checks on `/?brokenTokenFlow=1`, where the page
// resends its old token instead of fetching a new one after a submit. There the
// checks MUST fail (a later submit gets 409 duplicate_submission); the run exits
// 0 only if they do, proving the test can catch a broken token flow.
//
// --expect-broken-payment: runs the same checks on `/?brokenPaymentRetry=1`,
// where the page's retries of a payment each carry a new Idempotency-Key. There
// the payment-retry check MUST fail (the retry is a second payment attempt, not
// a replay); the run exits 0 only if it does.
//
// Environment: SCREENSHOT=path saves a screenshot once orders are paid and
// their points shown (normal mode); CHROMIUM=path overrides /usr/bin/chromium.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';

const MODES = { '--expect-broken': 'token', '--expect-broken-payment': 'payment' };
const args = process.argv.slice(2);
const flags = args.filter((a) => a.startsWith('--'));
const base = args.find((a) => !a.startsWith('--'))?.replace(/\/+$/, '');
if (!base || flags.length > 1 || flags.some((f) => !(f in MODES))) {
  console.error('usage: node page.test.mjs BASE_URL [--expect-broken | --expect-broken-payment]');
  process.exit(2);
}
// Which front-end bug the page is asked to have (null: none).
const broken = flags.length ? MODES[flags[0]] : null;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SCREENSHOT = process.env.SCREENSHOT || '';
const TOTAL_TIMEOUT_MS = 170_000;

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
const pointsOf = async (user) => (await apiGet('/points', user)).points;
const orderStatus = async (user, orderId) => (await apiGet(`/orders/${orderId}`, user)).status;

// The provider's notice, as the provider sends it (unsigned: the test's shop
// has no callback secret).
async function providerNotice(paymentId) {
  const res = await fetch(`${base}/payments/callback`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ paymentId, status: 'SUCCESS' }),
  });
  return { status: res.status, body: await res.json().catch(() => null) };
}

// How many requests the idempotency layer let through to the payment handler
// (`admitted`: each one is a payment run) or answered from a stored response
// (`replayed`), from the shop's Prometheus metrics.
async function idempotencyDecisions(outcome) {
  const res = await fetch(`${base}/metrics`);
  assert.equal(res.status, 200, 'GET /metrics');
  let n = 0;
  for (const line of (await res.text()).split('\n')) {
    const m = /^norepeat_decisions_total\{([^}]*)\}\s+(\S+)/.exec(line);
    if (m && m[1].includes('mode="idempotency"') && m[1].includes(`outcome="${outcome}"`)) n += Number(m[2]);
  }
  return n;
}
const paymentDecisions = async () => ({
  admitted: await idempotencyDecisions('admitted'),
  replayed: await idempotencyDecisions('replayed'),
});

// --- watching a page ---

// Records what a page sends and what goes wrong on it. Failures of POST
// /payments that a step causes on purpose are announced in `expectFailures`.
function watch(page, observed) {
  const w = { pageErrors: [], posts: [], payPosts: [], expectFailures: 0 };
  page.setDefaultTimeout(15_000);
  page.on('pageerror', (e) => w.pageErrors.push(e.message));
  page.on('console', (m) => {
    // The browser logs every 4xx answer and failed load; the 409s here are expected.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) w.pageErrors.push(m.text());
  });
  page.on('requestfailed', (req) => {
    if (new URL(req.url()).pathname === '/payments' && w.expectFailures > 0) {
      w.expectFailures -= 1;
      return;
    }
    w.pageErrors.push(`request failed: ${req.url()} (${req.failure()?.errorText})`);
  });
  page.on('response', (res) => {
    if (res.status() === 404) w.pageErrors.push(`404 for ${res.url()}`);
  });
  page.on('request', (req) => {
    if (req.method() !== 'POST') return;
    const path = new URL(req.url()).pathname;
    if (path === '/orders') {
      // Every POST /orders the page sends, with its token and answer.
      const entry = { token: req.headers()['repeat-token'], status: null, code: null };
      w.posts.push(entry);
      req.response().then(async (res) => {
        // The body first: `postsSettled` waits on `status`, so it must be
        // set last or a reader may see a status without its code.
        entry.code = (await res?.json().catch(() => null))?.code ?? null;
        entry.status = res?.status() ?? null;
        if (entry.code === 'duplicate_submission') observed.duplicate = true;
      }).catch(() => {});
    } else if (path === '/payments') {
      // Every POST /payments, with its key and whether its answer came back.
      const entry = { key: req.headers()['idempotency-key'], status: null, replayed: null };
      w.payPosts.push(entry);
      req.response().then((res) => {
        entry.replayed = res ? res.headers()['idempotent-replayed'] === 'true' : null;
        entry.status = res ? res.status() : 'no answer';
      }).catch(() => { entry.status = 'no answer'; });
    }
  });
  return w;
}

// --- the payment part of the page ---

const payButton = (page, orderId) => page.locator(`#orders tr[data-order-id="${orderId}"] button[data-action="pay"]`);

async function payResult(page) {
  return page.$eval('#pay-result', (r) => ({
    outcome: r.dataset.outcome,
    status: r.dataset.status,
    replayed: r.dataset.replayed,
    paymentId: r.dataset.paymentId,
    orderId: r.dataset.orderId,
    key: r.dataset.key,
    text: r.textContent.trim(),
    log: [...document.querySelectorAll('#pay-log li')].map((li) => ({ key: li.dataset.key, kind: li.dataset.kind, text: li.textContent })),
  }));
}

// Waits until the payment panel shows the end of the payment of `orderId`.
const waitForPayment = (page, orderId) => page.waitForFunction((id) => {
  const r = document.getElementById('pay-result');
  return !r.hidden && r.dataset.orderId === id && r.dataset.outcome !== 'pending';
}, orderId, { timeout: 30_000 });

const waitForOrderRow = (page, orderId, status) => page.waitForFunction(
  ([id, st]) => document.querySelector(`#orders tr[data-order-id="${id}"]`)?.dataset.status === st, [orderId, status],
).catch(async () => assert.fail(`page shows order ${orderId} as ${await page.getAttribute(`#orders tr[data-order-id="${orderId}"]`, 'data-status')}, expected ${status}`));

const waitForPoints = (page, n) => page.waitForFunction(
  (want) => document.getElementById('points').dataset.points === String(want), n,
).catch(async () => assert.fail(`page shows ${await page.textContent('#points')} points, expected ${n}`));

// Presses the page's provider control `count` times, one after the other: the
// first notice is applied, every later one already applied.
async function pressNotice(page, count, what) {
  for (let i = 1; i <= count; i++) {
    await page.click('#notice');
    await page.waitForFunction((n) => document.getElementById('notice-result').dataset.sent === String(n)
      && !document.getElementById('notice').disabled, i);
    const outcome = await page.getAttribute('#notice-result', 'data-outcome');
    const text = (await page.textContent('#notice-result')).trim();
    assert.equal(outcome, i === 1 ? 'applied' : 'already_applied', `${what}, notice ${i} from the page: "${text}"`);
  }
}

// --- the flow ---

async function runFlow(browser, observed) {
  const context = await browser.newContext({ viewport: { width: 1000, height: 760 } });
  const page = await context.newPage();
  const w = watch(page, observed);
  const { posts } = w;

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
  const waitForOrdersCount = (p, n) => p.waitForFunction(
    (count) => document.getElementById('orders-count').dataset.count === String(count), n,
  ).catch(async () => assert.fail(`page lists ${await p.textContent('#orders-count')} orders, expected ${n}`));
  const postsSettled = async () => {
    for (let i = 0; i < 100 && posts.some((p) => p.status === null); i++) await sleep(50);
  };
  const deliberate = []; // the token of each single, deliberate submit
  const lastToken = () => deliberate.push(posts.at(-1)?.token);
  const query = broken ? EXPECTED[broken].query : '';

  // 1. Load: a token is fetched, the stock and the points are shown.
  observed.stage = 'orders';
  await page.goto(`${base}/${query}`);
  await waitForToken(0);
  assert.equal(await page.inputValue('#user-id'), 'u1', 'default user id');
  for (const sku of ['SKU-1', 'SKU-2', 'SKU-3']) await waitForStockCell(sku, await stockOf(sku));
  log('page loaded: repeat token fetched, stock of SKU-1..3 shown');

  // 2. A fresh user (its own orders list); changing the user fetches a new token.
  const user = `browser-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}`;
  let seq = await tokenSeq();
  await page.fill('#user-id', user);
  await waitForToken(seq);
  await waitForOrdersCount(page, 0);
  await waitForPoints(page, 0);
  log(`user changed to ${user}: new token fetched, 0 orders and 0 points shown`);

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
  await waitForOrdersCount(page, 1);
  log(`order 1 created (${orders[0].orderId}); SKU-1 stock ${stock1} -> ${stock1 - 2} on the page`);

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
  await waitForOrdersCount(page, 4);
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
  await waitForOrdersCount(page, 5);

  // --- payments ---
  observed.stage = 'payments';
  const [o1, o2, o3] = orders;
  for (const o of orders) await payButton(page, o.orderId).waitFor();
  log('every unpaid order has a Pay button');

  // 8. A double click on Pay under a slow network (the request held back
  //    800 ms, on top of the shop's own payment latency): the button is
  //    disabled at once, one request, one payment run. Clicking the button
  //    again with its disabled state bypassed sends nothing either.
  let before = await paymentDecisions();
  let payFrom = w.payPosts.length;
  await page.route('**/payments', async (route) => {
    if (route.request().method() === 'POST') await sleep(800);
    await route.fallback();
  });
  await payButton(page, o1.orderId).scrollIntoViewIfNeeded();
  const payBox = await payButton(page, o1.orderId).boundingBox();
  await page.mouse.click(payBox.x + payBox.width / 2, payBox.y + payBox.height / 2, { clickCount: 2 });
  assert.equal(await payButton(page, o1.orderId).evaluate((b) => b.disabled), true, 'Pay is disabled while the payment runs');
  assert.equal(await page.getAttribute('#pay-result', 'data-outcome'), 'pending', 'the panel shows the payment running');
  await payButton(page, o1.orderId).evaluate((b) => { for (let i = 0; i < 3; i++) { b.disabled = false; b.click(); } });
  await waitForPayment(page, o1.orderId);
  await page.unroute('**/payments');
  let pr = await payResult(page);
  let after = await paymentDecisions();
  assert.equal(w.payPosts.length - payFrom, 1, 'double click on Pay: requests sent');
  assert.equal(pr.outcome, 'created', `double click on Pay: page says "${pr.text}"`);
  assert.equal(pr.replayed, 'false', 'double click on Pay: a first answer, not a replay');
  assert.match(pr.paymentId ?? '', /\S/, 'double click on Pay: the page shows the payment id');
  assert.ok(pr.text.includes(pr.paymentId), `double click on Pay: the answer names the payment (${pr.text})`);
  assert.equal(after.admitted - before.admitted, 1, 'double click on Pay: payments run by the shop');
  assert.equal(await orderStatus(user, o1.orderId), 'UNPAID', 'double click on Pay: the order waits for the provider');
  assert.equal(await payButton(page, o1.orderId).count(), 0, 'no Pay button for an order with a live payment');
  const pay1 = pr.paymentId;
  log(`double click on Pay, slow network: button disabled, 1 request, 1 payment (${pay1})`);

  // 9. The provider's SUCCESS notice, three times from the page's demo control
  //    and twice more from here: applied once, the order PAID, 10 points per
  //    unit, once.
  await pressNotice(page, 3, 'first payment');
  for (let i = 0; i < 2; i++) {
    const n = await providerNotice(pay1);
    assert.deepEqual([n.status, n.body?.result], [200, 'already_applied'], `notice resent from the API: ${JSON.stringify(n.body)}`);
  }
  await waitForOrderRow(page, o1.orderId, 'PAID');
  assert.equal(await orderStatus(user, o1.orderId), 'PAID', 'notices: the order is PAID');
  let points = 10 * o1.quantity;
  await waitForPoints(page, points);
  assert.equal(await pointsOf(user), points, 'notices: points through the API');
  log(`5 SUCCESS notices: 1 applied, 4 already applied; order PAID; ${points} points on the page`);

  // 10. A payment whose first answer is lost on the way back: the shop made the
  //     payment, the page met a network error and retries with the same key;
  //     the shop replays its first answer and runs no second payment.
  observed.stage = 'payment retry';
  before = await paymentDecisions();
  payFrom = w.payPosts.length;
  let firstAnswer = null;
  await page.route('**/payments', async (route) => {
    if (route.request().method() !== 'POST' || firstAnswer) return route.fallback();
    firstAnswer = { pending: true };
    const res = await route.fetch(); // the shop answers in full...
    firstAnswer = { status: res.status(), body: await res.json().catch(() => null) };
    w.expectFailures += 1;
    await route.abort('connectionreset'); // ...and the page never sees it
  });
  await payButton(page, o2.orderId).click();
  await waitForPayment(page, o2.orderId);
  await page.unroute('**/payments');
  pr = await payResult(page);
  after = await paymentDecisions();
  const lost = w.payPosts.slice(payFrom);
  if (new Set(lost.map((p) => p.key)).size > 1) observed.newKeyOnRetry = true;
  observed.paymentRuns = after.admitted - before.admitted;
  assert.equal(firstAnswer?.status, 201, `lost answer: the shop made the payment (${JSON.stringify(firstAnswer)})`);
  assert.ok(lost.length >= 2, `lost answer: the page retried (${lost.length} requests)`);
  assert.deepEqual(lost.map((p) => p.key), lost.map(() => pr.key), 'lost answer: every try carries the payment\'s one key');
  assert.equal(pr.outcome, 'replayed', `lost answer: page says "${pr.text}"`);
  assert.equal(pr.replayed, 'true', 'lost answer: Idempotent-Replayed: true');
  assert.equal(pr.paymentId, firstAnswer.body?.paymentId, 'lost answer: the replay is the first answer');
  assert.ok(pr.log.some((l) => l.kind === 'retry' && /network error/.test(l.text)), `lost answer: the log shows the retry (${JSON.stringify(pr.log)})`);
  assert.ok(/Idempotent-Replayed: true/.test(pr.log.at(-1)?.text ?? ''), 'lost answer: the log shows the replay');
  assert.equal(after.admitted - before.admitted, 1, 'lost answer: payments run by the shop');
  assert.ok(after.replayed - before.replayed >= 1, 'lost answer: the shop replayed');
  const pay2 = pr.paymentId;
  log(`lost answer: ${lost.length} tries with one key, replayed (${pay2}), 1 payment run`);

  // 11. A payment whose first answer comes too late for the page's own timeout
  //     (a second tab, opened with ?payTimeoutMs=1500): the page gives up on
  //     that try (AbortController) and retries with the same key; the shop,
  //     which finished the first, replays it.
  const page2 = await context.newPage();
  const w2 = watch(page2, observed);
  await page2.goto(`${base}/${query ? `${query}&` : '?'}payTimeoutMs=1500`);
  await page2.fill('#user-id', user);
  await waitForOrdersCount(page2, 5);
  await payButton(page2, o3.orderId).waitFor();
  before = await paymentDecisions();
  let lateAnswer = null;
  await page2.route('**/payments', async (route) => {
    if (route.request().method() !== 'POST' || lateAnswer) return route.fallback();
    lateAnswer = { pending: true };
    w2.expectFailures += 1;
    const res = await route.fetch(); // the shop answers in full...
    lateAnswer = { status: res.status(), body: await res.json().catch(() => null) };
    await sleep(2500); // ...after the page stopped waiting
    await route.fulfill({ response: res }).catch(() => {});
  });
  await payButton(page2, o3.orderId).click();
  await waitForPayment(page2, o3.orderId);
  await page2.unroute('**/payments');
  pr = await payResult(page2);
  after = await paymentDecisions();
  const late = w2.payPosts;
  if (new Set(late.map((p) => p.key)).size > 1) observed.newKeyOnRetry = true;
  assert.equal(lateAnswer?.status, 201, `late answer: the shop made the payment (${JSON.stringify(lateAnswer)})`);
  assert.ok(late.length >= 2, `late answer: the page retried (${late.length} requests)`);
  assert.deepEqual(late.map((p) => p.key), late.map(() => pr.key), 'late answer: every try carries the payment\'s one key');
  assert.equal(pr.outcome, 'replayed', `late answer: page says "${pr.text}"`);
  assert.equal(pr.paymentId, lateAnswer.body?.paymentId, 'late answer: the replay is the first answer');
  assert.ok(pr.log.some((l) => l.kind === 'retry' && /no answer within 1.5 s/.test(l.text)), `late answer: the log shows the timeout (${JSON.stringify(pr.log)})`);
  assert.equal(after.admitted - before.admitted, 1, 'late answer: payments run by the shop');
  log(`late answer: timed out after 1.5 s, ${late.length} tries with one key, replayed, 1 payment run`);

  // 12. Both paid: notices from each tab and from here; the points arrive once per order.
  observed.stage = 'points';
  await pressNotice(page2, 2, 'late-answer payment');
  await pressNotice(page, 2, 'lost-answer payment');
  for (const id of [pay2, pr.paymentId]) {
    const n = await providerNotice(id);
    assert.deepEqual([n.status, n.body?.result], [200, 'already_applied'], `notice resent from the API: ${JSON.stringify(n.body)}`);
  }

  // 13. A 503 (the shop could not guard the payment, so it made none; here
  //     answered by the network layer) is retried with the same key.
  const o4 = orders[3];
  before = await paymentDecisions();
  payFrom = w2.payPosts.length;
  let refused = false;
  await page2.route('**/payments', async (route) => {
    if (route.request().method() !== 'POST' || refused) return route.fallback();
    refused = true;
    await route.fulfill({
      status: 503,
      contentType: 'application/problem+json',
      headers: { 'Retry-After': '1' },
      body: JSON.stringify({ type: 'about:blank', title: 'Service Unavailable', status: 503, detail: 'The guard store is down.', code: 'guard_unavailable' }),
    });
  });
  await payButton(page2, o4.orderId).click();
  await waitForPayment(page2, o4.orderId);
  await page2.unroute('**/payments');
  pr = await payResult(page2);
  after = await paymentDecisions();
  const refusedTries = w2.payPosts.slice(payFrom);
  assert.deepEqual(refusedTries.map((p) => p.status), [503, 201], 'after a 503: the answers to the tries');
  assert.deepEqual(refusedTries.map((p) => p.key), [pr.key, pr.key], 'after a 503: both tries carry the payment\'s one key');
  assert.equal(pr.outcome, 'created', `after a 503: page says "${pr.text}"`);
  assert.ok(pr.log.some((l) => l.kind === 'retry' && /^Try 1: 503 guard_unavailable/.test(l.text)), `after a 503: the log shows the retry (${JSON.stringify(pr.log)})`);
  assert.equal(after.admitted - before.admitted, 1, 'after a 503: payments run by the shop');
  log('503 guard_unavailable: retried after Retry-After with the same key, 1 payment run');

  await page2.close();
  points = 10 * (o1.quantity + o2.quantity + o3.quantity);
  await waitForPoints(page, points);
  for (const o of [o1, o2, o3]) await waitForOrderRow(page, o.orderId, 'PAID');
  await sleep(1500); // time for a second award, if there were one
  assert.equal(await pointsOf(user), points, 'points after every notice: 10 per unit of the paid orders, once');
  assert.equal(await page.getAttribute('#points', 'data-points'), String(points), 'points on the page stay put');
  const final = await ordersOf(user);
  const paid = new Set([o1, o2, o3].map((o) => o.orderId));
  for (const o of final) assert.equal(o.status, paid.has(o.orderId) ? 'PAID' : 'UNPAID', `order ${o.orderId} through the API`);
  log(`points arrive once: ${points} = 10 x ${o1.quantity + o2.quantity + o3.quantity} units, on the page and through the API`);

  if (SCREENSHOT && !broken) {
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
    log(`screenshot saved to ${SCREENSHOT}`);
  }

  assert.deepEqual(w.pageErrors, [], 'no JavaScript errors on the page');
  assert.deepEqual(w2.pageErrors, [], 'no JavaScript errors on the second tab');
  await context.close();
}

// --- main ---

// What each broken page must trip over, for the run to count as the expected failure.
const EXPECTED = {
  token: {
    query: '?brokenTokenFlow=1',
    caught: (o) => o.duplicate && o.stage === 'orders',
    pass: 'with the old token resent, the shop answered 409 and the checks failed',
    fail: '?brokenTokenFlow=1 resent an old token, yet every check passed: the test cannot catch that bug',
  },
  payment: {
    query: '?brokenPaymentRetry=1',
    caught: (o) => o.newKeyOnRetry && o.paymentRuns > 1 && o.stage === 'payment retry',
    pass: 'with a new key per retry, the retry was a second payment attempt, not a replay, and the checks failed',
    fail: '?brokenPaymentRetry=1 retried with new keys, yet every check passed: the test cannot catch that bug',
  },
};

async function main() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no browser at ${CHROMIUM} (install Debian's chromium: apt-get install -y chromium)`);
  }
  console.log(`browser test of ${base}/ ${broken ? `with ${EXPECTED[broken].query} (expecting failure)` : ''}`);
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60_000,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--no-proxy-server', '--disable-dev-shm-usage'],
  });
  const observed = { duplicate: false, newKeyOnRetry: false, paymentRuns: 0, stage: null };
  try {
    if (!broken) {
      await runFlow(browser, observed);
      console.log('PASS: the page follows the whole flow: one order per submission, one payment per press of Pay, points once');
      return 0;
    }
    const expected = EXPECTED[broken];
    try {
      await runFlow(browser, observed);
    } catch (e) {
      if (e instanceof assert.AssertionError && expected.caught(observed)) {
        console.log(`  assertion failed as it must (${observed.stage}): ${e.message.split('\n')[0]}`);
        if (broken === 'payment') console.log(`  the shop ran ${observed.paymentRuns} payment attempts for one press of Pay`);
        console.log(`PASS (expected failure): ${expected.pass}`);
        return 0;
      }
      throw e;
    }
    console.error(`FAIL: ${expected.fail}`);
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
