//! Test databases on a Citus cluster (`scripts/citus-cluster`): when the
//! server the tests use is a Citus coordinator with workers, every test
//! database exists on all of its nodes under one name, as Citus needs (a
//! coordinator reaches a worker's shards in the database of its own name).
//!
//! The template is built once: a database on every node with the
//! extension, the workers added to the coordinator's, the migrations and
//! the distribution run on the coordinator. A test's database is a copy of
//! it on every node: the copies carry the shards and the metadata that
//! names them, so each copy is a cluster of its own at once.

use std::time::Duration;

use crate::{pg, with_database};

/// The admin URLs of the workers of the coordinator at `admin_url`, or
/// `None` when it is not one (no Citus, or no workers).
pub(crate) async fn workers(admin_url: &str) -> Result<Option<Vec<String>>, String> {
    let client = connect(admin_url).await?;
    let citus: bool = client
        .query_one(
            "select exists (select 1 from pg_extension where extname = 'citus')",
            &[],
        )
        .await
        .map_err(pg)?
        .get(0);
    if !citus {
        return Ok(None);
    }
    let rows = client
        .query(
            "select nodename, nodeport from pg_dist_node \
             where groupid <> 0 and noderole = 'primary' order by nodeid",
            &[],
        )
        .await
        .map_err(pg)?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .map(|r| with_host(admin_url, r.get(0), r.get(1)))
            .collect(),
    ))
}

/// Builds the template `building` on the coordinator at `admin_url` and
/// on `workers`: the databases, the extension, the workers added; the
/// caller then migrates and distributes it on the coordinator.
pub(crate) async fn prepare(
    admin_url: &str,
    workers: &[String],
    building: &str,
) -> Result<(), String> {
    for node in std::iter::once(admin_url).chain(workers.iter().map(String::as_str)) {
        let client = connect(node).await?;
        for sql in [
            format!("drop database if exists {building} with (force)"),
            format!("create database {building}"),
        ] {
            client.batch_execute(&sql).await.map_err(pg)?;
        }
        connect(&with_database(node, building))
            .await?
            .batch_execute("create extension citus")
            .await
            .map_err(pg)?;
    }
    let admin = connect(admin_url).await?;
    let coordinator = admin
        .query_one(
            "select nodename, nodeport from pg_dist_node where groupid = 0",
            &[],
        )
        .await
        .map_err(pg)?;
    let (host, port): (String, i32) = (coordinator.get(0), coordinator.get(1));
    let db = connect(&with_database(admin_url, building)).await?;
    db.execute("select citus_set_coordinator_host($1, $2)", &[&host, &port])
        .await
        .map_err(pg)?;
    for w in workers {
        let row = admin
            .query_one(
                "select nodename, nodeport from pg_dist_node \
                 where groupid <> 0 and nodename || ':' || nodeport = $1",
                &[&authority(w)],
            )
            .await
            .map_err(pg)?;
        let (h, p): (String, i32) = (row.get(0), row.get(1));
        db.execute("select citus_add_node($1, $2)", &[&h, &p])
            .await
            .map_err(pg)?;
    }
    Ok(())
}

/// Runs `sql` (a `create database … template …`, an `alter database …
/// rename`) that needs no one else connected to `database` on the node at
/// `node`: Citus's own daemons connect to every database holding the
/// extension, so their sessions are ended first, and again when one came
/// back in between.
pub(crate) async fn alone_with(node: &str, database: &str, sql: &str) -> Result<(), String> {
    let client = connect(node).await?;
    let mut last = String::new();
    for _ in 0..100 {
        client
            .execute(
                "select pg_terminate_backend(pid) from pg_stat_activity \
                 where datname = $1 and pid <> pg_backend_pid()",
                &[&database],
            )
            .await
            .map_err(pg)?;
        match client.batch_execute(sql).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code().is_some_and(|c| c.code() == "55006") => {
                last = pg(e);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(pg(e)),
        }
    }
    Err(format!("{sql}: {last}"))
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    tokio::spawn(conn);
    Ok(client)
}

/// The `host:port` of a URL `scheme://[user@]host:port/…`.
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split('/').next().unwrap_or(rest);
    rest.rsplit_once('@').map_or(rest, |(_, a)| a).to_owned()
}

/// `url` with its host and port replaced.
fn with_host(url: &str, host: &str, port: i32) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (auth, path) = rest.split_once('/').unwrap_or((rest, ""));
    let user = auth
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{host}:{port}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_replaced_and_read() {
        let url = "postgres://postgres@127.0.0.1:9700/postgres?x=1";
        assert_eq!(
            with_host(url, "10.0.0.2", 9701),
            "postgres://postgres@10.0.0.2:9701/postgres?x=1"
        );
        assert_eq!(authority(url), "127.0.0.1:9700");
        assert_eq!(authority("postgres://h:1/d"), "h:1");
    }
}
