// After an argument error the function is kept as written, and an argument
// used only by the attribute (`store` here) draws no "unused variable"
// warning: the error is the only message.
use norepeat::attribute::Rejected;
use norepeat::store::MemoryStore;

struct E;
impl From<Rejected> for E {
    fn from(_: Rejected) -> Self {
        E
    }
}

#[norepeat::guard(store = store, key = "{order_id}", mode = twice)]
async fn f(store: &MemoryStore, order_id: u64) -> Result<(), E> {
    Ok(())
}

fn main() {}
