//! What one append costs, beside the baseline's operation: Postgres CPU
//! (every process of the cluster, when it runs on this machine), the bench
//! process's own CPU (the journal's rule engine, JSON and protocol work run
//! in it), WAL bytes, and, when `pg_stat_statements` is loaded, each
//! statement's calls, time, planning time (with
//! `pg_stat_statements.track_planning`), rows and WAL per append (`narad bench append
//! --profile`).

use std::collections::BTreeMap;

use procfs::process::{Process, all_processes};
use tokio_postgres::Client;

/// Resources used so far, read at one instant.
#[derive(Clone, Copy, Default)]
pub(crate) struct Sample {
    /// CPU seconds of the Postgres cluster (its postmaster, its live
    /// children and the children it has reaped), when it is local.
    postgres: Option<f64>,
    /// CPU seconds of the client process: this one, or the one named by
    /// [`Profiler::of_process`].
    client: f64,
    /// The WAL's insert position, in bytes.
    wal: f64,
}

/// What one side of a scenario used over its phases.
#[derive(Clone, Copy, Default)]
pub(crate) struct Used {
    postgres: Option<f64>,
    client: f64,
    wal: f64,
}

impl Used {
    /// Adds what was used between `before` and `after`.
    pub(crate) fn add(&mut self, before: Sample, after: Sample) {
        self.postgres = match (before.postgres, after.postgres) {
            (Some(b), Some(a)) => Some(self.postgres.unwrap_or(0.0) + (a - b)),
            _ => None,
        };
        self.client += after.client - before.client;
        self.wal += after.wal - before.wal;
    }

    /// `postgres µs | client µs | WAL bytes` per operation.
    pub(crate) fn per_op(&self, ops: u64) -> String {
        let n = ops.max(1) as f64;
        let pg = self
            .postgres
            .map_or("–".to_string(), |s| format!("{:.0}", s * 1e6 / n));
        format!("{pg} | {:.0} | {:.0}", self.client * 1e6 / n, self.wal / n)
    }
}

/// Reads the resources a scenario's database uses.
pub(crate) struct Profiler {
    admin: Client,
    postmaster: Option<i32>,
    /// The client process whose CPU is read (`None`: this one).
    client: Option<i32>,
    ticks: f64,
}

impl Profiler {
    /// Connects as the database's owner and finds the cluster's postmaster
    /// (the parent of this connection's backend) when it runs here.
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let (admin, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let backend: i32 = admin
            .query_one("select pg_backend_pid()", &[])
            .await?
            .get(0);
        // A backend of the same pid on this machine is this connection's
        // only when its parent is a postgres process.
        let postmaster = Process::new(backend)
            .and_then(|p| p.stat())
            .ok()
            .map(|s| s.ppid)
            .filter(|ppid| {
                Process::new(*ppid)
                    .and_then(|p| p.stat())
                    .is_ok_and(|s| s.comm.starts_with("postgres"))
            });
        Ok(Self {
            admin,
            postmaster,
            client: None,
            ticks: procfs::ticks_per_second() as f64,
        })
    }

    /// The same profiler reading the CPU of process `pid` (a server the
    /// bench runs as a child) instead of this process's.
    pub(crate) fn of_process(self, pid: u32) -> Self {
        Self {
            client: Some(pid as i32),
            ..self
        }
    }

    /// Whether `pg_stat_statements` is loaded (preloaded by the server and
    /// created in this database); resets it when it is.
    pub(crate) async fn statements_reset(&self) -> bool {
        self.admin
            .batch_execute("create extension if not exists pg_stat_statements")
            .await
            .is_ok()
            && self
                .admin
                .batch_execute("select pg_stat_statements_reset()")
                .await
                .is_ok()
    }

    /// The resources used so far.
    pub(crate) async fn sample(&self) -> anyhow::Result<Sample> {
        let wal: f64 = self
            .admin
            .query_one(
                "select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8",
                &[],
            )
            .await?
            .get(0);
        Ok(Sample {
            postgres: self.postmaster.map(|pm| self.cluster_cpu(pm)),
            client: self
                .client
                .map_or_else(Process::myself, Process::new)
                .and_then(|p| p.stat())
                .map_or(0.0, |s| (s.utime + s.stime) as f64 / self.ticks),
            wal,
        })
    }

    fn cluster_cpu(&self, postmaster: i32) -> f64 {
        let mut ticks = 0i64;
        if let Ok(s) = Process::new(postmaster).and_then(|p| p.stat()) {
            ticks += (s.utime + s.stime) as i64 + s.cutime + s.cstime;
        }
        if let Ok(all) = all_processes() {
            for s in all.flatten().filter_map(|p| p.stat().ok()) {
                if s.ppid == postmaster {
                    ticks += (s.utime + s.stime) as i64;
                }
            }
        }
        ticks as f64 / self.ticks
    }

    /// The statements of this database since the reset, per append (the
    /// baseline's insert left out), most time first, as a Markdown table.
    pub(crate) async fn statements(&self, appends: u64) -> anyhow::Result<String> {
        let rows = self
            .admin
            .query(
                "select query, calls::float8, total_exec_time, rows::float8, wal_bytes::float8, \
                 total_plan_time, toplevel from pg_stat_statements \
                 where dbid = (select oid from pg_database where datname = current_database()) \
                   and query not like '%bench_baseline%' and query not like '%pg_stat_statements%' \
                   and query not like '%pg_current_wal_insert_lsn%' \
                 order by total_exec_time + total_plan_time desc",
                &[],
            )
            .await?;
        let n = appends.max(1) as f64;
        let mut merged: BTreeMap<String, [f64; 5]> = BTreeMap::new();
        let mut order = Vec::new();
        for row in rows {
            let query: String = row.get(0);
            let toplevel: bool = row.get(6);
            let name = format!(
                "{}{}",
                if toplevel { "" } else { "(nested) " },
                short(&query)
            );
            let entry = merged.entry(name.clone()).or_insert_with(|| {
                order.push(name);
                [0.0; 5]
            });
            for (i, v) in entry.iter_mut().enumerate() {
                *v += row.get::<_, f64>(i + 1);
            }
        }
        let mut out = String::from(
            "| statement | calls per append | µs per append | planning µs per append | rows per append | WAL bytes per append |\n|---|---|---|---|---|---|\n",
        );
        for name in order {
            let [calls, ms, rows, wal, plan] = merged[&name];
            if calls / n < 0.001 {
                continue;
            }
            out.push_str(&format!(
                "| `{name}` | {:.3} | {:.1} | {:.1} | {:.2} | {:.0} |\n",
                calls / n,
                ms * 1000.0 / n,
                plan * 1000.0 / n,
                rows / n,
                wal / n
            ));
        }
        Ok(out)
    }
}

/// A statement's first words, enough to tell which one it is.
fn short(query: &str) -> String {
    let flat = query.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut s: String = flat.chars().take(70).collect();
    if flat.chars().count() > 70 {
        s.push('…');
    }
    s.replace('|', "\\|")
}
