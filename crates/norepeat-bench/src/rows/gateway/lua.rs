//! The fingerprint guard an NGINX team writes by hand, in Lua: what
//! `nginx` needs on this machine to run it, and its code.

use std::path::{Path, PathBuf};

/// Where Debian's `libnginx-mod-http-lua` puts its modules.
const MODULES: &str = "/usr/lib/nginx/modules";

/// Where a Lua Redis client for NGINX may be: Debian's `lua-nginx-redis`
/// (`nginx.redis`), or upstream's `lua-resty-redis` (`resty.redis`).
const LUA_DIRS: [&str; 3] = [
    "/usr/share/lua/5.1",
    "/usr/local/share/lua/5.1",
    "/usr/local/openresty/lualib",
];

/// How to install what the Lua row needs.
pub(super) const LUA_INSTALL: &str = "apt-get install nginx libnginx-mod-http-lua lua-nginx-redis";

/// The Lua guard's parts on this machine and the Redis it keeps its keys
/// in.
#[derive(Debug, Clone)]
pub(super) struct LuaGuard {
    /// The directory holding `ndk_http_module.so` and
    /// `ngx_http_lua_module.so`.
    pub(super) modules: PathBuf,
    /// The directory `require` looks in, and the client's module name.
    pub(super) lua_dir: PathBuf,
    pub(super) client: &'static str,
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl LuaGuard {
    /// The guard's parts, on the Redis at `url`; why not, when a part is
    /// missing or the Redis is not a TCP one.
    pub(super) fn find(url: &str) -> Result<Self, String> {
        let modules = PathBuf::from(MODULES);
        let have = |f: &str| modules.join(f).is_file();
        if !have("ndk_http_module.so") || !have("ngx_http_lua_module.so") {
            return Err(format!(
                "NGINX's Lua module is missing from {MODULES} (install it: {LUA_INSTALL})"
            ));
        }
        let (lua_dir, client) = LUA_DIRS
            .iter()
            .flat_map(|d| [(d, "nginx.redis"), (d, "resty.redis")])
            .find(|(d, m)| Path::new(d).join(m.replace('.', "/") + ".lua").is_file())
            .map(|(d, m)| (PathBuf::from(d), m))
            .ok_or_else(|| {
                format!("no Lua Redis client for NGINX in {LUA_DIRS:?} (install it: {LUA_INSTALL})")
            })?;
        let info = redis::Client::open(url)
            .map_err(|e| format!("{url}: {e}"))?
            .get_connection_info()
            .clone();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            return Err("its Redis client needs a plain TCP address".to_owned());
        };
        let settings = info.redis_settings();
        Ok(Self {
            modules,
            lua_dir,
            client,
            host,
            port,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        })
    }
}

/// `s` as a Lua string literal: printable ASCII as it is, anything else
/// (and `"` and `\`) as a decimal escape.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        if (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\{b:03}"));
        }
    }
    out.push('"');
    out
}

/// The guard, in the access phase of `POST` requests: the body read
/// whole (in memory: the bench's bodies are far under the buffer), the
/// key an MD5 of caller (`X-User-Id`, else the client's address), method,
/// path and body, one `SET NX PX` on a pooled connection (authenticated
/// and on its database once, when new), 409 when taken, 503 when Redis
/// fails.
pub(super) fn access(g: &LuaGuard) -> String {
    let mut login = String::new();
    match (&g.username, &g.password) {
        (Some(u), Some(p)) => {
            login += &format!(
                "      local ok, err = red:auth({}, {})\n      if not ok then return fail(err) end\n",
                lua_string(u),
                lua_string(p)
            );
        }
        (None, Some(p)) => {
            login += &format!(
                "      local ok, err = red:auth({})\n      if not ok then return fail(err) end\n",
                lua_string(p)
            );
        }
        _ => {}
    }
    if g.db != 0 {
        login += &format!(
            "      local ok, err = red:select({})\n      if not ok then return fail(err) end\n",
            g.db
        );
    }
    format!(
        r#"access_by_lua_block {{
      if ngx.req.get_method() ~= "POST" then return end
      local function fail(err)
        ngx.log(ngx.ERR, "redis: ", err)
        return ngx.exit(503)
      end
      ngx.req.read_body()
      local body = ngx.req.get_body_data()
      if not body then
        if ngx.req.get_body_file() then return ngx.exit(413) end
        body = ""
      end
      local caller = ngx.var.http_x_user_id or ngx.var.remote_addr
      local key = "nginxlua:" .. ngx.md5(caller .. "\n" .. ngx.req.get_method() .. "\n" .. ngx.var.uri .. "\n" .. body)
      local red = redis:new()
      red:set_timeout(1000)
      local ok, err = red:connect({host}, {port})
      if not ok then return fail(err) end
      if red:get_reused_times() == 0 then
{login}      end
      local res, err = red:set(key, "1", "NX", "PX", 3000)
      if not res then return fail(err) end
      red:set_keepalive(60000, 256)
      if res == ngx.null then
        ngx.status = 409
        ngx.header["Content-Type"] = "application/problem+json"
        ngx.print('{{"title":"A request like this one is in progress","status":409}}')
        return ngx.exit(409)
      end
    }}"#,
        host = lua_string(&g.host),
        port = g.port,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_lua_guard_sets_its_key_with_a_ttl_on_the_benchs_redis() {
        let guard = LuaGuard {
            modules: PathBuf::from(MODULES),
            lua_dir: PathBuf::from("/usr/share/lua/5.1"),
            client: "nginx.redis",
            host: "127.0.0.1".into(),
            port: 6411,
            username: None,
            password: Some("p\"w\\".into()),
            db: 3,
        };
        let conf =
            super::super::nginx::conf(Path::new("/tmp/x"), "127.0.0.1:9", 80, 2, Some(&guard));
        assert!(conf.starts_with("load_module /usr/lib/nginx/modules/ndk_http_module.so;"));
        assert!(
            conf.contains(r#"red:set(key, "1", "NX", "PX", 3000)"#),
            "{conf}"
        );
        assert!(conf.contains(r#"red:connect("127.0.0.1", 6411)"#), "{conf}");
        assert!(conf.contains(r#"red:auth("p\034w\092")"#), "{conf}");
        assert!(conf.contains("red:select(3)"), "{conf}");
        assert!(conf.contains(r#"require "nginx.redis""#), "{conf}");
    }
}
