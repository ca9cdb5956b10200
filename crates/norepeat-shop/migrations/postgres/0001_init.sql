-- The shop's schema (PostgreSQL). The migrator holds an advisory lock, so two
-- processes starting at once apply it exactly once; IF NOT EXISTS is belt and braces.

CREATE TABLE IF NOT EXISTS stock (
    sku        TEXT   PRIMARY KEY,
    available  BIGINT NOT NULL CHECK (available >= 0)
);

CREATE TABLE IF NOT EXISTS orders (
    order_id    TEXT     PRIMARY KEY,
    biz_id      TEXT     NOT NULL,
    user_id     TEXT     NOT NULL,
    sku         TEXT     NOT NULL REFERENCES stock (sku),
    quantity    BIGINT   NOT NULL CHECK (quantity > 0),
    status      TEXT     NOT NULL CHECK (status IN ('UNPAID', 'PAID', 'COMPLETED', 'CANCELLED')),
    -- 1 for rows written by the deliberately unsafe "naive" path of the storm demo.
    naive       SMALLINT NOT NULL DEFAULT 0,
    created_at  BIGINT   NOT NULL,
    updated_at  BIGINT   NOT NULL
);

-- The last line of defence: one order per (user, business id). Naive rows are
-- left out on purpose so the storm can reproduce the incident.
CREATE UNIQUE INDEX IF NOT EXISTS orders_user_biz_unique
    ON orders (user_id, biz_id) WHERE naive = 0;
CREATE INDEX IF NOT EXISTS orders_user_created ON orders (user_id, created_at);
CREATE INDEX IF NOT EXISTS orders_status ON orders (status);

CREATE TABLE IF NOT EXISTS payments (
    payment_id  TEXT   PRIMARY KEY,
    order_id    TEXT   NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    user_id     TEXT   NOT NULL,
    amount      BIGINT NOT NULL,
    status      TEXT   NOT NULL CHECK (status IN ('PENDING', 'SUCCEEDED', 'FAILED')),
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS payments_order ON payments (order_id);
CREATE INDEX IF NOT EXISTS payments_status ON payments (status);

-- Transactional outbox: one `order.paid` event per order (event_id = order_id).
CREATE TABLE IF NOT EXISTS outbox (
    seq           BIGSERIAL PRIMARY KEY,
    event_id      TEXT      NOT NULL UNIQUE,
    event_type    TEXT      NOT NULL,
    user_id       TEXT      NOT NULL,
    points        BIGINT    NOT NULL,
    payload       TEXT      NOT NULL,
    published     SMALLINT  NOT NULL DEFAULT 0,
    created_at    BIGINT    NOT NULL,
    published_at  BIGINT
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (published, seq);

-- Points ledger: the unique key on order_id makes awarding idempotent.
CREATE TABLE IF NOT EXISTS points_ledger (
    order_id    TEXT   PRIMARY KEY,
    user_id     TEXT   NOT NULL,
    points      BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS points_ledger_user ON points_ledger (user_id);

-- Small key/value settings shared by every instance (e.g. the token secret).
CREATE TABLE IF NOT EXISTS shop_meta (
    meta_key    TEXT PRIMARY KEY,
    meta_value  TEXT NOT NULL
);
