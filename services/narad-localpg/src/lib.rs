//! A private Postgres cluster in a directory, run from the machine's own
//! Postgres binaries (`pg_config --bindir`, else the newest
//! `/usr/lib/postgresql/*/bin`).
//!
//! The cluster listens on a Unix socket in its directory and on no TCP
//! port, so nothing else reaches it by accident. When narad runs as root,
//! Postgres runs as the `postgres` user (it refuses to run as root) and the
//! directory is given to that user.
//!
//! Two uses: `narad serve` without a database URL keeps a durable cluster
//! in its home and stops it on shutdown; the test harness keeps a
//! throwaway one (no fsync) under the temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How a cluster trades safety for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every commit reaches the disk (the embedded default).
    Durable,
    /// `fsync`, synchronous commit and full-page writes off: for tests.
    Throwaway,
}

/// A cluster in a directory: `DIR/data` holds the data, `DIR` the socket
/// and the log `DIR/postgres.log`.
#[derive(Debug, Clone)]
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`, if the machine
/// has them.
pub fn bindir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Some(dir);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop()
}

/// The major version of the binaries in `bin` (`15`), from its path.
pub fn version(bin: &Path) -> String {
    bin.parent()
        .and_then(|p| p.file_name())
        .and_then(|v| v.to_str())
        .unwrap_or("pg")
        .to_owned()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl Cluster {
    /// The cluster in `dir`, run with the binaries in `bin`.
    pub fn new(dir: impl Into<PathBuf>, bin: impl Into<PathBuf>) -> Cluster {
        Cluster {
            dir: dir.into(),
            bin: bin.into(),
            as_postgres: is_root(),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The URL of database `database` through the cluster's socket (the
    /// socket directory, percent-encoded, is the host, so that no driver
    /// falls back to another server on localhost).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@{}/{database}",
            self.dir.display().to_string().replace('/', "%2F")
        )
    }

    /// Runs a Postgres program, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// Initialises the cluster if it has no data yet, starts it if it is
    /// not running, and returns the URL of its `postgres` database. Several
    /// processes may call this at once: one sets the cluster up, the others
    /// wait for it.
    pub async fn start(&self, durability: Durability) -> Result<String, String> {
        let dir = &self.dir;
        let data = dir.join("data");
        let url = self.url("postgres");
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let lock = std::fs::File::create(dir.join(".lock"))
            .map_err(|e| format!("cannot create the lock file: {e}"))?;
        lock.lock()
            .map_err(|e| format!("cannot lock {}: {e}", dir.display()))?;
        if tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .is_ok()
        {
            return Ok(url);
        }
        if self.as_postgres {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir)
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "cannot give {} to the postgres user",
                    dir.display()
                ));
            }
        }
        if !data.join("PG_VERSION").exists() {
            let mut initdb = self.command("initdb");
            initdb
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8"]);
            if durability == Durability::Throwaway {
                initdb.arg("--no-sync");
            }
            let out = initdb.output().map_err(|e| format!("initdb: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "initdb failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let mut options = format!("-k {} -c listen_addresses=''", dir.display());
        options.push_str(match durability {
            Durability::Durable => " -c max_connections=100",
            Durability::Throwaway => {
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
                 -c max_connections=300"
            }
        });
        let log = dir.join("postgres.log");
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-o", &options, "-l"])
            .arg(&log)
            .args(["-w", "start"])
            .output()
            .map_err(|e| format!("pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed: {}{}; see {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                log.display()
            ));
        }
        Ok(url)
    }

    /// Stops the cluster (fast shutdown: running transactions roll back,
    /// committed ones are on disk).
    pub fn stop(&self) -> Result<(), String> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .output()
            .map_err(|e| format!("pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl stop failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}
