//! `norepeat bench` is still the shop binary's command (with `--features bench`),
//! though the bench is the `norepeat-bench` crate: one row, `--json`, the
//! contract's object. The rows themselves are tested in that crate.

use serde_json::Value;

#[test]
fn norepeat_bench_runs_the_bench_crate() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_norepeat"))
        .args([
            "bench",
            "--json",
            // Long enough that a loaded machine starts its tasks in time
            // (50 ms ended with none measured once, beside the full suite).
            "--duration-ms",
            "250",
            "--only",
            "token.issue",
        ])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["store"], "memory");
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{json}");
    assert_eq!(results[0]["name"], "token.issue");
    assert!(results[0]["ops_per_s"].as_f64().unwrap() > 0.0, "{json}");
}
