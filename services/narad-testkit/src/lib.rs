//! Test support for narad: every test gets its own fresh, migrated Postgres
//! database.
//!
//! Postgres is found, in this order:
//! 1. `NARAD_TEST_DATABASE_URL`: a server the tests may create databases on
//!    (its user needs `CREATEDB`);
//! 2. local Postgres binaries (`pg_config --bindir`, or
//!    `/usr/lib/postgresql/*/bin`): a throwaway cluster under the temporary
//!    directory, Unix socket only, `fsync` off, shared by every test
//!    process of this user and left running for the next run (stop it with
//!    `pg_ctl -D <dir>/data stop`);
//! 3. Docker, through testcontainers (feature `docker`, on by default).
//!
//! Migrations run once per server into a template database named after
//! their checksums; each test database is a copy of it, which takes
//! milliseconds. A [`TestDatabase`] drops its database when it goes away.
//!
//! When that server is a Citus coordinator with workers
//! (`scripts/citus-cluster`), every database is made on all of its nodes
//! and the template is distributed (`narad_distribute()`): the same tests
//! then run on a cluster.

mod citus;
pub mod s3;

pub use s3::S3Server;

use std::path::Path;

use sha2::{Digest, Sha256};
use sqlx::Connection;
use sqlx::migrate::Migrator;
use tokio::sync::OnceCell;

/// A fresh database for one test, dropped when this value is.
pub struct TestDatabase {
    url: String,
    admin_url: String,
    name: String,
    /// The admin URLs of a Citus coordinator's workers, which hold a
    /// database of the same name; empty on one Postgres.
    workers: Vec<String>,
}

impl TestDatabase {
    /// Creates a database with `migrator`'s migrations applied.
    ///
    /// Panics with a message saying how to provide Postgres when none can
    /// be found: a test that needs a database cannot run without one.
    pub async fn new(migrator: &Migrator) -> TestDatabase {
        let admin_url = admin_url().await;
        let template = template(&admin_url, migrator)
            .await
            .unwrap_or_else(|e| panic!("narad-testkit: cannot prepare the template database: {e}"));
        Self::create(admin_url, &template).await
    }

    /// Creates a database with `migrator`'s migrations applied on the
    /// server at `admin_url` (a user that may create databases).
    pub async fn on_server(admin_url: &str, migrator: &Migrator) -> Result<TestDatabase, String> {
        let template = template(admin_url, migrator).await?;
        Ok(Self::create(admin_url.to_owned(), &template).await)
    }

    /// Creates an empty database, with no migrations applied.
    pub async fn empty() -> TestDatabase {
        Self::create(admin_url().await, "template0").await
    }

    /// Creates an empty database, with no migrations applied, on the
    /// server at `admin_url` (a restore's target, say).
    pub async fn empty_on_server(admin_url: &str) -> TestDatabase {
        Self::create(admin_url.to_owned(), "template0").await
    }

    async fn create(admin_url: String, template: &str) -> TestDatabase {
        let name = format!("narad_test_{}", uuid::Uuid::now_v7().simple());
        let workers = match template {
            "template0" => Vec::new(),
            _ => citus::workers(&admin_url)
                .await
                .unwrap_or_else(|e| panic!("narad-testkit: {e}"))
                .unwrap_or_default(),
        };
        if workers.is_empty() {
            let (client, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("narad-testkit: cannot connect to {admin_url}: {e}"));
            let conn = tokio::spawn(conn);
            client
                .batch_execute(&format!("create database {name} template {template}"))
                .await
                .unwrap_or_else(|e| panic!("narad-testkit: cannot create {name}: {}", pg(e)));
            drop(client);
            let _ = conn.await;
        } else {
            for node in workers.iter().chain(std::iter::once(&admin_url)) {
                citus::alone_with(
                    node,
                    template,
                    &format!("create database {name} template {template}"),
                )
                .await
                .unwrap_or_else(|e| panic!("narad-testkit: cannot create {name}: {e}"));
            }
        }
        TestDatabase {
            url: with_database(&admin_url, &name),
            admin_url,
            name,
            workers,
        }
    }

    /// The database's connection URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A URL of the same server for administrative statements
    /// (`pg_terminate_backend`, …).
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let nodes: Vec<String> = std::iter::once(self.admin_url.clone())
            .chain(self.workers.iter().cloned())
            .collect();
        // Drop may run inside a runtime: do the work on a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                for admin in &nodes {
                    if let Ok((client, conn)) =
                        tokio_postgres::connect(admin, tokio_postgres::NoTls).await
                    {
                        tokio::spawn(conn);
                        let _ = client
                            .batch_execute(&format!("drop database if exists {name} with (force)"))
                            .await;
                    }
                }
            });
        })
        .join();
    }
}

async fn admin_url() -> String {
    server()
        .await
        .unwrap_or_else(|e| panic!("narad-testkit: no Postgres for tests: {e}"))
}

/// The admin URL of the server tests use, found once per process.
async fn server() -> Result<String, String> {
    static SERVER: OnceCell<Result<String, String>> = OnceCell::const_new();
    SERVER.get_or_init(find_server).await.clone()
}

async fn find_server() -> Result<String, String> {
    if let Ok(url) = std::env::var("NARAD_TEST_DATABASE_URL") {
        return Ok(url);
    }
    let local = match narad_localpg::bindir() {
        Some(bin) => match local_cluster(&bin).await {
            Ok(url) => return Ok(url),
            Err(e) => format!("local Postgres binaries in {} failed: {e}", bin.display()),
        },
        None => "no local Postgres binaries".to_owned(),
    };
    #[cfg(feature = "docker")]
    {
        match container().await {
            Ok(url) => Ok(url),
            Err(e) => Err(format!(
                "NARAD_TEST_DATABASE_URL is not set; {local}; Docker failed: {e}. \
                 Set NARAD_TEST_DATABASE_URL, install PostgreSQL, or start Docker."
            )),
        }
    }
    #[cfg(not(feature = "docker"))]
    Err(format!(
        "NARAD_TEST_DATABASE_URL is not set and {local}. \
         Set NARAD_TEST_DATABASE_URL or install PostgreSQL."
    ))
}

