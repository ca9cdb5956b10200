//! Whether a Redis keeps what it is told through a restart: what an
//! application that keeps idempotency records there needs to know (a
//! Redis with neither AOF nor RDB forgets every record when it restarts,
//! and the retries of requests made before run again).

use super::{Backend, Connections, map_err};
use crate::store::StoreError;
use redis::{Cmd, Value};

impl<C: Connections + Send + Sync + 'static> Backend<C> {
    /// `Some(true)` with AOF on (`INFO persistence`: `aof_enabled:1`) or
    /// an RDB save schedule (`CONFIG GET save` not empty), `Some(false)`
    /// with neither, `None` when the server will not say (`CONFIG` renamed
    /// or refused, as on some managed services).
    pub(super) async fn persistent(&self) -> Result<Option<bool>, StoreError> {
        let mut info = Cmd::new();
        info.arg("INFO").arg("persistence");
        let text = match self.con.query("", info, false).await.map_err(map_err)? {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            _ => return Ok(None),
        };
        if text.lines().any(|l| l.trim() == "aof_enabled:1") {
            return Ok(Some(true));
        }
        let mut save = Cmd::new();
        save.arg("CONFIG").arg("GET").arg("save");
        let Ok(answer) = self.con.query("", save, false).await else {
            return Ok(None);
        };
        let schedule = match answer {
            Value::Array(items) => items.get(1).cloned(),
            Value::Map(pairs) => pairs.first().map(|(_, v)| v.clone()),
            _ => None,
        };
        Ok(match schedule {
            Some(Value::BulkString(b)) => Some(!b.iter().all(u8::is_ascii_whitespace)),
            _ => None,
        })
    }
}
