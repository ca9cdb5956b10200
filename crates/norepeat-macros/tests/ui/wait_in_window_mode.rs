use norepeat::attribute::Rejected;

struct E;
impl From<Rejected> for E {
    fn from(_: Rejected) -> Self {
        E
    }
}

#[norepeat::guard(key = "{id}", wait = "2s")]
async fn f(id: u64) -> Result<(), E> {
    let _ = id;
    Ok(())
}

fn main() {}
