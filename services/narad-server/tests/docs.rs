//! The documents, checked against what they describe, so that neither
//! drifts from the other: `docs/scale-out.md` names every table and every
//! function that runs past row-level security in the migrations;
//! `docs/errors.md` says extension names are unique per organisation, as
//! the extensions table's key makes them; the control messages the
//! README's client-executor section spells out are valid controls. No
//! server or database: the files are read as text.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The migrations, in the order they apply, as lowercase SQL without
/// comments.
fn migrations() -> Vec<(String, String)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("migrations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 29, "only {} migrations", files.len());
    files
        .iter()
        .map(|f| {
            let sql: String = std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| l.split_once("--").map_or(l, |(code, _)| code))
                .collect::<Vec<_>>()
                .join("\n")
                .to_lowercase();
            (f.file_name().unwrap().to_string_lossy().into_owned(), sql)
        })
        .collect()
}

/// The identifier at the start of `text` (after white space).
fn identifier(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The statements of `sql` that start with `keyword` (`create table`),
/// each as the text after the keyword, in order.
fn after<'a>(sql: &'a str, keyword: &str) -> Vec<(usize, &'a str)> {
    sql.match_indices(keyword)
        .filter(|(at, _)| *at == 0 || sql[..*at].ends_with(char::is_whitespace))
        .map(|(at, _)| (at, &sql[at + keyword.len()..]))
        .collect()
}

/// Every table the migrations leave in place.
fn tables() -> BTreeSet<String> {
    let mut tables = BTreeSet::new();
    for (file, sql) in migrations() {
        let mut changes: Vec<(usize, bool, String)> = Vec::new();
        for keyword in [
            "create table ",
            "create unlogged table ",
            "create table if not exists ",
        ] {
            for (at, rest) in after(&sql, keyword) {
                changes.push((at, true, identifier(rest)));
            }
        }
        for (at, rest) in after(&sql, "drop table ") {
            let rest = rest.trim_start().trim_start_matches("if exists ");
            changes.push((at, false, identifier(rest)));
        }
        changes.sort();
        for (_, created, name) in changes {
            assert!(
                !name.is_empty() && name != "if",
                "{file}: a table without a name"
            );
            if created {
                tables.insert(name);
            } else {
                tables.remove(&name);
            }
        }
    }
    tables
}

/// Every function the migrations leave in place, with whether its last
/// definition runs as its owner (`security definer`).
fn functions() -> BTreeMap<String, bool> {
    let mut functions = BTreeMap::new();
    for (file, sql) in migrations() {
        let mut changes: Vec<(usize, Option<bool>, String)> = Vec::new();
        for keyword in ["create function ", "create or replace function "] {
            for (at, rest) in after(&sql, keyword) {
                // What the header says, up to the body (`$$ … $$`, or
                // a SQL-standard `return …;`).
                let header = rest.split("$$").next().unwrap();
                let header = header.split("\nreturn ").next().unwrap();
                let definer = header.contains("security definer");
                changes.push((at, Some(definer), identifier(rest)));
            }
        }
        for (at, rest) in after(&sql, "drop function ") {
            let rest = rest.trim_start().trim_start_matches("if exists ");
            changes.push((at, None, identifier(rest)));
        }
        changes.sort();
        for (_, definer, name) in changes {
            assert!(!name.is_empty(), "{file}: a function without a name");
            match definer {
                Some(definer) => functions.insert(name, definer),
                None => functions.remove(&name),
            };
        }
    }
    functions
}

