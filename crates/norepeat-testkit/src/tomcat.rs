//! A private Tomcat 10 (Debian's `tomcat10`) serving one servlet that
//! counts payments: a real back end whose own reading of a path (`;`
//! parameters dropped before dots are resolved, backslashes taken for
//! slashes) the gateway's routes are checked against. A rule of ours
//! about how Tomcat reads a path is only as good as a test against
//! Tomcat itself.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::util::{TempDir, kill_and_reap, log_tail};

/// The environment variable naming Tomcat's `CATALINA_HOME` (default
/// `/usr/share/tomcat10`, where Debian's package puts it).
pub const TOMCAT_HOME_ENV: &str = "NOREPEAT_TOMCAT_HOME";

const DEFAULT_HOME: &str = "/usr/share/tomcat10";

/// How long a JVM gets to serve both connectors: long on purpose, as a
/// test run on two busy cores makes its start slow (2 s when idle).
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How many sets of ports `start` tries: a free port may be taken by
/// another test's server before Tomcat binds it.
const START_ATTEMPTS: usize = 3;

/// Which of the instance's two connectors a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TomcatConnector {
    /// Debian's connector as shipped: a `\` or `%5C` in a path is a 400.
    Default,
    /// `allowBackslash="true"`, `encodedReverseSolidusHandling="decode"`
    /// and `relaxedPathChars="\"`: a raw or encoded backslash is a slash.
    /// (Without `relaxedPathChars` the request line's parser refuses a
    /// raw `\` with a 400 before `allowBackslash` is ever read.)
    Lenient,
}

/// One Tomcat JVM with both connectors on free loopback ports, its
/// `CATALINA_BASE` in a directory of its own; SIGKILLed and removed on
/// drop. Its one web application maps a servlet at `/payments/*` that runs
/// a payment (201) when the path it is given is `/payments` or
/// `/payments/`, and answers 404 below it; `GET /count` lists the payments
/// run ([`payments`](Self::payments)).
///
/// ```no_run
/// use norepeat_testkit::{Tomcat, TomcatConnector};
///
/// # async fn demo() {
/// let tomcat = Tomcat::start().await;
/// assert_eq!(tomcat.post(TomcatConnector::Default, "/;x/payments").await, 201);
/// assert_eq!(tomcat.payments().await, vec!["/;x/payments".to_owned()]);
/// # }
/// ```
#[derive(Debug)]
pub struct Tomcat {
    default_port: u16,
    lenient_port: u16,
    child: Option<Child>,
    // Last: removed after the process is gone.
    _dir: TempDir,
}

impl Tomcat {
    /// Compiles the servlet, starts Tomcat and waits until both
    /// connectors answer.
    ///
    /// # Panics
    ///
    /// When Tomcat 10 is not installed (with what to install), `javac` or
    /// `java` cannot be run, or Tomcat does not serve within 90 s (with
    /// its log).
    pub async fn start() -> Tomcat {
        let home = tomcat_home();
        let dir = TempDir::new("norepeat-tomcat");
        write_webapp(dir.path(), &home).await;
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let (default_port, lenient_port) = (crate::util::free_port(), crate::util::free_port());
            match spawn(dir.path(), &home, default_port, lenient_port).await {
                Ok(child) => {
                    return Tomcat {
                        default_port,
                        lenient_port,
                        child: Some(child),
                        _dir: dir,
                    };
                }
                Err(e) => failures.push(e),
            }
        }
        panic!(
            "norepeat-testkit: Tomcat did not start after {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    /// The loopback port of `connector`.
    pub fn port(&self, connector: TomcatConnector) -> u16 {
        match connector {
            TomcatConnector::Default => self.default_port,
            TomcatConnector::Lenient => self.lenient_port,
        }
    }

    /// `POST target` with a small body, sent on `connector` exactly as
    /// written (an HTTP client would clean the path first); the status.
    ///
    /// # Panics
    ///
    /// When Tomcat cannot be reached or answers no status line.
    pub async fn post(&self, connector: TomcatConnector, target: &str) -> u16 {
        let req = format!(
            "POST {target} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        exchange(self.port(connector), &req)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: POST {target} to Tomcat: {e}"))
            .0
    }

