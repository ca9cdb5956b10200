//! `tx = ...` in a build without a SQL store: one compile error that says
//! so, instead of "no method named `run_once_in_tx`".

use super::{Guarded, Rejected};
use std::future::Future;

/// What `tx = ...` needs of its store. No type has it in this build
/// (neither the `postgres` nor the `sqlite` feature is on), so naming it is
/// the one error a guarded function with `tx = ...` gets.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`tx = ...` needs a SQL store, and this build of norepeat has none",
    label = "`{Self}` cannot open a database transaction",
    note = "turn on norepeat's `postgres` or `sqlite` feature and name a `PgStore` or `SqliteStore` with `store = ...`"
)]
pub trait TxStore {
    /// The transaction the body would get.
    type Transaction;
}

/// As `tx_store` with a SQL feature, without the check: the one error is
/// reported by `run_once_in_tx` below.
#[doc(hidden)]
pub fn tx_store<S>(store: S) -> S {
    store
}

impl Guarded {
    /// Stands in for the SQL stores' `run_once_in_tx`; it cannot be called
    /// (no store is a [`TxStore`] in this build).
    #[doc(hidden)]
    pub fn run_once_in_tx<S, T, E, F, Fut>(
        &self,
        store: &S,
        key: &str,
        body: F,
    ) -> std::future::Pending<Result<T, E>>
    where
        S: TxStore,
        E: From<Rejected>,
        F: FnOnce(S::Transaction) -> Fut,
        Fut: Future<Output = Result<(S::Transaction, T), E>>,
    {
        // A plain fn with a concrete future: the unmet bound is reported
        // once, at the call, not again where the future is awaited.
        let _ = (self, store, key, body);
        std::future::pending()
    }
}
