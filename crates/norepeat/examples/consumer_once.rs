//! A message consumer that must act once per message, whatever the broker
//! redelivers: `#[norepeat::guard(mode = once, tx = tx)]` on SQLite. The
//! body's write and the stored result commit in one transaction, so a
//! redelivered message writes nothing and gets the first result back.
//!
//! ```sh
//! cargo run --example consumer_once --features sqlite
//! ```

use norepeat::attribute::Rejected;
use norepeat::store::SqliteStore;

/// A message as a broker delivers it (at least once).
struct Message {
    id: String,
    user: String,
    points: i64,
}

/// The consumer's error: a refusal from the guard, or the database's.
#[derive(Debug)]
enum Error {
    Refused(Rejected),
    Db(sqlx::Error),
}
impl From<Rejected> for Error {
    fn from(r: Rejected) -> Self {
        Error::Refused(r)
    }
}
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Db(e)
    }
}
impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Refused(r) => write!(f, "refused: {r}"),
            Error::Db(e) => write!(f, "database: {e}"),
        }
    }
}
impl std::error::Error for Error {}

/// Awards the message's points. `tx` is the transaction the guard opened on
/// the store's pool: the INSERT and the stored result commit together.
#[norepeat::guard(store = store, key = "{msg.id}", mode = once, tx = tx)]
async fn award(store: &SqliteStore, msg: &Message) -> Result<i64, Error> {
    sqlx::query("INSERT INTO points (user_id, n) VALUES ($1, $2)")
        .bind(&msg.user)
        .bind(msg.points)
        .execute(&mut *tx)
        .await?;
    Ok(msg.points)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One connection: every connection to `sqlite::memory:` is a database
    // of its own. A file (`sqlite://consumer.db?mode=rwc`) works the same.
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    sqlx::query("CREATE TABLE points (user_id TEXT NOT NULL, n INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let store = SqliteStore::new(pool.clone());
    store.migrate().await?; // the records' table

    let msg = Message {
        id: "order-7-paid".into(),
        user: "u1".into(),
        points: 30,
    };
    // The broker delivers the message three times.
    for delivery in 1..=3 {
        let awarded = award(&store, &msg).await?;
        println!("delivery {delivery}: awarded {awarded}");
        assert_eq!(awarded, 30);
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM points")
        .fetch_one(&pool)
        .await?;
    println!("rows written: {rows}");
    assert_eq!(rows, 1);
    Ok(())
}
