use norepeat::attribute::Rejected;
use norepeat::store::MemoryStore;

struct E;
impl From<Rejected> for E {
    fn from(_: Rejected) -> Self {
        E
    }
}

#[norepeat::guard(store = store, key = "{id}", mode = once, abandoned = maybe)]
async fn f(store: &MemoryStore, id: u64) -> Result<(), E> {
    let _ = (store, id);
    Ok(())
}

fn main() {}