/// Starts (or finds running) this user's throwaway cluster; returns its
/// admin URL.
async fn local_cluster(bin: &Path) -> Result<String, String> {
    let user = std::env::var("USER").unwrap_or_else(|_| "user".to_owned());
    let dir = std::env::temp_dir().join(format!(
        "narad-testkit-{user}-{}",
        narad_localpg::version(bin)
    ));
    narad_localpg::Cluster::new(dir, bin)
        .start(narad_localpg::Durability::Throwaway)
        .await
}

#[cfg(feature = "docker")]
async fn container() -> Result<String, String> {
    use testcontainers::runners::AsyncRunner;
    use testcontainers_modules::postgres::Postgres;
    let node = Postgres::default()
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let port = node
        .get_host_port_ipv4(5432)
        .await
        .map_err(|e| e.to_string())?;
    // The container lives as long as the test process.
    std::mem::forget(node);
    Ok(format!(
        "postgres://postgres:postgres@127.0.0.1:{port}/postgres"
    ))
}

/// The template database holding `migrator`'s migrations, created once per
/// server and set of migrations.
async fn template(admin_url: &str, migrator: &Migrator) -> Result<String, String> {
    let mut hash = Sha256::new();
    for m in migrator.iter() {
        hash.update(m.version.to_be_bytes());
        hash.update(&m.checksum);
    }
    let name = format!("narad_template_{}", &hex::encode(hash.finalize())[..16]);
    let (client, conn) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to {admin_url}: {e}"))?;
    let conn = tokio::spawn(conn);
    // Serialise template creation across test processes.
    client
        .execute("select pg_advisory_lock(7061726164)", &[])
        .await
        .map_err(pg)?;
    let exists = client
        .query_opt("select 1 from pg_database where datname = $1", &[&name])
        .await
        .map_err(|e| e.to_string())?
        .is_some();
    let result = if exists {
        Ok(())
    } else {
        create_template(&client, admin_url, &name, migrator).await
    };
    let _ = client
        .execute("select pg_advisory_unlock(7061726164)", &[])
        .await;
    drop(client);
    let _ = conn.await;
    result.map(|()| name)
}

async fn create_template(
    client: &tokio_postgres::Client,
    admin_url: &str,
    name: &str,
    migrator: &Migrator,
) -> Result<(), String> {
    let building = format!("{name}_building");
    let workers = citus::workers(admin_url).await?.unwrap_or_default();
    if workers.is_empty() {
        // One statement each: neither may run inside a transaction block.
        for sql in [
            format!("drop database if exists {building} with (force)"),
            format!("create database {building}"),
        ] {
            client.batch_execute(&sql).await.map_err(pg)?;
        }
    } else {
        citus::prepare(admin_url, &workers, &building).await?;
    }
    let mut conn = sqlx::PgConnection::connect(&with_database(admin_url, &building))
        .await
        .map_err(|e| format!("cannot connect to {building}: {e}"))?;
    migrator
        .run(&mut conn)
        .await
        .map_err(|e| format!("migrations failed: {e}"))?;
    // narad's own step after its migrations: distribute the schema on a
    // Citus coordinator (a no-op elsewhere, and absent before the
    // migration that defines it).
    sqlx::raw_sql(
        "do $$ begin \
           if to_regproc('narad_distribute') is not null then perform narad_distribute(); end if; \
         end $$",
    )
    .execute(&mut conn)
    .await
    .map_err(|e| format!("distributing the schema failed: {e}"))?;
    conn.close().await.map_err(|e| e.to_string())?;
    let rename = format!("alter database {building} rename to {name}");
    if workers.is_empty() {
        client.batch_execute(&rename).await.map_err(pg)
    } else {
        for node in workers
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(admin_url))
        {
            citus::alone_with(node, &building, &rename).await?;
        }
        Ok(())
    }
}

/// A Postgres error with the server's own message, not just "db error".
fn pg(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let base = match head[authority_start..].find('/') {
        Some(slash) => &head[..authority_start + slash],
        None => head,
    };
    format!("{base}/{database}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local-binaries path, exercised even where CI sets
    /// NARAD_TEST_DATABASE_URL: a cluster of our own, reachable through its
    /// socket by both drivers, and by nothing else.
    #[tokio::test]
    async fn a_throwaway_cluster_starts_from_local_postgres_binaries() {
        let bin = narad_localpg::bindir().expect("Postgres binaries are installed on this machine");
        let url = local_cluster(&bin).await.unwrap();
        assert!(
            !url.contains("localhost") && !url.contains("127.0.0.1"),
            "{url}"
        );
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let dir: String = client
            .query_one("select current_setting('unix_socket_directories')", &[])
            .await
            .unwrap()
            .get(0);
        assert!(
            url.contains(&dir.replace('/', "%2F")),
            "connected to the cluster at {dir}"
        );
        let sqlx_conn = sqlx::PgConnection::connect(&url)
            .await
            .expect("sqlx reaches it too");
        sqlx_conn.close().await.unwrap();
    }

    #[test]
    fn replaces_the_database_and_keeps_the_query() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/postgres?host=/tmp/x", "t1"),
            "postgres://u:p@h:5432/t1?host=/tmp/x"
        );
        assert_eq!(with_database("postgres://h", "t2"), "postgres://h/t2");
    }
}
