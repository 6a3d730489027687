//! A small tmpfs for a disk that fills (issue 26): mounted on a fresh
//! directory, filled to a chosen free space with a filler file, freed again,
//! unmounted (lazily if something still holds it) and removed on drop, also
//! when the test failed. Tests run as root here; where mounting is refused
//! the test SKIPs with a clear message.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Consumer, Proxy, TempDir};

pub struct Tmpfs {
    mount: PathBuf,
    mounted: bool,
    _dir: TempDir,
}

impl Tmpfs {
    /// `size` as mount(8) takes it (`16m`). `None`, with a SKIP printed,
    /// where mounting is refused (not root, no CAP_SYS_ADMIN, a container).
    pub fn mount(tag: &str, size: &str) -> Option<Tmpfs> {
        let dir = TempDir::new(tag);
        let mount = dir.path().join("disk");
        std::fs::create_dir_all(&mount).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&mount)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                mount,
                mounted: true,
                _dir: dir,
            }),
            Ok(o) => {
                eprintln!(
                    "SKIP: cannot mount a tmpfs for the disk-full test (mount says: {}); \
                     run as root on a machine that allows mounts",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIP: cannot run mount(8) for the disk-full test: {e}");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }

    fn filler(&self) -> PathBuf {
        self.mount.join("filler")
    }

    /// Bytes free on the file system.
    pub fn free_bytes(&self) -> u64 {
        let c = std::ffi::CString::new(self.mount.as_os_str().as_encoded_bytes()).unwrap();
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_frsize as u64
    }

    /// Fills the file system until `leave` bytes (rounded to pages) are free.
    pub fn fill(&self, leave: u64) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler())
            .unwrap();
        let chunk = vec![0x5au8; 64 * 1024];
        loop {
            let free = self.free_bytes();
            if free <= leave {
                break;
            }
            let n = ((free - leave) as usize).min(chunk.len()).max(4096);
            if f.write_all(&chunk[..n]).is_err() {
                break; // full
            }
        }
        let _ = f.sync_all();
        // overshot (a full last chunk): give back what is over
        let free = self.free_bytes();
        if free < leave {
            let len = std::fs::metadata(self.filler()).unwrap().len();
            let _ = f.set_len(len.saturating_sub(leave - free));
        }
    }

    /// Removes the filler: the space is back.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.filler());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.mount)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                // still held (a process of a failed test): detach it now, the
                // kernel frees it when the last holder goes
                let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
            }
            self.mounted = false;
        }
    }
}

/// A SQLite store (`full.db`) on a small [`Tmpfs`], the config and logs in a
/// directory off it (`{tag}-logs`), and a consumer. Fields drop in order:
/// the consumer first, the disk last.
pub struct SqliteOnTmpfs {
    pub up: Consumer,
    /// The store's URL.
    pub store: String,
    pub db: PathBuf,
    pub dir: TempDir,
    pub disk: Tmpfs,
}

impl SqliteOnTmpfs {
    /// `None`, with a SKIP printed, where [`Tmpfs::mount`] is refused.
    pub fn mount(tag: &str, size: &str) -> Option<SqliteOnTmpfs> {
        let disk = Tmpfs::mount(tag, size)?;
        let dir = TempDir::new(&format!("{tag}-logs"));
        let db = disk.path().join("full.db");
        Some(SqliteOnTmpfs {
            up: Consumer::start().unwrap(),
            store: format!("sqlite://{}", db.display()),
            db,
            dir,
            disk,
        })
    }

    /// `serve` on this store with `routes`, its config and log in `dir`.
    pub fn start(&self, routes: &str) -> Proxy {
        Proxy::start(&self.dir, &self.store, routes)
    }
}
