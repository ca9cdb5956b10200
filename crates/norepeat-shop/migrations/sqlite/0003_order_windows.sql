-- The database's own window for orders without a business id (`POST
-- /orders/quick` without `bizId`): one row per (user, request fingerprint),
-- claimed in the order's transaction and held until `until_ms` (Unix
-- milliseconds). A repeat inside the window finds the row and writes nothing,
-- whatever the entry guard's store decided (down, slow, or each instance
-- remembering only its own admissions). A failed order rolls its claim back,
-- so a retry is let through at once.

CREATE TABLE IF NOT EXISTS order_windows (
    user_id      TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL,
    until_ms     INTEGER NOT NULL,
    PRIMARY KEY (user_id, fingerprint)
);
