use norepeat::attribute::Rejected;

struct E;
impl From<Rejected> for E {
    fn from(_: Rejected) -> Self {
        E
    }
}

#[norepeat::guard(key = "{id}", mode = once, tx = tx)]
async fn f(id: u64) -> Result<(), E> {
    let _ = id;
    Ok(())
}

fn main() {}
