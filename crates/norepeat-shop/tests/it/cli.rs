//! Issue 56: the newcomer's first commands. `norepeat --listen X` is
//! `norepeat serve --listen X` (it was refused, though the README says
//! `NOREPEAT_LISTEN` is `--listen`), and a port already taken is named,
//! with the flag that chose it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_norepeat");

/// The shop in a directory of its own, on its own SQLite file, nothing
/// inherited that would change what it starts on.
fn shop(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env(
            "DATABASE_URL",
            format!("sqlite://{}?mode=rwc", dir.join("shop.db").display()),
        )
        .env_remove("REDIS_URL")
        .env_remove("NATS_URL")
        .env_remove("NOREPEAT_LISTEN")
        .stdin(Stdio::null());
    cmd
}

fn temp_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nr_cli_{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn listen_is_a_flag_of_norepeat_itself() {
    let dir = temp_dir();
    let mut child = shop(&dir, &["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        line.starts_with("listening on http://127.0.0.1:"),
        "{line:?}"
    );
}

#[test]
fn a_taken_port_names_the_address_and_the_flag() {
    let dir = temp_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = shop(&dir, &["serve", "--listen", &addr]).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&addr), "{stderr}");
    assert!(stderr.contains("--listen"), "{stderr}");
}