    /// The request URI of every payment the servlet ran, in order, as
    /// the client spelled it (before Tomcat's own normalization).
    ///
    /// # Panics
    ///
    /// When Tomcat cannot be reached or its answer is not the list.
    pub async fn payments(&self) -> Vec<String> {
        let req = "GET /count HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
        let (status, body) = exchange(self.default_port, req)
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: GET /count from Tomcat: {e}"));
        let mut lines = body.lines();
        let count: Option<usize> = lines.next().and_then(|n| n.parse().ok());
        let seen: Vec<String> = lines.map(str::to_owned).collect();
        assert!(
            status == 200 && count == Some(seen.len()),
            "norepeat-testkit: Tomcat's /count answered {status}: {body}"
        );
        seen
    }
}

impl Drop for Tomcat {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }
}

/// `CATALINA_HOME`, checked: a machine without Tomcat fails the test that
/// needs it, saying what to install, rather than skipping it.
fn tomcat_home() -> PathBuf {
    let home = std::env::var_os(TOMCAT_HOME_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_HOME), PathBuf::from);
    for needed in [
        "bin/bootstrap.jar",
        "bin/tomcat-juli.jar",
        "lib/servlet-api.jar",
    ] {
        assert!(
            home.join(needed).is_file(),
            "norepeat-testkit: Tomcat 10 is not installed: no {} (install Debian's package: \
             `apt-get install tomcat10`, as scripts/test.sh does, or set {TOMCAT_HOME_ENV} \
             to a CATALINA_HOME)",
            home.join(needed).display()
        );
    }
    home
}

/// The servlet: one class, compiled at test time against the installed
/// Tomcat's servlet API, so it runs on whichever Tomcat 10 is there.
const SERVLET: &str = r#"
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

public class Payments extends HttpServlet {
    private static final List<String> RUN = new ArrayList<>();

    @Override
    protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
        String below = req.getPathInfo();
        if (!"/payments".equals(req.getServletPath()) || (below != null && !below.equals("/"))) {
            res.sendError(404);
            return;
        }
        int n;
        synchronized (RUN) {
            RUN.add(req.getRequestURI());
            n = RUN.size();
        }
        res.setStatus(201);
        res.setContentType("application/json");
        res.getWriter().write("{\"payment\":" + n + "}");
    }

    @Override
    protected void doGet(HttpServletRequest req, HttpServletResponse res) throws IOException {
        if (!"/count".equals(req.getServletPath())) {
            res.sendError(404);
            return;
        }
        StringBuilder out = new StringBuilder();
        synchronized (RUN) {
            out.append(RUN.size()).append('\n');
            for (String uri : RUN) {
                out.append(uri).append('\n');
            }
        }
        // A length, so the answer is never chunked for the test to read.
        byte[] body = out.toString().getBytes(StandardCharsets.UTF_8);
        res.setContentType("text/plain;charset=UTF-8");
        res.setContentLength(body.length);
        res.getOutputStream().write(body);
    }
}
"#;

