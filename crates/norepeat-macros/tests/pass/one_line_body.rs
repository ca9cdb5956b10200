//! A guarded function whose body is one line compiles without a warning:
//! no "unnecessary braces" from the expansion (which `cargo fix` would
//! "fix" into broken code). Free functions on the process-wide store, with
//! and without a bounded wait, and a method with its own store.
#![deny(warnings)]

use norepeat::attribute::Rejected;
use norepeat::store::MemoryStore;

struct E;
impl From<Rejected> for E {
    fn from(_: Rejected) -> Self {
        E
    }
}

#[norepeat::guard(key = "{id}")]
async fn window(id: u64) -> Result<u64, E> { Ok(id) }

#[norepeat::guard(key = "{id}", mode = once, wait = "2s")]
async fn once(id: u64) -> Result<u64, E> {
    Ok(1)
}

struct Shop {
    store: MemoryStore,
}

impl Shop {
    #[norepeat::guard(store = self.store, key = "{id}", mode = once, retention = "1h", lease = "5s")]
    async fn place(&self, id: u64) -> Result<(), E> {
        Ok(())
    }
}

fn main() {
    norepeat::attribute::set_default_store(MemoryStore::default()).unwrap();
    let shop = Shop { store: MemoryStore::default() };
    // Built, not run: this test is about the expansion's warnings.
    drop((window(1), once(2), shop.place(3)));
}