/// The part of `doc` under the heading `## {title}`, to the next `## `.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let start = doc
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section ## {title}"));
    let rest = &doc[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// The names in backticks of the first column of the Markdown table rows
/// of `text` (`| \`a\`, \`b\` | …`).
fn first_column(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|l| {
            let cell = l.split(" |").next().unwrap();
            format!("`{cell}")
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn scale_out_lists_every_table_of_the_migrations() {
    let doc = read("docs/scale-out.md");
    let listed = first_column(section(
        &doc,
        "Tenant-first, and the few places that are not",
    ));
    let mut expected = tables();
    assert!(
        expected.len() >= 27,
        "only {} tables: {expected:?}",
        expected.len()
    );
    assert!(expected.contains("blobs") && expected.contains("stream_tickets"));
    // sqlx's own table, made by no migration of ours.
    expected.insert("_sqlx_migrations".to_owned());
    let missing: Vec<&String> = expected.difference(&listed).collect();
    let stale: Vec<&String> = listed.difference(&expected).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/scale-out.md's table of tables: missing {missing:?}, names no table {stale:?}"
    );
}

/// On Citus, the tables the migration keeps on the coordinator
/// (`narad_coordinator_tables()`) are the ones the doc's table says are
/// there, and no other.
#[test]
fn scale_out_names_the_tables_kept_on_a_citus_coordinator() {
    let sql = migrations()
        .into_iter()
        .map(|(_, sql)| sql)
        .find(|sql| sql.contains("function narad_coordinator_tables()"))
        .expect("a migration defines narad_coordinator_tables()");
    let body = &sql[sql.find("array[").expect("its array") + 6..];
    let body = &body[..body.find(']').expect("its end")];
    let kept: BTreeSet<String> = body
        .split(',')
        .map(|t| t.trim().trim_matches('\'').to_owned())
        .collect();
    assert!(
        kept.contains("stream_tickets") && kept.len() >= 5,
        "{kept:?}"
    );
    let doc = read("docs/scale-out.md");
    let rows = section(&doc, "Tenant-first, and the few places that are not");
    let on_coordinator: BTreeSet<String> = rows
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter(|l| {
            l.trim_end_matches('|')
                .rsplit(" | ")
                .next()
                .is_some_and(|last| last.trim_start().starts_with("coordinator"))
        })
        .flat_map(first_column)
        .collect();
    assert_eq!(
        kept, on_coordinator,
        "docs/scale-out.md's coordinator tables"
    );
}

#[test]
fn scale_out_lists_every_function_that_runs_past_row_level_security() {
    let doc = read("docs/scale-out.md");
    let listed = first_column(section(&doc, "What runs past row-level security"));
    let functions = functions();
    let definers: BTreeSet<String> = functions
        .iter()
        .filter(|(_, definer)| **definer)
        .map(|(name, _)| name.clone())
        .collect();
    assert!(definers.len() >= 20, "only {definers:?}");
    for name in [
        "tenant_erasures_pending",
        "blobs_unreferenced",
        "session_tenants",
    ] {
        assert!(definers.contains(name), "{name} is no security definer");
    }
    let missing: Vec<&String> = definers.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "docs/scale-out.md does not list these security definer functions: {missing:?}"
    );
    // What the section lists beside them exists (relay_start, which reads
    // no table, is listed with relay_after).
    let unknown: Vec<&String> = listed
        .iter()
        .filter(|name| !functions.contains_key(*name))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/scale-out.md lists no function {unknown:?}"
    );
}

#[test]
fn errors_doc_says_extension_names_are_unique_per_organisation() {
    // The extensions table's key is the organisation's and the name.
    let keyed_by_tenant = migrations().iter().any(|(_, sql)| {
        sql.contains("alter table extensions add primary key (tenant_id, publisher, name)")
    });
    assert!(keyed_by_tenant, "extensions is no longer keyed by tenant");
    let doc = read("docs/errors.md");
    let row = doc
        .lines()
        .find(|l| l.starts_with("| NRD-0207 |"))
        .expect("NRD-0207 is in docs/errors.md");
    assert!(!row.contains("across narad"), "{row}");
    assert!(row.contains("per organisation"), "{row}");
}

/// The control messages `client.<name> {field, field: value, …}` that
/// `text` spells out, as JSON: a bare field is a placeholder (its name's
/// own text, or the message's name for `type`), `field: value` holds the
/// JSON value written.
fn spelled_controls(text: &str) -> Vec<(String, serde_json::Value)> {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    for span in text.split('`').skip(1).step_by(2) {
        let Some((name, fields)) = span.split_once(" {") else {
            continue;
        };
        if !name.starts_with("client.") {
            continue;
        }
        let fields = fields
            .strip_suffix('}')
            .unwrap_or_else(|| panic!("`{span}`"));
        let mut message = serde_json::Map::new();
        for field in fields.split(", ") {
            let (key, value) = match field.split_once(": ") {
                Some((key, value)) => (
                    key,
                    serde_json::from_str(value).unwrap_or_else(|e| panic!("`{span}`: {e}")),
                ),
                None if field == "type" => (field, serde_json::Value::from(name)),
                None => (field, serde_json::Value::from(format!("some-{field}"))),
            };
            message.insert(key.to_owned(), value);
        }
        out.push((name.to_owned(), serde_json::Value::Object(message)));
    }
    out
}

#[test]
fn the_controls_the_readme_spells_out_for_executors_are_valid() {
    let readme = read("README.md");
    let controls = spelled_controls(section(&readme, "Running a client executor"));
    assert!(
        controls.iter().any(|(name, _)| name == "client.heartbeat"),
        "the section spells out client.heartbeat: {controls:?}"
    );
    let doc = narad_server::routes::openapi::document();
    for (name, message) in controls {
        let mut root = doc.clone();
        root["$ref"] = serde_json::Value::from(format!("#/components/schemas/control.{name}"));
        let validator = jsonschema::draft202012::new(&root).unwrap();
        // What a tab that sends exactly what the README says sends.
        let mut sent = message.clone();
        sent["type"] = serde_json::Value::from(name.as_str());
        let errors: Vec<String> = validator
            .iter_errors(&sent)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "README's `{name} {message}`: {errors:?}");
        // And says what a control must hold, not left implied.
        assert!(
            message.get("protocolVersion").is_some(),
            "README's `{name} {message}`"
        );
    }
}
