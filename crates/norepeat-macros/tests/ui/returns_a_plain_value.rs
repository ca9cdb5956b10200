use norepeat::store::MemoryStore;

#[norepeat::guard(store = store, key = "{id}")]
async fn f(store: &MemoryStore, id: u64) -> u64 {
    let _ = store;
    id
}

fn main() {}
