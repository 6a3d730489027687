//! The failpoint-armed binary for the crash tests: `idemgate` built with the
//! `failpoints` feature into a target directory of its own,
//! `<target>/failpoints/<profile>/idemgate`, once per test run. Every other
//! test runs the shipped binary ([`super::bin`]), and nothing here writes
//! to it, so after `cargo test --release` `target/release/idemgate` is still
//! the one `cargo build --release` makes (`.ci/run` checks it).
//!
//! The build names this run's target directory as cargo's build directory
//! (`CARGO_BUILD_BUILD_DIR`, cargo ≥ 1.91), where the test build left every
//! dependency compiled with the same profile: only idemgate itself compiles
//! again. The feature is part of each unit's hash, so the armed units sit
//! beside the shipped ones without replacing them; only the final binary
//! is written, and only under `failpoints/`. A second test process building
//! at the same time waits on cargo's lock and then finds it fresh.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The armed binary, built on first use (by one thread; the others wait).
pub fn armed_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build)
}

fn build() -> PathBuf {
    // the shipped binary is `<target>/<profile dir>/idemgate`
    let shipped = Path::new(super::bin());
    let profile_dir = shipped.parent().expect("the binary's profile directory");
    let target = profile_dir.parent().expect("the target directory");
    let dir_name = profile_dir.file_name().expect("a profile directory name");
    // cargo names the `dev` profile's directory `debug`
    let profile = match dir_name.to_str() {
        Some("debug") => "dev",
        Some(name) => name,
        None => panic!("profile directory {profile_dir:?} is not UTF-8"),
    };
    let out = target.join("failpoints");
    eprintln!("building the failpoint-armed idemgate into {out:?}");
    let built = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--bin", "idemgate", "--features", "failpoints"])
        .args(["--profile", profile, "--target-dir"])
        .arg(&out)
        .env("CARGO_BUILD_BUILD_DIR", target)
        .output()
        .expect("cargo runs");
    assert!(
        built.status.success(),
        "cargo build --features failpoints: {}\n{}",
        built.status,
        String::from_utf8_lossy(&built.stderr)
    );
    out.join(dir_name).join("idemgate")
}
