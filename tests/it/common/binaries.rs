//! The two binaries the integration tests run, each built by cargo once per
//! test run, beside the test build:
//! - [`shipped`]: `idemgate` exactly as `cargo build` makes it. The copy
//!   `cargo test` links is built with the dev-dependencies' features merged
//!   into the shared dependencies (tokio's `test-util`, and others through
//!   proptest and criterion); building it again without them puts the
//!   shipped binary back at `<target>/<profile>/idemgate`. So the tests run
//!   what ships, and after `cargo test --release` `target/release/idemgate`
//!   is the binary `cargo build --release` makes (`.ci/run` checks both
//!   that a rebuild finds it fresh and that it holds no failpoint).
//! - [`armed`]: the crash tests' binary, with the `failpoints` feature, in a
//!   target directory of its own, `<target>/failpoints/<profile>/idemgate`.
//!   Its build names this run's target directory as cargo's build
//!   directory (`CARGO_BUILD_BUILD_DIR`, cargo ≥ 1.91), where the dependencies
//!   are compiled already: only idemgate itself compiles again.
//!
//! Both builds run with the environment the user's cargo had, not the one
//! cargo gave this test process, so neither makes a dependency dirty. A
//! second test process building at the same time waits on cargo's lock and
//! then finds the build fresh.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The shipped binary, built on first use (by one thread; the others wait).
pub fn shipped() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let (target, profile) = target_and_profile();
        cargo_build(&[], &target, None, &profile);
        PathBuf::from(env!("CARGO_BIN_EXE_idemgate"))
    })
}

/// The failpoint-armed binary, built on first use.
pub fn armed() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let (target, profile) = target_and_profile();
        let out = target.join("failpoints");
        cargo_build(&["--features", "failpoints"], &out, Some(&target), &profile);
        let dir_name = Path::new(env!("CARGO_BIN_EXE_idemgate"))
            .parent()
            .and_then(Path::file_name)
            .expect("a profile directory");
        out.join(dir_name).join("idemgate")
    })
}

/// This test build's target directory and cargo profile, read off the path
/// of the binary cargo built for it: `<target>/<profile dir>/idemgate`.
fn target_and_profile() -> (PathBuf, String) {
    let built = Path::new(env!("CARGO_BIN_EXE_idemgate"));
    let profile_dir = built.parent().expect("the binary's profile directory");
    let target = profile_dir.parent().expect("the target directory");
    // cargo names the `dev` profile's directory `debug`
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(name) => name.to_string(),
        None => panic!("profile directory {profile_dir:?} is not UTF-8"),
    };
    (target.to_path_buf(), profile)
}

fn cargo_build(extra: &[&str], target_dir: &Path, build_dir: Option<&Path>, profile: &str) {
    eprintln!("building idemgate {extra:?} into {target_dir:?}");
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--bin", "idemgate"])
        .args(extra)
        .args(["--profile", profile, "--target-dir"])
        .arg(target_dir);
    // The variables cargo set for this test process (CARGO_PKG_NAME,
    // CARGO_MANIFEST_DIR, …) are not the user's: build scripts that watch
    // them (ring's `rerun-if-env-changed=CARGO_PKG_NAME`) would run again,
    // and every crate above them would compile anew, in this build and in
    // the user's next `cargo build`.
    const SET_BY_CARGO: [&str; 4] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
    ];
    const SET_BY_CARGO_EXACT: [&str; 5] = [
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_DIR",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if SET_BY_CARGO.iter().any(|p| name.starts_with(p)) || SET_BY_CARGO_EXACT.contains(&&*name)
        {
            cargo.env_remove(&*name);
        }
    }
    if let Some(dir) = build_dir {
        cargo.env("CARGO_BUILD_BUILD_DIR", dir);
    }
    let built = cargo.output().expect("cargo runs");
    assert!(
        built.status.success(),
        "cargo build {extra:?}: {}\n{}",
        built.status,
        String::from_utf8_lossy(&built.stderr)
    );
}