/// `/payments/*`, not `/payments`: an exact mapping would not take
/// `/payments/`, which the gateway's route takes as `/payments` (the
/// servlet answers 404 below it itself).
const WEB_XML: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<web-app xmlns="https://jakarta.ee/xml/ns/jakartaee" version="6.0" metadata-complete="true">
  <servlet><servlet-name>payments</servlet-name><servlet-class>Payments</servlet-class></servlet>
  <servlet-mapping>
    <servlet-name>payments</servlet-name>
    <url-pattern>/payments/*</url-pattern>
    <url-pattern>/count</url-pattern>
  </servlet-mapping>
</web-app>
"#;

/// `base`'s ROOT web application, its servlet compiled into it.
async fn write_webapp(base: &Path, home: &Path) {
    let src = base.join("src");
    let classes = base.join("webapps/ROOT/WEB-INF/classes");
    for d in [
        &src,
        &classes,
        &base.join("conf"),
        &base.join("logs"),
        &base.join("temp"),
    ] {
        std::fs::create_dir_all(d)
            .unwrap_or_else(|e| panic!("norepeat-testkit: cannot create {}: {e}", d.display()));
    }
    write(&src.join("Payments.java"), SERVLET);
    write(&base.join("webapps/ROOT/WEB-INF/web.xml"), WEB_XML);
    let out = tokio::process::Command::new("javac")
        .arg("-cp")
        .arg(home.join("lib/servlet-api.jar"))
        .arg("-d")
        .arg(&classes)
        .arg(src.join("Payments.java"))
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "norepeat-testkit: cannot run javac ({e}): install a JDK \
                 (`apt-get install default-jdk-headless`, as scripts/test.sh does)"
            )
        });
    assert!(
        out.status.success(),
        "norepeat-testkit: javac failed on the test servlet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write(path: &Path, text: &str) {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("norepeat-testkit: cannot write {}: {e}", path.display()));
}

/// The server's file: two HTTP connectors on loopback, no shutdown port
/// (a kill stops it), no deployment but the ROOT application.
fn server_xml(default_port: u16, lenient_port: u16) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<Server port="-1" shutdown="SHUTDOWN">
  <Service name="Catalina">
    <Connector address="127.0.0.1" port="{default_port}" protocol="HTTP/1.1" />
    <Connector address="127.0.0.1" port="{lenient_port}" protocol="HTTP/1.1"
               allowBackslash="true" encodedReverseSolidusHandling="decode"
               relaxedPathChars="\" />
    <Engine name="Catalina" defaultHost="localhost">
      <Host name="localhost" appBase="webapps" autoDeploy="false" unpackWARs="false" />
    </Engine>
  </Service>
</Server>
"#
    )
}

/// Starts the JVM on `base` and waits until both ports serve `/count`.
async fn spawn(
    base: &Path,
    home: &Path,
    default_port: u16,
    lenient_port: u16,
) -> Result<Child, String> {
    write(
        &base.join("conf/server.xml"),
        &server_xml(default_port, lenient_port),
    );
    let log = base.join("logs/catalina.out");
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let java = std::env::var_os("JAVA_HOME").map_or_else(
        || PathBuf::from("java"),
        |j| PathBuf::from(j).join("bin/java"),
    );
    let classpath = format!(
        "{}:{}",
        home.join("bin/bootstrap.jar").display(),
        home.join("bin/tomcat-juli.jar").display()
    );
    // A small heap and the quick compiler: the JVM starts in about half
    // the time, and serves the few requests of a test as well.
    let mut child = Command::new(&java)
        .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
        .arg("-cp")
        .arg(classpath)
        .arg(format!("-Dcatalina.home={}", home.display()))
        .arg(format!("-Dcatalina.base={}", base.display()))
        .arg(format!("-Djava.io.tmpdir={}", base.join("temp").display()))
        .args(["org.apache.catalina.startup.Bootstrap", "start"])
        .current_dir(base)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot run {} (is a JDK installed?): {e}", java.display()))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let get = "GET /count HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
    let mut up = [false, false];
    while !up.iter().all(|u| *u) {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "Tomcat exited ({status}); its log:\n{}",
                log_tail(&log)
            ));
        }
        // A connector that could not bind is logged, and the server goes
        // on without it: try other ports rather than wait.
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains("Address already in use") || Instant::now() >= deadline {
            kill_and_reap(&mut child);
            return Err(format!(
                "ports {default_port} and {lenient_port} not both served; Tomcat's log:\n{}",
                log_tail(&log)
            ));
        }
        for (u, port) in up.iter_mut().zip([default_port, lenient_port]) {
            *u = *u || matches!(exchange(port, get).await, Ok((200, _)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(child)
}

/// Writes `req` on a new connection to `port` and reads until Tomcat
/// closes it (at most 10 s): the status and the body.
async fn exchange(port: u16, req: &str) -> Result<(u16, String), String> {
    let talk = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), talk)
        .await
        .map_err(|_| format!("no answer from 127.0.0.1:{port} within 10 s"))?
        .map_err(|e| format!("127.0.0.1:{port}: {e}"))?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}
