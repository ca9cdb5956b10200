//! NGINX as the gateway rows' anchor: `proxy_pass` alone, or behind the
//! fingerprint guard an NGINX team writes by hand in Lua (Debian's
//! `libnginx-mod-http-lua` with `lua-nginx-redis`, which upstream calls
//! `lua-resty-redis`): a key from an MD5 of the caller, the method, the
//! path and the body, `SET key 1 NX PX 3000` on the bench's Redis, 409
//! when it is taken.
//!
//! Each runs in the foreground (`daemon off`, a master and as many worker
//! processes as the gateway has workers: one a core) on a file and a
//! prefix of its own, and is stopped when dropped.

use super::super::super::error::BenchError;
use super::lua::{self, LuaGuard};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How long `nginx` may take to accept connections.
const DEADLINE: Duration = Duration::from_secs(10);

/// `nginx` from `--nginx`/`NOREPEAT_NGINX_BIN` (`named`), else the `PATH`
/// or `/usr/sbin`.
pub(super) fn binary(named: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = named {
        return Some(p.to_owned()).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// One `nginx` in the foreground on a file and prefix of its own, killed
/// (and its prefix removed) when dropped.
pub(super) struct Nginx {
    child: Child,
    pub(super) base_url: String,
    prefix: PathBuf,
}

impl Nginx {
    /// Starts `bin` proxying to `backend` on a free loopback port, behind
    /// `guard` when given; returns once it accepts connections.
    pub(super) async fn start(
        bin: &Path,
        backend: &str,
        guard: Option<&LuaGuard>,
    ) -> Result<Self, BenchError> {
        let prefix = std::env::temp_dir().join(format!(
            "norepeat-nginx-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        // Its file may hold the Redis password: the owner's alone.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&prefix)?;
        // A free port, given back for nginx to take (the window is tiny,
        // and a lost race ends in the clear error below).
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let upstream = backend.trim_start_matches("http://");
        // As many workers as the gateway, which runs one a core.
        let workers = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let conf = conf(&prefix, upstream, port, workers, guard);
        let file = prefix.join("nginx.conf");
        std::fs::write(&file, conf)?;
        let mut cmd = Command::new(bin);
        cmd.arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&file)
            .arg("-e")
            .arg(prefix.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&prefix);
                return Err(BenchError::unexpected(
                    "gateway.nginx",
                    format!("cannot start {}: {e}", bin.display()),
                ));
            }
        };
        let mut nginx = Self {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            prefix,
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(nginx);
            }
            let exited = nginx.child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() >= deadline {
                let log =
                    std::fs::read_to_string(nginx.prefix.join("error.log")).unwrap_or_default();
                return Err(BenchError::unexpected(
                    "gateway.nginx",
                    format!(
                        "nginx {} on port {port}: {}\n{log}",
                        if exited {
                            "exited"
                        } else {
                            "did not accept connections within 10 s"
                        },
                        nginx.prefix.display()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The master ends its workers on SIGTERM (killed, it would leave
        // them running); then `kill_on_drop`'s kill, and its files go with
        // the prefix.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            for _ in 0..50 {
                if self.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}

/// The file: `workers` worker processes (the gateway's count), no access
/// log, the client's connections and the upstream's kept alive (and not
/// closed after 1000 requests), `Host` and `X-Forwarded-For` passed as the
/// gateway passes them; with `guard`, the Lua modules loaded and the guard
/// in front of `proxy_pass`.
pub(super) fn conf(
    prefix: &Path,
    upstream: &str,
    port: u16,
    workers: usize,
    guard: Option<&LuaGuard>,
) -> String {
    let p = prefix.display();
    let (modules, lua_http, access) = match guard {
        Some(g) => (
            format!(
                "load_module {m}/ndk_http_module.so;\nload_module {m}/ngx_http_lua_module.so;\n",
                m = g.modules.display()
            ),
            format!(
                "  lua_package_path \"{}/?.lua;;\";\n  init_by_lua_block {{ redis = require \"{}\" }}\n",
                g.lua_dir.display(),
                g.client
            ),
            lua::access(g),
        ),
        None => (String::new(), String::new(), String::new()),
    };
    format!(
        r#"{modules}daemon off;
master_process on;
worker_processes {workers};
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {p}/body;
  proxy_temp_path {p}/proxy;
  fastcgi_temp_path {p}/fastcgi;
  uwsgi_temp_path {p}/uwsgi;
  scgi_temp_path {p}/scgi;
  keepalive_requests 100000000;
{lua_http}  upstream backend {{
    server {upstream};
    keepalive 256;
    keepalive_requests 100000000;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
    {access}
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nginx_file_keeps_connections_to_the_backend() {
        let conf = conf(Path::new("/tmp/x"), "127.0.0.1:9", 80, 2, None);
        assert!(conf.contains("worker_processes 2;"), "{conf}");
        assert!(conf.contains("server 127.0.0.1:9;"), "{conf}");
        assert!(conf.contains("keepalive 256;"), "{conf}");
        assert!(conf.contains("proxy_set_header Connection \"\";"), "{conf}");
        assert!(conf.contains("listen 127.0.0.1:80;"), "{conf}");
        assert!(!conf.contains("lua"), "{conf}");
    }
}
