//! The documents, checked against what they describe, so that neither
//! drifts from the other: `docs/errors.md` says extension names are unique
//! per organisation, as the extensions table's key makes them. No server
//! or database: the files are read as text.

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
