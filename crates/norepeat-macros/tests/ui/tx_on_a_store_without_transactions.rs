use norepeat::attribute::Rejected;
use norepeat::store::MemoryStore;

#[derive(Debug)]
struct E;
impl From<Rejected> for E {
    fn from(_: Rejected) -> Self {
        E
    }
}

#[norepeat::guard(store = store, key = "{id}", mode = once, tx = tx)]
async fn f(store: &MemoryStore, id: u64) -> Result<u64, E> {
    let _ = &mut tx;
    Ok(id)
}

fn main() {}
