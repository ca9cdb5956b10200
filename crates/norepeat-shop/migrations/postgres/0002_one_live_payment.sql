-- At most one live (PENDING or SUCCEEDED) payment per order, as a partial
-- unique index: the database, not the idempotency store, makes a payment single.
--
-- A database written by an earlier version may already hold several live
-- payments for one order. They are not rewritten (a SUCCEEDED payment took
-- money; marking it FAILED would hide that). Instead every order keeps one
-- live payment (a SUCCEEDED one first, then the oldest) and the others are
-- marked `superseded`: left out of the index, never the order's live payment
-- (a SUCCESS notice for one changes nothing), and reported by every
-- reconciliation pass as an order with more than one non-failed payment.
--
-- The migrator holds an advisory lock: it runs once.

ALTER TABLE payments ADD COLUMN superseded SMALLINT NOT NULL DEFAULT 0;

UPDATE payments SET superseded = 1
WHERE status IN ('PENDING', 'SUCCEEDED')
  AND payment_id <> (
    SELECT p.payment_id FROM payments p
    WHERE p.order_id = payments.order_id AND p.status IN ('PENDING', 'SUCCEEDED')
    ORDER BY CASE p.status WHEN 'SUCCEEDED' THEN 0 ELSE 1 END, p.created_at, p.payment_id
    LIMIT 1
  );

CREATE UNIQUE INDEX payments_one_live
    ON payments (order_id) WHERE status IN ('PENDING', 'SUCCEEDED') AND superseded = 0;
